"""overlap = "cancel" on the real cluster: two `lockctl schedule` replicas run an `@every 3s`
job whose every run outlasts its interval and leaves a child that ignores SIGTERM; at each next
tick the replica running it ends the whole tree (SIGKILL after kill_grace for the child),
records the tick `cancelled`, releases the lock, and the next tick runs: once, and never
beside the run it cancelled (it starts after that run's record was completed, once its tree had
ended: the run writes its start time, the record its end, on the one host's clock)."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

import pytest
from procscan import pids_with
from scheduler_lab import SchedulerProcess
from workers_lab import JobLab, one_job

from provision.ledger.records import TickOutcome, TickRecord, tick_name
from tests.lockctl_process import eventually

if TYPE_CHECKING:
    from conftest import LiveCluster

WORKERS = ("worker-1", "worker-2")
WAIT = 60.0
CANCELLED = 3  # runs cancelled before the test looks
INTERVAL = timedelta(seconds=3)
RUNS = (TickOutcome.CANCELLED, TickOutcome.RUNNING)  # every run of the job: none ends itself

# $1: the folder, $2: the marker. Each run: a marker of its own (the marker, 0, how many runs
# came before it: its processes are found by it from outside the run's PID namespace), a child
# that ignores SIGTERM, its tick, marker and start time written down, and a sleep.
JOB = """#!/bin/sh
began=$(date +%s.%N)
m="$2"0$(cat "$1/runs" 2>/dev/null | wc -l)
sh -c 'trap "" TERM; exec sleep "$0"' "$m" &
echo "$LOCKCTL_TICK $m $began" >> "$1/runs"
exec sleep "$m"
"""


# Each run's marker starts with this: no other process has it (this process's PID in it)
MARKER = f"600.{os.getpid()}{uuid.uuid4().int % 1000}"


@pytest.fixture
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobLab]:
    tmp = tmp_path_factory.mktemp("overlap")
    script = tmp / "tree.sh"
    script.write_text(JOB)
    script.chmod(0o755)
    attributes = {
        "schedule": '"@every 3s"',
        "overlap": '"cancel"',
        "command": json.dumps([str(script), str(tmp), MARKER]),
    }
    with one_job(live_cluster, tmp, "cancels", WORKERS, attributes) as lab:
        yield lab


def lockctl(lab: JobLab, *args: str) -> subprocess.CompletedProcess[str]:
    return lab.operator(*args)


@dataclass(frozen=True)
class Ran:
    tick: str
    marker: str
    began: datetime


def runs(lab: JobLab) -> list[Ran]:
    """Each run's tick, marker and start, as the runs wrote them."""
    path = lab.tmp / "runs"
    lines = path.read_text().splitlines() if path.exists() else []
    return [
        Ran(tick, marker, datetime.fromtimestamp(float(began), timezone.utc))
        for tick, marker, began in (line.split() for line in lines)
    ]


def test_cancel_ends_each_run_at_the_next_tick_and_runs_that_tick_once(lab: JobLab) -> None:
    schedulers = [SchedulerProcess(lab.configs[worker]) for worker in WORKERS]
    try:

        def cancelled() -> list[TickRecord]:
            return [r for r in lab.records() if r.outcome is TickOutcome.CANCELLED]

        done = eventually(lambda: len(cancelled()) >= CANCELLED, WAIT)
        assert done, (lab.records(), schedulers[0].lines[-20:], schedulers[1].lines[-20:])

        def whole() -> list[TickRecord]:
            """A look at the ledger in which each cancelled tick's next one is claimed (the
            holder claims it once the cancelled record is completed)."""
            found = lab.records()
            ticks = {r.tick for r in found}
            stopped = [r for r in found if r.outcome is TickOutcome.CANCELLED]
            return found if all(r.tick + INTERVAL in ticks for r in stopped) else []

        seen = eventually(whole, WAIT)
        assert seen, lab.records()
        by_tick = {r.tick: r for r in seen}
        stopped = [r for r in seen if r.outcome is TickOutcome.CANCELLED]
        claimed = {tick_name(r.tick) for r in seen if r.outcome in RUNS}

        def written() -> list[Ran]:
            found = runs(lab)
            return found if claimed <= {r.tick for r in found} else []

        ran = eventually(written, WAIT)
        assert ran, (claimed, runs(lab))
        assert [t for t, n in Counter(r.tick for r in ran).items() if n > 1] == []  # none twice
        started = {r.tick: r for r in ran}
        for record in stopped:
            # the next tick ran (its record is a run's), and its run started once this run's
            # record was completed, after its tree ended: never beside it
            following = by_tick.get(record.tick + INTERVAL)
            assert following is not None, (record, sorted(by_tick))
            assert following.outcome in RUNS, following
            assert record.finished_at is not None and record.worker in WORKERS
            later = started[tick_name(following.tick)]
            assert later.began > record.finished_at, (record, later)
            mine = started[tick_name(record.tick)]  # its whole tree is gone
            assert eventually(lambda m=mine.marker: pids_with(m) == [], WAIT), (mine, ran)
        # not a vacuous look: a run going on is found by its marker, its sleep and its child
        assert eventually(lambda: len(pids_with(runs(lab)[-1].marker)) == 2, WAIT), runs(lab)
        said = [e for s in schedulers for e in s.events("cancelled")]
        assert len(said) >= CANCELLED, said

        history = lockctl(lab, "history", "--job", lab.job, "--limit", "4")
        assert history.returncode == 0, history.stderr
        print(f"\n$ lockctl history --job {lab.job} --limit 4\n{history.stdout}")  # for docs
        assert "cancelled" in history.stdout
    finally:
        for scheduler in schedulers:
            assert scheduler.stop() == 0, scheduler.lines
            assert not any("Traceback" in line for line in scheduler.lines), scheduler.lines
    left = [r.marker for r in runs(lab) if pids_with(r.marker)]
    assert eventually(lambda: [m for m in left if pids_with(m)] == [], WAIT), left
