"""A job's `timeout` on the real cluster (issue 21, item 1): a run still going when its timeout
passes is stopped as a lost lock's job is (SIGTERM to the whole tree, kill_grace, SIGKILL), its
tick recorded `timed-out` with the exit status, and the lock released at once.

The job is a process tree that only SIGKILL ends: a shell that ignores SIGTERM, a child that
ignores it too, and a `setsid` daemon that left the job's process group. Each process ends in
`sleep 300.<marker>`, which finds it in /proc (the PIDs the job writes are its namespace's own).
timeout 2s, kill_grace 1s, ticks @every 5s. Under `lockctl run`: exit 124, nothing of the tree
survives, the lock key is free the moment it returns, and another worker's run at the next tick
acquires (an unreleased lock would be in its LockDelay then, as destroying the session starts it),
the metrics textfile counts `timed-out`; a plain lock (no schedule, no record) the same.
Under `lockctl schedule`: the same record, the lock free between ticks (the scheduler's session
lives on: an unreleased lock would stay held), `/metrics` counts `timed-out`, and `lockctl
check` says the tick timed out.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from procscan import pids_with
from scheduler_lab import ListeningScheduler
from test_scheduler_listen import _value
from workers_lab import minted_workers, spec_text

from provision.ledger.records import TickOutcome, tick_name
from provision.ledger.store import Ledger
from provision.schedule import parse_schedule
from tests.lockctl_process import LOCKCTL, run_lockctl

if TYPE_CHECKING:
    from conftest import LiveCluster

WORKERS = ("worker-1", "worker-2")
EVERY = 5
SCHEDULE = parse_schedule(f"@every {EVERY}s")
WAIT = 30.0
TREE = 3  # the shell, the child that ignores SIGTERM, the setsid daemon
SIGKILLED = 137  # the shell ignores SIGTERM: only SIGKILL ends it (128 + 9)

# $1: the folder for the PID files, $2: the marker. Nothing is left to the shells: each execs
# its sleep, so the three sleeps are the tree.
JOB = """#!/bin/sh
trap '' TERM
setsid sh -c 'echo $$ > "$0/daemon.pid"; exec sleep "$1"' "$1" "$2" &
sh -c 'trap "" TERM; echo $$ > "$0/ignorer.pid"; exec sleep "$1"' "$1" "$2" &
echo $$ > "$1/main.pid"
exec sleep "$2"
"""


@dataclass(frozen=True)
class Lab:
    tmp: Path
    configs: dict[str, Path]
    spec_path: Path
    jobs: dict[str, str]  # short -> job name
    keys: dict[str, str]  # short -> lock key
    script: Path
    cluster: LiveCluster
    secrets: tuple[str, ...] = field(repr=False)  # pytest prints a failing test's arguments


@pytest.fixture(scope="module")
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("timeout")
    uid = uuid.uuid4().hex[:8]
    script = tmp / "tree.sh"
    script.write_text(JOB)
    script.chmod(0o755)
    kv = f"test/timeout-{uid}/"
    jobs = {
        short: {"prefix": f'"{kv}{short}/"', "schedule": f'"@every {EVERY}s"', "timeout": '"2s"'}
        for short in ("run", "sched")
    }
    jobs["plain"] = {"prefix": f'"{kv}plain/"', "timeout": '"2s"'}  # no schedule: no ledger
    # the scheduler's job alone has a command: `lockctl schedule` leaves the others alone
    jobs["sched"]["command"] = json.dumps([str(script), str(tmp / "sched"), _marker("sched")])
    spec_path = tmp / "locks.hcl"
    text = spec_text(live_cluster, WORKERS, {f"{s}-{uid}": a for s, a in jobs.items()})
    spec_path.write_text(text)
    for short in jobs:
        (tmp / short).mkdir()
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


def _marker(short: str) -> str:
    return f"300.{os.getpid()}{('run', 'sched', 'plain').index(short)}"


def _events(text: str, name: str) -> list[dict[str, Any]]:
    found = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    return [event for event in found if event["event"] == name]


def _next_tick() -> datetime:
    return SCHEDULE.next_ticks(datetime.now(timezone.utc), 1)[0]


def _at(tick: datetime, offset: float = 0.05) -> None:
    time.sleep(max(0.0, tick.timestamp() + offset - time.time()))


def _run(
    lab: Lab, worker: str, command: list[str], *flags: str, short: str = "run"
) -> subprocess.CompletedProcess[str]:
    argv = [*LOCKCTL, "run", "--config", str(lab.configs[worker]), "--job", lab.jobs[short]]
    return subprocess.run(
        [*argv, *flags, "--", *command], capture_output=True, text=True, timeout=WAIT, check=False
    )


def _lock_holder(lab: Lab, short: str) -> str | None:
    entry, _ = lab.cluster.management().kv.get(lab.keys[short], consistency="consistent")
    return None if entry is None else (entry.session or None)


def _lockctl(lab: Lab, *args: str) -> subprocess.CompletedProcess[str]:
    connection = ["--address", lab.cluster.address("server-1")]
    connection += ["--token-file", str(lab.cluster.layout.management_token_file)]
    flags = ["--spec", str(lab.spec_path), *connection, *lab.cluster.tls_flags()]
    result = run_lockctl(*args, *flags, drop=("CONSUL_", "FORCE_COLOR"))
    assert "Traceback" not in result.stderr, result.stderr
    for secret in lab.secrets:
        assert secret not in result.stdout + result.stderr
    return result


def _sleepers(marker: str) -> list[int]:
    """The tree's processes: each ends as `sleep <marker>` (the marker is in other argvs too:
    the runner's, the shells' that pass it on)."""
    return [pid for pid in pids_with(marker) if _argv(pid) == [b"sleep", marker.encode()]]


def _argv(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
    except OSError:
        return []


def _watch_tree(marker: str, seen: list[int]) -> None:
    """Note the most processes of the tree alive at once, until none is (or WAIT passes)."""
    give_up_at = time.monotonic() + WAIT
    while time.monotonic() < give_up_at:
        alive = len(_sleepers(marker))
        seen.append(alive)
        if alive == 0 and max(seen) > 0:
            return
        time.sleep(0.05)


def test_lockctl_run_stops_the_whole_tree_at_the_timeout_and_releases(lab: Lab) -> None:
    command = [str(lab.script), str(lab.tmp / "run"), _marker("run")]
    metrics = lab.tmp / "run.prom"
    tick = _next_tick()
    _at(tick)
    seen: list[int] = []
    watcher = threading.Thread(target=_watch_tree, args=(_marker("run"), seen))
    watcher.start()
    began = time.monotonic()
    run = _run(lab, "worker-1", command, "--metrics-textfile", str(metrics))
    took = time.monotonic() - began
    holder = _lock_holder(lab, "run")  # at once: released, not left to the TTL
    watcher.join(WAIT)
    print(f"\nlockctl run: exit {run.returncode}\n{run.stderr}")  # for docs/runner.md

    assert run.returncode == 124, run.stderr
    assert "Traceback" not in run.stderr
    assert max(seen) == TREE, seen  # the whole tree ran ...
    assert pids_with(_marker("run")) == []  # ... and nothing of it survives
    assert all((lab.tmp / "run" / f"{name}.pid").exists() for name in ("main", "ignorer", "daemon"))
    assert holder is None
    (timed_out,) = _events(run.stderr, "timed-out")
    assert timed_out["job"] == lab.jobs["run"] and timed_out["tick"] == tick_name(tick)
    assert timed_out["after_ms"] == 2000.0
    (released,) = _events(run.stderr, "released")
    assert released["released"] is True and released["child_status"] == SIGKILLED
    assert 3.0 <= took < 10.0  # 2 s timeout + 1 s kill grace (+ starting Python), not the TTL
    record = Ledger(lab.cluster.management(), lab.keys["run"]).read(tick)[0]
    assert record is not None
    assert (record.outcome, record.exit_status) == (TickOutcome.TIMED_OUT, SIGKILLED)
    prom = metrics.read_text()
    assert 'outcome="timed-out",worker="worker-1"} 1.0' in prom, prom
    assert f'last_exit_status{{job="{lab.jobs["run"]}",worker="worker-1"}} 124.0' in prom, prom

    # Another worker claims the next tick at once: no TTL, no LockDelay to wait out.
    following = SCHEDULE.next_ticks(tick, 1)[0]
    _at(following)
    other = _run(lab, "worker-2", ["/bin/sh", "-c", "exit 0"])
    assert other.returncode == 0, other.stderr
    (acquired,) = _events(other.stderr, "acquired")
    assert acquired["tick"] == tick_name(following) and acquired["waited_ms"] < 1000

    history = _lockctl(lab, "history", "--job", lab.jobs["run"], "--json")
    assert history.returncode == 0, history.stderr
    (job,) = json.loads(history.stdout)
    rows = {row["tick"]: row for row in job["ticks"]}
    assert rows[tick_name(tick)]["outcome"] == "timed-out"
    assert rows[tick_name(tick)]["exit_status"] == SIGKILLED


def test_a_plain_lock_is_released_at_the_timeout_too(lab: Lab) -> None:
    """No schedule, no record: the same stop, exit 124, and the key free when run returns."""
    command = [str(lab.script), str(lab.tmp / "plain"), _marker("plain")]
    run = _run(lab, "worker-1", command, short="plain")
    holder = _lock_holder(lab, "plain")
    assert run.returncode == 124, run.stderr
    assert holder is None and _sleepers(_marker("plain")) == []
    (timed_out,) = _events(run.stderr, "timed-out")
    assert timed_out["after_ms"] == 2000.0 and "tick" not in timed_out
    (released,) = _events(run.stderr, "released")
    assert released["released"] is True and released["child_status"] == SIGKILLED
    other = _run(lab, "worker-2", ["/bin/sh", "-c", "exit 0"], short="plain")
    assert other.returncode == 0 and _events(other.stderr, "acquired"), other.stderr


class Scheduler(ListeningScheduler):
    def done(self, job: str) -> list[dict[str, Any]]:
        return [e for e in self.events("released") if e.get("job") == job]


def test_lockctl_schedule_stops_the_tree_at_the_timeout_and_check_warns(lab: Lab) -> None:
    job, marker = lab.jobs["sched"], _marker("sched")
    scheduler = Scheduler(lab.configs["worker-1"])
    try:
        seen: list[int] = []
        free = False
        holders: list[tuple[float, str | None]] = []
        give_up_at = time.monotonic() + WAIT
        # Between two ticks, under a session that lives on, the key is free. A tick claimed late
        # (the scheduler starts mid-interval) runs its 3 s (timeout and kill grace) into the next
        # tick's instant, which is then claimed at once: the late start carries on for a tick or
        # two until a run ends before the next instant. So watch until a free window was seen.
        while time.monotonic() < give_up_at and (
            (done := len(scheduler.done(job))) < 3 or not free
        ):
            if done >= 1 and not free:
                holders.append((time.time(), _lock_holder(lab, "sched")))
                free = holders[-1][1] is None  # (no /proc scan: a short window)
            else:
                seen.append(len(_sleepers(marker)))
            time.sleep(0.02)
        assert len(scheduler.done(job)) >= 3, scheduler.lines
        samples = scheduler.scrape()
        assert scheduler.stop() == 0  # before its next tick: the last one stays timed-out
    finally:
        scheduler.kill()
    ticks = [e["tick"] for e in scheduler.events("timed-out") if e.get("job") == job]
    # status first: its last tick is the newest of the ledger, and the tick after the scheduler's
    # stop becomes that (missed) once its window closes, 5 s on
    status = _lockctl(lab, "status", "--json")  # every job of the spec
    check = _lockctl(lab, "check", "--job", job)
    history = _lockctl(lab, "history", "--job", job)
    for result in (check, history, status):  # for docs/history.md
        print(f"\n{' '.join(result.args[3:6])}: exit {result.returncode}\n{result.stdout[:3000]}")
    assert max(seen) == TREE, seen
    timeline = [
        (e["time"][11:23], e["event"], e.get("tick"))
        for e in scheduler.events()
        if e.get("job") == job and e["event"] in ("acquired", "timed-out", "released")
    ]
    assert free, (holders, timeline)  # released: an unreleased lock would stay held by the ...
    assert not [e for e in scheduler.events("skipped") if e.get("job") == job]  # live session
    assert len(ticks) >= 3 and all(e["released"] for e in scheduler.done(job))
    assert pids_with(marker) == []
    ledger = Ledger(lab.cluster.management(), lab.keys["sched"])
    for name in ticks[:3]:
        record = next(r for r in ledger.records() if tick_name(r.tick) == name)
        assert (record.outcome, record.exit_status) == (TickOutcome.TIMED_OUT, SIGKILLED)
    assert _value(samples, "lockctl_ticks_total", job=job, outcome="timed-out") >= 3
    assert check.returncode in (1, 2), check.stdout  # at least WARNING
    assert f"last run {ticks[-1]} timed-out (exit 137, on worker-1)" in check.stdout
    assert history.returncode == 0 and history.stdout.count("timed-out") >= 3, history.stdout
    (state,) = [s for s in json.loads(status.stdout) if s["job"] == job]
    last = state["last_tick"]
    if last["tick"] == ticks[-1]:
        assert last["outcome"] == "timed-out", state
    else:  # a loaded machine: the stop's next tick's window closed before status read
        assert last["tick"] > ticks[-1] and last["outcome"].startswith("missed"), state
    assert "Traceback" not in "\n".join(scheduler.lines)
