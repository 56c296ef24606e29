"""A job's `retries` on the real cluster (issue 21, item 2): a failed attempt is tried again on the
same replica, under the same lock and for the same tick, after `retry_delay`, and never at or past
the next tick's instant.

The job is a process tree: a shell that starts a child and waits for it, then exits by its mode.
It counts its attempts per tick in a state file (`flaky` fails the first attempt of a tick and
succeeds the second; `fail` always fails; `hang`'s child sleeps until its timeout stops it), and
logs each attempt's tick, worker and time. Under three `lockctl schedule` replicas the flaky job
succeeds on its retry, `succeeded (2nd attempt)` in history, both statuses in the record, the lock
held through the delay (no other replica runs the tick), the retry counted in /metrics. Under
`lockctl run` the same for a tick; a job failing every time stops after retries + 1 attempts (a
plain lock too); the next tick cuts the retries; a timed-out attempt is retried only with
`retry_on_timeout`; a lock lost during the delay ends the retries.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from procscan import pids_with
from scheduler_lab import ListeningScheduler
from test_scheduler_listen import _value
from workers_lab import minted_workers, spec_text

from provision.errors import EXIT_JOB_TIMEOUT, EXIT_LOCK_LOST
from provision.ledger.records import TickOutcome, TickRecord, tick_name
from provision.ledger.store import Ledger
from provision.schedule import parse_schedule
from tests.lockctl_process import LOCKCTL, eventually, run_lockctl

if TYPE_CHECKING:
    from conftest import LiveCluster

WORKERS = ("worker-1", "worker-2", "worker-3")
EVERY = 10
SCHEDULE = parse_schedule(f"@every {EVERY}s")
WAIT = 60.0
FAILED = 3  # the job's own failure status

# $1: the state folder, $2: the mode, $3: the marker its child's and its daemon's sleep carry
# (found in /proc)
JOB = """#!/bin/sh
key=${LOCKCTL_TICK:-plain}
n=$(( $(cat "$1/$key.count" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$1/$key.count"
echo "$key $LOCKCTL_WORKER $n $(date +%s.%N)" >> "$1/attempts.log"
# each attempt leaves a daemon: its own session, TERM ignored (the attempt's end must kill it)
setsid sh -c 'trap "" TERM; exec sleep "$0"' "$3" > /dev/null 2>&1 < /dev/null &
if [ "$2" = hang ]; then sh -c 'exec sleep "$0"' "$3" & wait $!; fi
sh -c 'exec sleep "0.$0"' "$3" & wait $!
echo "attempt $n of tick $key"
case $2 in
  flaky) [ "$n" -ge 2 ] && exit 0 ;;
esac
echo "attempt $n failed" >&2
exit 3
"""
# short -> (mode, the job's own attributes)
JOBS: dict[str, tuple[str, dict[str, str]]] = {
    "sched": ("flaky", {"retries": "2", "retry_delay": '"2s"'}),
    "run": ("flaky", {"retries": "2", "retry_delay": '"1s"'}),
    "fail": ("fail", {"retries": "2", "retry_delay": '"0s"'}),
    "plain": ("fail", {"retries": "1", "retry_delay": '"0s"'}),
    "cut": ("fail", {"retries": "5", "retry_delay": '"3s"'}),
    "hang": ("hang", {"retries": "1", "retry_delay": '"0s"', "timeout": '"1s"'}),
    "hangretry": (
        "hang",
        {"retries": "1", "retry_delay": '"0s"', "timeout": '"1s"', "retry_on_timeout": "true"},
    ),
    "fenced": ("fail", {"retries": "2", "retry_delay": '"10s"'}),
}
SCHEDULES = {"cut": 5, "fenced": 20}  # @every, seconds; the rest EVERY, but plain (no schedule)


@dataclass(frozen=True)
class Lab:
    tmp: Path
    configs: dict[str, Path]
    spec_path: Path
    jobs: dict[str, str]
    keys: dict[str, str]
    script: Path
    cluster: LiveCluster
    secrets: tuple[str, ...] = field(repr=False)


def _marker(short: str) -> str:
    return f"{300 + list(JOBS).index(short)}{uuid.uuid5(uuid.NAMESPACE_OID, short).int % 10**6}"


def _command(lab_tmp: Path, script: Path, short: str) -> list[str]:
    return [str(script), str(lab_tmp / short), JOBS[short][0], _marker(short)]


@pytest.fixture(scope="module")
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("retries")
    uid = uuid.uuid4().hex[:8]
    script = tmp / "job.sh"
    script.write_text(JOB)
    script.chmod(0o755)
    kv = f"test/retries-{uid}/"
    jobs: dict[str, dict[str, str]] = {}
    for short, (_, attributes) in JOBS.items():
        jobs[short] = {"prefix": f'"{kv}{short}/"', **attributes}
        if short != "plain":
            every = SCHEDULES.get(short, EVERY)
            jobs[short]["schedule"] = f'"@every {every}s"'
        (tmp / short).mkdir()
    # the scheduler's job alone has a command: `lockctl schedule` leaves the others alone
    jobs["sched"]["command"] = json.dumps(_command(tmp, script, "sched"))
    spec_path = tmp / "locks.hcl"
    spec_path.write_text(
        spec_text(live_cluster, WORKERS, {f"{s}-{uid}": a for s, a in jobs.items()})
    )
    with minted_workers(live_cluster, spec_path, WORKERS, tmp, uid, kv) as made:
        yield Lab(
            tmp,
            made.configs,
            spec_path,
            {short: f"{short}-{uid}" for short in jobs},
            {short: f"{kv}{short}/.lock" for short in jobs},
            script,
            live_cluster,
            tuple(made.secrets),
        )


def _events(text: str, name: str) -> list[dict[str, Any]]:
    found = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    return [event for event in found if event["event"] == name]


def _next_tick(every: int = EVERY) -> datetime:
    return parse_schedule(f"@every {every}s").next_ticks(datetime.now(timezone.utc), 1)[0]


def _at(tick: datetime, offset: float = 0.05) -> None:
    time.sleep(max(0.0, tick.timestamp() + offset - time.time()))


def _run(lab: Lab, worker: str, short: str, *flags: str) -> subprocess.CompletedProcess[str]:
    argv = [*LOCKCTL, "run", "--config", str(lab.configs[worker]), "--job", lab.jobs[short]]
    command = _command(lab.tmp, lab.script, short)
    return subprocess.run(
        [*argv, *flags, "--", *command], capture_output=True, text=True, timeout=WAIT, check=False
    )


def _record(lab: Lab, short: str, tick: str) -> TickRecord:
    ledger = Ledger(lab.cluster.management(), lab.keys[short])
    return next(r for r in ledger.records() if tick_name(r.tick) == tick)


def _attempts_log(lab: Lab, short: str) -> list[tuple[str, str, int, float]]:
    path = lab.tmp / short / "attempts.log"
    lines = path.read_text().split("\n") if path.exists() else []
    return [(t, w, int(n), float(at)) for t, w, n, at in (line.split() for line in lines if line)]


def _lockctl(lab: Lab, *args: str) -> subprocess.CompletedProcess[str]:
    connection = ["--address", lab.cluster.address("server-1")]
    connection += ["--token-file", str(lab.cluster.layout.management_token_file)]
    flags = ["--spec", str(lab.spec_path), *connection, *lab.cluster.tls_flags()]
    result = run_lockctl(*args, *flags, drop=("CONSUL_", "FORCE_COLOR"))
    assert "Traceback" not in result.stderr, result.stderr
    for secret in lab.secrets:
        assert secret not in result.stdout + result.stderr
    return result


def _lock_holder(lab: Lab, short: str) -> str | None:
    entry, _ = lab.cluster.management().kv.get(lab.keys[short], consistency="consistent")
    return None if entry is None else (entry.session or None)


def test_three_schedulers_a_flaky_job_succeeds_on_its_retry_under_the_same_lock(lab: Lab) -> None:
    job = lab.jobs["sched"]
    schedulers = [ListeningScheduler(lab.configs[worker]) for worker in WORKERS]
    held_in_delay: list[str | None] = []
    try:

        def retried() -> list[dict[str, Any]]:
            return [e for s in schedulers for e in s.events("retrying") if e.get("job") == job]

        def succeeded() -> list[dict[str, Any]]:
            return [
                e
                for s in schedulers
                for e in s.events("released")
                if e.get("job") == job and e.get("child_status") == 0
            ]

        assert eventually(retried, WAIT), [s.lines for s in schedulers]
        # the delay is 2 s: the lock stays held by the retrying replica's session meanwhile
        (first,) = retried()[:1]
        held_in_delay.append(_lock_holder(lab, "sched"))
        assert eventually(succeeded, WAIT), [s.lines for s in schedulers]
        samples = [s.scrape() for s in schedulers]
        for scheduler in schedulers:
            assert scheduler.stop() == 0
    finally:
        for scheduler in schedulers:
            scheduler.kill()
    tick = first["tick"]
    history = _lockctl(lab, "history", "--job", job)
    shown = _lockctl(lab, "history", "--job", job, "--tick", tick)
    for result in (history, shown):  # for docs/history.md
        print(f"\n{' '.join(result.args[3:8])}: exit {result.returncode}\n{result.stdout[:3000]}")
    assert held_in_delay == [first["session"]]
    record = _record(lab, "sched", tick)
    assert record.outcome is TickOutcome.SUCCEEDED and record.exit_status == 0
    assert record.attempts == (FAILED, 0) and record.retries_cut is None
    assert record.stdout is not None and "attempt 2 of tick" in record.stdout  # the last's
    attempts = [a for a in _attempts_log(lab, "sched") if a[0] == tick]
    assert [(a[1], a[2]) for a in attempts] == [(record.worker, 1), (record.worker, 2)]
    assert attempts[1][3] - attempts[0][3] >= 2.0  # the retry_delay, counted from the end
    everyone = [e for s in schedulers for e in s.events() if e.get("job") == job]
    ran_it = [e for e in everyone if e["event"] == "acquired" and e.get("tick") == tick]
    assert len(ran_it) == 1  # no other replica ran the tick, during the delay or after
    started = [e for e in everyone if e["event"] == "retry-started" and e.get("tick") == tick]
    assert len(started) == 1 and started[0]["attempt"] == 2
    assert history.returncode == 0 and "succeeded (2nd attempt)" in history.stdout
    assert f"tick {tick}: succeeded (2nd attempt)" in shown.stdout
    assert f"attempts: [{FAILED}, 0]" in shown.stdout
    retries = sum(_value(s, "lockctl_job_retries_total", job=job) for s in samples)
    assert retries >= 1
    assert pids_with(_marker("sched")) == []


def test_lockctl_run_retries_a_flaky_tick_and_counts_it(lab: Lab) -> None:
    metrics = lab.tmp / "run.prom"
    tick = _next_tick()
    _at(tick)
    run = _run(lab, "worker-2", "run", "--metrics-textfile", str(metrics))
    print(f"\nlockctl run: exit {run.returncode}\n{run.stderr}")  # for docs/scheduler.md
    assert run.returncode == 0, run.stderr
    (retrying,) = _events(run.stderr, "retrying")
    assert (retrying["attempt"], retrying["after_status"]) == (2, FAILED)
    assert retrying["tick"] == tick_name(tick)
    (started,) = _events(run.stderr, "retry-started")
    assert started["attempt"] == 2 and started["session"] == retrying["session"]
    assert len(_events(run.stderr, "acquired")) == 1  # one claim, one lock, two attempts
    record = _record(lab, "run", tick_name(tick))
    assert (record.outcome, record.attempts, record.worker) == (
        TickOutcome.SUCCEEDED,
        (FAILED, 0),
        "worker-2",
    )
    prom = metrics.read_text()
    assert f'lockctl_job_retries_total{{job="{lab.jobs["run"]}",worker="worker-2"}} 1.0' in prom
    assert pids_with(_marker("run")) == []


def test_a_job_failing_every_time_stops_after_retries_plus_one_attempts(lab: Lab) -> None:
    tick = _next_tick()
    _at(tick)
    run = _run(lab, "worker-1", "fail")
    assert run.returncode == FAILED, run.stderr
    assert [e["attempt"] for e in _events(run.stderr, "retry-started")] == [2, 3]
    assert not _events(run.stderr, "retries-cut")
    record = _record(lab, "fail", tick_name(tick))
    assert (record.outcome, record.attempts) == (TickOutcome.FAILED, (FAILED,) * 3)
    history = _lockctl(lab, "history", "--job", lab.jobs["fail"])
    assert "failed (3 attempts)" in history.stdout, history.stdout
    # a plain lock (no schedule, no record): retries + 1 attempts, released at the end
    plain = _run(lab, "worker-1", "plain")
    assert plain.returncode == FAILED, plain.stderr
    assert len(_events(plain.stderr, "retry-started")) == 1 and "tick" not in plain.stderr
    assert _lock_holder(lab, "plain") is None
    assert pids_with(_marker("fail")) == [] and pids_with(_marker("plain")) == []


def test_the_next_tick_cuts_the_retries(lab: Lab) -> None:
    every = SCHEDULES["cut"]
    tick = _next_tick(every)
    following = tick.timestamp() + every
    _at(tick)
    run = _run(lab, "worker-3", "cut")
    assert run.returncode == FAILED, run.stderr
    (cut,) = _events(run.stderr, "retries-cut")
    assert cut["reason"] == "next-tick" and cut["tick"] == tick_name(tick)
    record = _record(lab, "cut", tick_name(tick))
    assert record.outcome is TickOutcome.FAILED and record.retries_cut == "next-tick"
    assert record.attempts is not None and 1 <= len(record.attempts) < 6
    assert len(record.attempts) == 1 + len(_events(run.stderr, "retry-started"))
    starts = [at for t, _, _, at in _attempts_log(lab, "cut") if t == tick_name(tick)]
    assert len(starts) == len(record.attempts)
    # each retry started before the next tick's instant (the job's own clock reading comes
    # later: its shell's start-up, which a loaded host stretches)
    for started in _events(run.stderr, "retry-started"):
        assert (
            datetime.fromisoformat(started["time"].replace("Z", "+00:00")).timestamp() < following
        )
    history = _lockctl(lab, "history", "--job", lab.jobs["cut"])
    assert "retries cut by the next tick" in history.stdout, history.stdout


def test_a_timed_out_attempt_is_retried_only_with_retry_on_timeout(lab: Lab) -> None:
    tick = _next_tick()
    _at(tick)
    once = _run(lab, "worker-1", "hang")
    assert once.returncode == EXIT_JOB_TIMEOUT, once.stderr
    assert len(_events(once.stderr, "timed-out")) == 1 and not _events(once.stderr, "retrying")
    record = _record(lab, "hang", tick_name(tick))
    assert record.outcome is TickOutcome.TIMED_OUT and record.attempts is None
    tick = _next_tick()
    _at(tick)
    again = _run(lab, "worker-1", "hangretry")
    assert again.returncode == EXIT_JOB_TIMEOUT, again.stderr
    assert len(_events(again.stderr, "timed-out")) == 2
    assert len(_events(again.stderr, "retry-started")) == 1
    record = _record(lab, "hangretry", tick_name(tick))
    assert record.outcome is TickOutcome.TIMED_OUT
    assert record.attempts is not None and len(record.attempts) == 2
    assert pids_with(_marker("hang")) == [] and pids_with(_marker("hangretry")) == []


def _run_until_retrying(lab: Lab, short: str, act: Callable[[str], None]) -> tuple[int, str]:
    """`lockctl run` of the job's tick, `act(session)` when it says it is retrying; its exit code
    and its stderr."""
    argv = [*LOCKCTL, "run", "--config", str(lab.configs["worker-1"]), "--job", lab.jobs[short]]
    command = _command(lab.tmp, lab.script, short)
    process = subprocess.Popen(
        [*argv, "--", *command], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    lines: list[str] = []
    try:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            if line.startswith("{") and json.loads(line)["event"] == "retrying":
                act(json.loads(line)["session"])  # in its 10 s delay
                break
        lines += process.stderr.readlines()
        code = process.wait(WAIT)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(WAIT)
        if process.stderr is not None:
            process.stderr.close()
    return code, "".join(lines)


def test_a_lock_lost_during_the_delay_ends_the_retries(lab: Lab) -> None:
    tick = _next_tick(SCHEDULES["fenced"])
    _at(tick)
    code, text = _run_until_retrying(lab, "fenced", lab.cluster.management().session.destroy)
    assert code == EXIT_LOCK_LOST, text
    assert _events(text, "fenced") and not _events(text, "retry-started")
    record = _record(lab, "fenced", tick_name(tick))
    assert record.outcome is TickOutcome.LOST and record.attempts == (FAILED,)
    assert len([a for a in _attempts_log(lab, "fenced") if a[0] == tick_name(tick)]) == 1


def test_a_stop_during_the_delay_ends_the_retries_and_releases(lab: Lab) -> None:
    tick = _next_tick(SCHEDULES["fenced"])
    _at(tick)
    stopped: list[int] = []

    def stop(_: str) -> None:
        (pid,) = [p for p in pids_with(lab.jobs["fenced"]) if _is_runner(p)]
        os.kill(pid, signal.SIGTERM)
        stopped.append(pid)

    code, text = _run_until_retrying(lab, "fenced", stop)
    assert stopped and code == FAILED, text  # the last attempt's status: it failed, not stopped
    (cut,) = _events(text, "retries-cut")
    assert cut["reason"] == "stop-requested" and cut["attempt"] == 1
    (released,) = _events(text, "released")
    assert released["released"] is True and not _events(text, "retry-started")
    record = _record(lab, "fenced", tick_name(tick))
    assert (record.outcome, record.attempts, record.retries_cut) == (
        TickOutcome.FAILED,
        (FAILED,),
        "stop-requested",
    )
    assert _lock_holder(lab, "fenced") is None


def _is_runner(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"run" in argv and b"--job" in argv
