"""The flow's tick phase: one warm-up run of the job on every worker, then the systemd timers on
all of them at the same tick, the wait for the ticks, the timers stopped, and the evidence
collected for ticks.py.

The warm-up: a worker's first `lockctl run` in a fresh VM is its slowest (nothing of it in the
page cache yet, the agent's first look-up of the worker's token), and one that starts late
holds the lock into the next tick. So each worker's service runs once, both at once, before the
timers, and the check's window starts at the timers' first tick: it judges warm workers. The
warm-up's tick is in the ledger and the job's log, outside the window (ticks.in_window).
"""

from __future__ import annotations

import json
import shutil
import time
from typing import TYPE_CHECKING

from flow import ticks
from flow.commands import FlowFailed, output_of
from flow.settings import JOB

if TYPE_CHECKING:
    from flow.steps import Flow

SERVICE = f"lockctl-{JOB}.service"
TIMER = f"lockctl-{JOB}.timer"
LOCK_KEY = f"locks/{JOB}/.lock"  # the spec vagrant/prepare writes: its ledger is beside it
WARM_UP_TIMEOUT = 300
CONSUL_LEADERSHIP = (
    "sudo journalctl -u consul -o short-precise --no-pager --since -6min "
    "| grep -Ei 'election|leader|heartbeat|timed out' || true"
)
# Up to 60 s for the job's service to end (a run the last timer started completes its tick).
LAST_RUN_ENDED = (
    f"for i in $(seq 60); do sudo systemctl is-active --quiet {SERVICE} || exit 0; "
    "sleep 1; done; exit 1"
)
# One run of the service, to its end, timed in the guest. Not `systemctl start --wait`: it needs
# D-Bus, which the box has not ("Failed to connect to bus"). The unit is Type=exec, so `start`
# returns once lockctl is exec'd; then a look every half second (+ sudo's own) for its end.
# systemd unloads the unit when it ends: its CPU time is in the journal, not `systemctl show`.
WARM_UP = (
    f"t0=$(date +%s%N); sudo systemctl start {SERVICE}; status=$?; "
    f"for i in $(seq 120); do sudo systemctl is-active --quiet {SERVICE} || break; "
    "sleep 0.5; done; "
    'echo "status=$status wall_ms=$(( ($(date +%s%N) - t0) / 1000000 ))"'
)


def warm_up(flow: Flow) -> None:
    """Every worker's service once, all at the same moment (they race for one tick as the
    timers' runs will); how long each took (its CPU time: the first of run_ticks' figures)."""
    logs = {w: flow.s.logs / f"warm-up-{w}.txt" for w in flow.s.worker_names}
    children = [
        flow.shell.start(flow.ssh(w, WARM_UP), f"warm-up run on {w}", log=log, quiet=True)
        for w, log in logs.items()
    ]
    flow.shell.wait_all(children, timeout=WARM_UP_TIMEOUT)
    for worker, log in logs.items():
        shown = ticks.parse_show(log.read_text(encoding="utf-8", errors="replace"))
        print(f"{worker}: warm-up run {ticks.run_figures(shown)}")


def start_timers(flow: Flow) -> None:
    """The timers, started together right after a tick, so every worker sees the same ticks
    from the next; the check's window starts there."""
    time.sleep(flow.s.period - time.time() % flow.s.period)
    starts = [
        flow.shell.start(
            flow.ssh(w, f"sudo systemctl enable --now {TIMER}"), f"timer on {w}", quiet=True
        )
        for w in flow.s.worker_names
    ]
    if any(flow.shell.wait_all(starts, timeout=300)):
        raise FlowFailed("starting a worker's timer failed")
    flow.timers_started = time.time()
    for w in flow.s.worker_names:
        active = output_of(flow.ssh(w, f"sudo systemctl is-active {TIMER}")).strip()
        unit = flow.s.run / "workers" / w / "systemd" / TIMER
        lines = [ln for ln in unit.read_text(encoding="utf-8").splitlines() if "=" in ln]
        calendar = [ln.split("=", 1)[1] for ln in lines if ln.startswith("OnCalendar=")]
        print(f"{w}: {active} {TIMER} ({len(calendar)} OnCalendar= lines: {calendar[0]}, ...)")


def _consul_leadership(flow: Flow) -> None:
    """What each agent logged of Raft leadership over the tick phase (elections, lost
    heartbeats): a tick started late because Consul stalled shows here, not in lockctl's
    events. Logged, and counted in the report, for whoever reads a late tick."""
    counts = []
    for vm in flow.s.nodes:
        log = flow.s.logs / f"consul-leadership-{vm}.log"
        flow.shell.run(  # evidence only: never a reason for the flow to fail
            flow.ssh(vm, CONSUL_LEADERSHIP),
            f"consul leadership on {vm}",
            log=log,
            check=False,
            timeout=60,
            quiet=True,
        )
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
        counts.append(f"{vm} {len(lines)}")
    print(f"consul's lines on leadership in the last 6 min: {', '.join(counts)}")


def run_ticks(flow: Flow) -> bool:
    """Wait for the ticks, stop the timers, let the last run end, then check each tick of the
    window ran exactly once: from the ledger, the job's own log and the runners' events."""
    s = flow.s
    shutil.copy2(s.stage / "locks.hcl", s.logs / "spec.hcl")  # the stage goes at the end
    wait_until = flow.timers_started + (s.ticks + 1) * s.period + 5
    if (left := wait_until - time.time()) > 0:
        print(f"waiting {left:.0f} s for {s.ticks} ticks", flush=True)
        time.sleep(left)
    for w in s.worker_names:
        flow.shell.run(
            flow.ssh(w, f"sudo systemctl disable --now {TIMER}"),
            f"stop timer on {w}",
            quiet=True,
            check=False,
        )
    for w in s.worker_names:  # a run the last tick started completes its record first
        flow.shell.run(flow.ssh(w, LAST_RUN_ENDED), f"last run on {w}", check=False)
    job_runs, events = {}, {}
    for w in s.worker_names:
        ticks_log, journal = s.logs / f"ticks-{w}.log", s.logs / f"journal-{w}.log"
        precise = s.logs / f"journal-precise-{w}.log"  # the same, with systemd's lines' times
        flow.shell.run(
            flow.ssh(w, "cat /var/lib/lockctl-tick/ticks.log 2>/dev/null || true"),
            f"ticks of {w}",
            log=ticks_log,
        )
        flow.shell.run(
            flow.ssh(w, f"sudo journalctl -u {SERVICE} -o cat --no-pager"),
            f"journal of {w}",
            log=journal,
        )
        flow.shell.run(
            flow.ssh(w, f"sudo journalctl -u {SERVICE} -o short-precise --no-pager"),
            f"timed journal of {w}",
            log=precise,
        )
        journal_text = journal.read_text(encoding="utf-8")
        job_runs[w] = ticks.parse_job_log(ticks_log.read_text(encoding="utf-8"))
        events[w] = ticks.parse_events(journal_text)
        print(
            f"{w}: CPU time of each run, warm-up first (systemd): {ticks.cpu_times(journal_text)}"
        )
    _consul_leadership(flow)
    ledger_file = s.logs / "ledger.json"
    read = [s.bin("python"), str(s.repo / "vagrant" / "flow" / "ledger_read.py")]
    flow.shell.run(
        flow.shell.ns([*read, s.server1, str(s.management_token), LOCK_KEY, str(ledger_file)]),
        "ledger read",
    )
    ledger = json.loads(ledger_file.read_text(encoding="utf-8"))
    first = ticks.first_tick_after(flow.timers_started, s.period)
    window = ticks.in_window(first, ledger, job_runs, events)
    report = ticks.check_ticks(s.period, s.ticks, *window)
    lines = [f"window from {first} (the timers' first tick; before it: the warm-up)"]
    lines += report.table()
    print("\n".join(lines))
    (s.art / "ticks.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    record = json.dumps(report.to_record(s.period), indent=2) + "\n"
    (s.art / "ticks.json").write_text(record, encoding="utf-8")
    return report.passed
