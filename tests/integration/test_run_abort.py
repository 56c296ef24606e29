"""`lockctl abort JOB` of a scheduled job's `lockctl run` on the real cluster: the run hears the
note on its blocking read of the job's abort key, ends the job's whole tree (a child that
ignores SIGTERM, a grandchild in a session of its own), records the tick `aborted` with who and
why, releases the lock and exits 143. A note naming another run (a past tick, or this tick
under another session) stops nothing."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import pytest
from procscan import pids_with
from workers_lab import JobLab, one_job

from provision.errors import EXIT_ABORTED
from provision.ledger.aborts import AbortNote
from provision.ledger.control import ControlNote
from provision.ledger.records import TickOutcome, tick_name
from provision.schedule import parse_schedule
from provision.system.control_keys import abort_key
from tests.lockctl_process import LOCKCTL, eventually

if TYPE_CHECKING:
    from conftest import LiveCluster

WORKERS = ("worker-1",)
WAIT = 30.0
REASON = "stuck on a dead NFS mount"
TREE = 3  # the script's sleeps: the main one, one that ignores SIGTERM, one in its own session
# Each run starts right after a tick (`at_next_tick`): its window (the interval) outlasts a
# slow start (Python on a loaded machine), whenever the test runs.
EVERY = "@every 30s"
SCHEDULE = parse_schedule(EVERY, "UTC")

# $1: the marker. A tree of sleeps that ignore SIGTERM, one of them in a session of its own.
JOB = """#!/bin/sh
trap '' TERM
setsid sh -c 'exec sleep "$0"' "$1" &
sh -c 'trap "" TERM; exec sleep "$0"' "$1" &
exec sleep "$1"
"""


@pytest.fixture(scope="module")
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobLab]:
    tmp = tmp_path_factory.mktemp("run-abort")
    script = tmp / "tree.sh"
    script.write_text(JOB)
    script.chmod(0o755)
    attributes = {"schedule": f'"{EVERY}"', "kill_grace": '"1s"'}
    with one_job(live_cluster, tmp, "run-aborted", WORKERS, attributes) as lab:
        yield lab


def sleepers(marker: str) -> list[int]:
    """The tree's processes: each is `sleep <marker>` (the runner's argv and the shells' that
    pass the marker on hold it too)."""
    return [pid for pid in pids_with(marker) if _argv(pid) == [b"sleep", marker.encode()]]


def _argv(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
    except OSError:
        return []


def events(path: Path, name: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == name]


def note(tick: datetime, session: str, reason: str) -> bytes:
    """An abort note as `lockctl abort` writes it, naming the run of `tick` under `session`."""
    asked = ControlNote("a test", datetime.now(timezone.utc), reason, uuid.uuid4().hex[:16])
    return AbortNote(asked, tick, session).encode()


def at_next_tick() -> None:
    """Sleep until just after the schedule's next tick (a start, not a synchronisation)."""
    tick = SCHEDULE.next_ticks(datetime.now(timezone.utc), 1)[0]
    time.sleep(max(0.0, tick.timestamp() + 0.05 - time.time()))


def start_run(lab: JobLab, marker: str, stderr: IO[str]) -> subprocess.Popen[str]:
    argv = [*LOCKCTL, "run", "--config", str(lab.configs["worker-1"]), "--job", lab.job]
    script = str(lab.tmp / "tree.sh")
    return subprocess.Popen(
        [*argv, "--", script, marker], stdout=subprocess.DEVNULL, stderr=stderr, text=True
    )


def test_lockctl_run_obeys_an_abort_of_its_run_and_no_other(lab: JobLab) -> None:
    management = lab.cluster.management()
    marker = f"600.{os.getpid()}{int(lab.uid, 16) % 1000}"  # no other process has this argv
    # a past run's note, left in the key: heard at the watch's first read, it stops nothing
    past = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=1)
    management.kv.put(abort_key(lab.job), note(past, "a-past-session", "an old abort"))
    log = lab.tmp / "run.log"
    at_next_tick()
    with log.open("w") as stderr:
        run = start_run(lab, marker, stderr)
    try:
        tree = eventually(lambda: sorted(sleepers(marker)) if len(sleepers(marker)) == TREE else [])
        assert tree, log.read_text()
        [acquired] = eventually(lambda: events(log, "acquired"))
        tick, session = acquired["tick"], acquired["session"]
        running = [r for r in lab.records() if r.outcome is TickOutcome.RUNNING]
        assert [tick_name(r.tick) for r in running] == [tick], lab.records()

        # this tick under another session: heard (said), and the tree goes on
        management.kv.put(abort_key(lab.job), note(running[0].tick, "another-session", "wrong"))
        ignored = eventually(lambda: events(log, "abort-ignored"))
        assert [e["tick"] for e in ignored] == [tick], log.read_text()
        assert sorted(sleepers(marker)) == tree and run.poll() is None, log.read_text()

        aborted = lab.operator("abort", lab.job, "--reason", REASON)
        assert aborted.returncode == 0, aborted.stderr
        print(f"\n$ lockctl abort {lab.job} --reason '{REASON}'\n{aborted.stdout}")  # for docs
        assert f"(tick {tick})" in aborted.stdout
        assert "stops it now, recorded `aborted`" in aborted.stdout

        assert run.wait(WAIT) == EXIT_ABORTED, log.read_text()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(WAIT)
    print(f"\n$ lockctl run ... (exit {run.returncode})\n{log.read_text()}")  # for docs
    text = log.read_text()
    assert "Traceback" not in text
    assert all(secret not in text for secret in lab.secrets)
    assert sleepers(marker) == [] and all(not Path(f"/proc/{pid}").exists() for pid in tree)
    entry, _ = management.kv.get(lab.lock_key, consistency="consistent")
    assert entry is None or entry.session is None  # released, not left to the TTL
    [said] = events(log, "aborted")
    assert said["tick"] == tick and said["session"] == session and REASON in said["asked"]
    [released] = events(log, "released")
    assert released["released"] is True and released["child_status"] == 137  # SIGKILL'd
    [record] = [r for r in lab.records() if tick_name(r.tick) == tick]
    assert record.outcome is TickOutcome.ABORTED and record.session == session
    assert record.by and record.reason == REASON and record.asked_at is not None
    assert record.exit_status == 137
