"""overlap = "buffer_one" on the real cluster: two `lockctl schedule` replicas run an `@every 4s`
job whose every run lasts 6 s. A tick that comes while the job runs is recorded `buffered` and
run as soon as that run ends (by the replica that held it, or the other once the lock is free),
even after the next tick's instant has passed (under "skip" it would have been skipped); a tick
that comes while one is buffered already is skipped. No tick runs twice, and no run starts
before the run before it was completed (each run writes its start time, each record its end, on
the one host's clock)."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

import pytest
from scheduler_lab import SchedulerProcess
from workers_lab import JobLab, one_job

from provision.ledger.records import TickOutcome, TickRecord, parse_tick_name
from tests.lockctl_process import eventually

if TYPE_CHECKING:
    from conftest import LiveCluster

WORKERS = ("worker-1", "worker-2")
WAIT = 90.0
INTERVAL = timedelta(seconds=4)
BUFFERED_RUNS = 3  # buffered ticks run before the test looks
# the holder claims the buffered tick as soon as its run is completed: a read, a claim, a fork
HAND_OVER = timedelta(seconds=5)
FINISHED = (TickOutcome.SUCCEEDED, TickOutcome.FAILED)

# $1: the folder. Each run writes its tick and start time down, then sleeps 6 s.
JOB = """#!/bin/sh
echo "$LOCKCTL_TICK $(date +%s.%N)" >> "$1/runs"
exec sleep 6
"""


@pytest.fixture
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobLab]:
    tmp = tmp_path_factory.mktemp("buffer")
    script = tmp / "run.sh"
    script.write_text(JOB)
    script.chmod(0o755)
    attributes = {
        "schedule": '"@every 4s"',
        "overlap": '"buffer_one"',
        "command": json.dumps([str(script), str(tmp)]),
    }
    with one_job(live_cluster, tmp, "buffers", WORKERS, attributes) as lab:
        yield lab


@dataclass(frozen=True)
class Ran:
    tick: datetime
    began: datetime


def runs(lab: JobLab) -> list[Ran]:
    """Each run's tick and start, as the runs wrote them, in the order they started."""
    path = lab.tmp / "runs"
    lines = path.read_text().splitlines() if path.exists() else []
    found = [
        Ran(parse_tick_name(tick), datetime.fromtimestamp(float(began), timezone.utc))
        for tick, began in (line.split() for line in lines)
    ]
    return sorted(found, key=lambda ran: ran.began)


def test_buffer_one_runs_a_tick_that_came_during_a_run_as_that_run_ends(lab: JobLab) -> None:
    schedulers = [SchedulerProcess(lab.configs[worker]) for worker in WORKERS]
    try:

        def buffered_ticks() -> set[datetime]:
            said = [e for s in schedulers for e in s.events("buffered")]
            return {parse_tick_name(e["tick"]) for e in said}

        def buffered_and_run() -> list[TickRecord]:
            kept = buffered_ticks()
            done = [r for r in lab.records() if r.tick in kept and r.outcome in FINISHED]
            return done if len(done) >= BUFFERED_RUNS else []

        ran_late = eventually(buffered_and_run, WAIT)
        assert ran_late, (lab.records(), schedulers[0].lines[-20:], schedulers[1].lines[-20:])
        history = lab.operator("history", "--job", lab.job, "--limit", "6")
        assert history.returncode == 0, history.stderr
        print(f"\n$ lockctl history --job {lab.job} --limit 6\n{history.stdout}")  # for docs
        records = {r.tick: r for r in lab.records()}
        started = runs(lab)
        assert [t for t, n in Counter(r.tick for r in started).items() if n > 1] == []
        for before, ran in itertools.pairwise(started):
            previous = records.get(before.tick)
            if previous is None or previous.finished_at is None:
                continue  # pruned, or the last one still going: nothing to compare with
            assert ran.began > previous.finished_at, (before, ran, previous)  # never beside it
        for record in ran_late:
            ran = next(r for r in started if r.tick == record.tick)
            earlier = [r for r in started if r.began < ran.began]
            previous = records.get(earlier[-1].tick) if earlier else None
            assert previous is not None and previous.finished_at is not None, (record, earlier)
            assert ran.began - previous.finished_at < HAND_OVER, (ran, previous)
            assert record.outcome in FINISHED and record.worker in WORKERS
        # what "skip" would not do: a buffered tick started after its next tick's instant
        late_ticks = {r.tick for r in ran_late}
        assert any(r.began > r.tick + INTERVAL for r in started if r.tick in late_ticks), started
        skipped = [e for s in schedulers for e in s.events("skipped")]
        assert any("buffered already" in e["reason"] for e in skipped), skipped
        assert "buffered" in " ".join(e["event"] for s in schedulers for e in s.events())
    finally:
        for scheduler in schedulers:
            assert scheduler.stop() == 0, scheduler.lines
            assert not any("Traceback" in line for line in scheduler.lines), scheduler.lines
