"""The flow's scheduler phase: after the timers, `lockctl schedule` as the systemd service that
`lockctl worker-config` wrote (lockctl-scheduler.service), on every worker at once, for a few
ticks of a short job (SCHED_JOB, its own prefix and log); then `systemctl stop` on each (SIGTERM)
and the evidence collected for sched_check.py.

The service runs every scheduled job of its worker, the timers' job too (their timers are
stopped by then): its ticks in this phase are run by the schedulers; the check is on SCHED_JOB.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from flow import sched_check, ticks
from flow.commands import FlowFailed
from flow.settings import SCHED_JOB, Settings

if TYPE_CHECKING:
    from flow.steps import Flow

UNIT = "lockctl-scheduler.service"
SCHED_LOG = "/var/lib/lockctl-tick/sched.log"  # the job's own log (vagrant/prepare's spec)
SCHED_LOCK_KEY = f"locks/{SCHED_JOB}/.lock"
MIN_TICKS = 4
START_TIMEOUT = 180  # Python's start under software emulation is 5-8 s; a loaded host, more
JOURNAL = f"sudo journalctl -u {UNIT} -o cat --no-pager"
# Up to START_TIMEOUT s for the scheduler's `started` event (its jobs' loops are running).
STARTED = (
    f'for i in $(seq {START_TIMEOUT}); do {JOURNAL} | grep -q \'"event":"started"\' && exit 0; '
    "sleep 1; done; exit 1"
)
# The stop, timed in the guest, then what systemd saw of the main process's end.
STOP = (
    f"t0=$(date +%s%N); sudo systemctl stop {UNIT}; "
    'echo "stop_ms=$(( ($(date +%s%N) - t0) / 1000000 ))"; '
    f"sudo systemctl show -p Result -p ExecMainCode -p ExecMainStatus -p NRestarts "
    f"-p ActiveState {UNIT}"
)
TRACEBACK = "Traceback (most recent call last)"


def run_scheduler(flow: Flow) -> bool:
    """Start, let run, stop, collect, check; the table printed and kept (scheduler.txt/.json)."""
    s, workers = flow.s, flow.s.worker_names
    _on_every_worker(flow, f"sudo systemctl start {UNIT}", "start scheduler", timeout=120)
    _on_every_worker(flow, STARTED, "scheduler started", timeout=START_TIMEOUT + 60)
    print(
        f"{UNIT} started on {', '.join(workers)}; running both for {s.sched_window} s", flush=True
    )
    time.sleep(s.sched_window)
    # Half an interval past a tick: no run is under way (one takes about 1 s in the VMs: the
    # job in its PID namespace, the record completed), so no record ends `interrupted`.
    time.sleep((s.sched_period / 2 - time.time()) % s.sched_period)
    stop_sent = time.time()
    stops = {w: s.logs / f"scheduler-stop-{w}.log" for w in workers}
    children = [
        flow.shell.start(flow.ssh(w, STOP), f"stop scheduler on {w}", log=log)
        for w, log in stops.items()
    ]
    if any(flow.shell.wait_all(children, timeout=300)):
        raise FlowFailed("stopping a worker's scheduler failed")
    services, job_runs = {}, {}
    for w in workers:
        journal, job_log = s.logs / f"scheduler-journal-{w}.log", s.logs / f"sched-{w}.log"
        flow.shell.run(flow.ssh(w, JOURNAL), f"scheduler journal of {w}", log=journal)
        flow.shell.run(
            flow.ssh(w, f"cat {SCHED_LOG} 2>/dev/null || true"), f"job log of {w}", log=job_log
        )
        text = journal.read_text(encoding="utf-8")
        show = sched_check.parse_show(stops[w].read_text(encoding="utf-8"))
        services[w] = sched_check.Service(ticks.parse_events(text), TRACEBACK in text, show)
        job_runs[w] = ticks.parse_job_log(job_log.read_text(encoding="utf-8"))
    ledger = _read_ledger(flow)
    left = _sessions_left(flow, sched_check.session_ids(services))
    report = sched_check.check_scheduler(
        SCHED_JOB, s.sched_period, MIN_TICKS, ledger, job_runs, services, stop_sent, left
    )
    lines = report.table()
    print("\n".join(lines))
    (s.art / "scheduler.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    record = json.dumps(report.to_record(s.sched_period, SCHED_JOB), indent=2) + "\n"
    (s.art / "scheduler.json").write_text(record, encoding="utf-8")
    return report.passed


def note_failure(settings: Settings, failure: str) -> None:
    """The phase ended before its check: that is its report."""
    line = f"scheduler check: FAIL: {failure}"
    print(line, flush=True)
    (settings.art / "scheduler.txt").write_text(line + "\n", encoding="utf-8")


def _on_every_worker(flow: Flow, command: str, what: str, *, timeout: float) -> None:
    """`command` on every worker at once (one SSH each), all within `timeout`."""
    children = [
        flow.shell.start(flow.ssh(w, command), f"{what} on {w}", quiet=True)
        for w in flow.s.worker_names
    ]
    failed = [
        w
        for w, status in zip(
            flow.s.worker_names, flow.shell.wait_all(children, timeout), strict=True
        )
        if status != 0
    ]
    if failed:
        raise FlowFailed(f"{what} failed on {', '.join(failed)}")


def _read_ledger(flow: Flow) -> list[dict[str, object]]:
    s, out = flow.s, flow.s.logs / "sched-ledger.json"
    read = [s.bin("python"), str(s.repo / "vagrant" / "flow" / "ledger_read.py")]
    flow.shell.run(
        flow.shell.ns([*read, s.server1, str(s.management_token), SCHED_LOCK_KEY, str(out)]),
        "ledger read",
    )
    ledger: list[dict[str, object]] = json.loads(out.read_text(encoding="utf-8"))
    return ledger


def _sessions_left(flow: Flow, ids: list[str]) -> list[str]:
    s, out = flow.s, flow.s.logs / "sched-sessions-left.json"
    read = [s.bin("python"), str(s.repo / "vagrant" / "flow" / "ledger_read.py"), "--sessions"]
    flow.shell.run(
        flow.shell.ns([*read, s.server1, str(s.management_token), str(out), *ids]),
        "sessions read",
    )
    left: list[str] = json.loads(out.read_text(encoding="utf-8"))
    return left
