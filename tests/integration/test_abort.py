"""`lockctl abort JOB` on the real cluster: two `lockctl schedule` replicas run a job whose
first run is a process tree that ignores SIGTERM (a child escaped into its own session among
it); `lockctl abort` makes the replica running it end the whole tree, record the tick
`aborted` with who and why, and release the lock; the next tick runs as usual. A worker's
token gets 403; a job that is not running is exit 1."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from procscan import pids_with
from scheduler_lab import SchedulerProcess
from workers_lab import JobLab, one_job

from provision.ledger.records import TickOutcome, TickRecord, tick_name
from provision.system.control_keys import abort_key
from tests.lockctl_process import eventually

if TYPE_CHECKING:
    from conftest import LiveCluster

WORKERS = ("worker-1", "worker-2")
WAIT = 30.0
REASON = "stuck on a dead NFS mount"

# $1: the folder, $2: the marker. The first run only: a tree of sleeps that ignore SIGTERM
# (one in a session of its own); every later run writes a line and ends.
JOB = """#!/bin/sh
if [ -e "$1/first" ]; then echo ran >> "$1/runs"; exit 0; fi
touch "$1/first"
trap '' TERM
setsid sh -c 'exec sleep "$0"' "$2" &
sh -c 'trap "" TERM; exec sleep "$0"' "$2" &
exec sleep "$2"
"""


# The argv of the first run's sleeps: no other process has it (this process's PID in it)
MARKER = f"600.{os.getpid()}{uuid.uuid4().int % 1000}"


@pytest.fixture(scope="module")
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobLab]:
    tmp = tmp_path_factory.mktemp("abort")
    script = tmp / "tree.sh"
    script.write_text(JOB)
    script.chmod(0o755)
    attributes = {
        "schedule": '"@every 3s"',
        "kill_grace": '"1s"',
        "command": json.dumps([str(script), str(tmp), MARKER]),
    }
    with one_job(live_cluster, tmp, "aborted", WORKERS, attributes) as lab:
        yield lab


def lockctl(lab: JobLab, *args: str, token: Path | None = None) -> subprocess.CompletedProcess[str]:
    return lab.operator(*args, token=token)


def with_outcome(lab: JobLab, outcome: TickOutcome) -> list[TickRecord]:
    return [r for r in lab.records() if r.outcome is outcome]


def test_an_abort_ends_the_whole_tree_records_who_and_why_and_the_next_tick_runs(
    lab: JobLab,
) -> None:
    before = lockctl(lab, "abort", lab.job)
    assert before.returncode == 1, before.stderr
    assert before.stderr == f"lockctl: error: job {lab.job} is not running: nothing aborted\n"

    schedulers = [SchedulerProcess(lab.configs[worker]) for worker in WORKERS]
    try:
        tree = eventually(lambda: len(pids_with(MARKER)) == 3, WAIT)
        assert tree, "\n".join(schedulers[0].lines + schedulers[1].lines)
        [running] = with_outcome(lab, TickOutcome.RUNNING)

        denied = lockctl(lab, "abort", lab.job, token=lab.tmp / "secrets" / "worker-1.token")
        assert denied.returncode == 4, denied.stderr  # a worker's token: 403
        assert lab.cluster.management().kv.get(abort_key(lab.job))[0] is None

        aborted = lockctl(lab, "abort", lab.job, "--reason", REASON)
        assert aborted.returncode == 0, aborted.stderr
        print(f"\n$ lockctl abort {lab.job} --reason '{REASON}'\n{aborted.stdout}")  # for docs
        assert aborted.stdout.startswith(f"job {lab.job} aborted by ")
        assert f": {REASON} (tick " in aborted.stdout

        assert eventually(lambda: pids_with(MARKER) == [], WAIT), pids_with(MARKER)
        done = eventually(lambda: with_outcome(lab, TickOutcome.ABORTED), WAIT)
        assert done, lab.records()
        [record] = done
        assert record.tick == running.tick and record.worker == running.worker
        assert record.by and record.reason == REASON and record.asked_at is not None

        runs = lab.tmp / "runs"
        assert eventually(runs.exists, WAIT), lab.records()  # the next tick ran as usual
        later = eventually(
            lambda: [r for r in with_outcome(lab, TickOutcome.SUCCEEDED) if r.tick > record.tick],
            WAIT,
        )
        assert later, lab.records()
        said = [e for s in schedulers for e in s.events("aborted")]
        assert len(said) == 1 and REASON in said[0]["asked"], said

        # from the aborted tick on: on a loaded machine the later ticks of `@every 3s` that ran
        # before this line may be many, and a last-N table would have pushed it out
        since = tick_name(record.tick)
        history = lockctl(lab, "history", "--job", lab.job, "--since", since, "--limit", "100")
        assert history.returncode == 0, history.stderr
        print(f"\n$ lockctl history --job {lab.job} --since {since}\n{history.stdout}")  # docs
        assert f"aborted (by {record.by}" in history.stdout
    finally:
        for scheduler in schedulers:
            assert scheduler.stop() == 0, scheduler.lines
            assert not any("Traceback" in line for line in scheduler.lines), scheduler.lines
