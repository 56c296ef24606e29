"""`lockctl schedule` under faults (issue 15, item 6): three schedulers on three agents in network
namespaces (root; part of the default run, as CI has root), a short job (1 s) and a long one
(8 s, it outlasts its `@every 5s` interval), both the oracle's process tree that tells the oracle
its LockIndex and its tick.

One test per fault, which hits the scheduler whose long job runs (bench/faultlab/scheduler.py):
no two holders' accepted writes overlap, the resumed stale job of `sigstop` is rejected by the
LockIndex check, no process of a job outlives its bound, the job runs again within 2 x TTL +
LockDelay + one interval + 5 s, nothing is left in Consul; and per tick, from the ledger (lockctl's
own Ledger) and the oracle: run at most once, run or recorded missed, missed only inside the
takeover bound around the fault (or while the long job's previous run still went on).

Then the soak, the issue's "done means": the short job for two minutes, every tick run exactly
once with no overlap; SIGTERM of the active replica lets another run the very next tick; kill -9
of the active one loses only ticks inside the takeover bound, and they are recorded missed.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest

from bench.faultlab import scheduler
from bench.faultlab.harness import FaultLab, fault_lab
from bench.faultlab.job import ROLES
from bench.faultlab.oracle import Holder, Section
from bench.faultlab.scheduler import SchedulerResult
from bench.faultlab.ticks import Excuse, TickVerdict, judge_ticks
from provision.ledger.records import TickOutcome, TickRecord, tick_name

pytestmark = pytest.mark.faults

SOAK_SECONDS = 120.0


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultLab]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    with fault_lab(tmp_path_factory.mktemp("schedfaults")) as started:
        yield started


def _explain(result: SchedulerResult) -> str:
    return f"{result.scenario} (holder {result.holder}, job {result.job}): {result.problems()}"


@pytest.mark.parametrize("scenario", scheduler.SCENARIOS)
def test_scheduler_keeps_each_tick_once_under(lab: FaultLab, scenario: str) -> None:
    result = scheduler.run_scenario(lab, scenario)
    print(result.describe())
    assert result.problems() == [], _explain(result)
    assert result.overlaps == 0 and result.twice == 0
    assert result.survivors == 0, result.survivors_seen
    assert result.takeover is not None and result.takeover <= result.bound
    holders = lab.oracle.holders(result.job)
    assert holders and all(len(h.sections) == len(ROLES) for h in holders)
    assert all(h.tick is not None for h in holders), "every run knew its tick"
    long_job = next(v for v in result.verdicts if v.job == result.job)
    assert long_job.ran >= 2 and long_job.missed >= 1, (
        "the long job ran before and after the fault, and missed ticks (to the fault, or to its "
        "own overlap) were recorded"
    )
    if scenario == "sigstop":
        assert result.rejections >= 1, "the fence must have stopped the resumed stale job"
    if scenario == "cut-host":
        assert result.detection is not None and result.detection_bound is not None
        assert result.takeover <= result.detection_bound
    live = [code for codes in result.runner_exits.values() for code in codes if code != -9]
    assert live and all(code == 0 for code in live), result.runner_exits


def test_scheduler_soak_every_tick_once_with_a_handover_and_a_kill9(lab: FaultLab) -> None:
    result = scheduler.run_soak(lab, SOAK_SECONDS)
    print(result.describe())
    assert result.problems() == [], _explain(result)
    (verdict,) = result.verdicts
    assert verdict.twice == [] and verdict.unrecorded == [] and verdict.unexcused == []
    assert result.overlaps == 0 and result.survivors == 0
    assert result.handover_ok, result.handover
    assert verdict.ran >= SOAK_SECONDS / scheduler.EVERY - 8, verdict
    # kill -9: the lost ticks are few, each recorded missed, all inside the takeover bound
    assert verdict.missed <= scheduler.TAKEOVER_BOUND / scheduler.EVERY, verdict.missed_ticks
    assert verdict.checked == verdict.ran + verdict.missed


# -- the tick oracle itself (no cluster): the checks above are only as good as these ------------
T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=timezone.utc)


def _at(n: int) -> datetime:
    return T0 + timedelta(seconds=scheduler.EVERY * n)


def _ran(n: int, worker: str = "w1", index: int = 1, seconds: float = 1.0) -> TickRecord:
    done = _at(n) + timedelta(seconds=seconds)
    return TickRecord(_at(n), TickOutcome.SUCCEEDED, worker, lock_index=index, finished_at=done)


def _missed(n: int) -> TickRecord:
    return TickRecord(_at(n), TickOutcome.MISSED, "w2", finished_at=_at(n + 2))


def _holder(n: int, worker: str = "w1", index: int = 1) -> Holder:
    section = Section("j", worker, "s", index, 1, uuid.uuid4().hex, "main", 0.0, 0.0)
    section.tick = tick_name(_at(n))
    return Holder(section.run, (section,))


def _judge(records: list[TickRecord], holders: list[Holder], excuses: list[Excuse]) -> TickVerdict:
    return judge_ticks("j", scheduler.SCHEDULE, holders, records, excuses)


def test_tick_oracle_passes_a_clean_run_and_excused_misses() -> None:
    records = [_ran(0), _missed(1), _missed(2), _ran(3, "w2", 2), _ran(4, "w2", 3)]
    holders = [_holder(0), _holder(3, "w2", 2), _holder(4, "w2", 3)]
    excuse = Excuse(_at(1), _at(2), "kill -9")
    verdict = _judge(records, holders, [excuse])
    assert verdict.problems() == []
    assert (verdict.checked, verdict.ran, verdict.missed) == (5, 3, 2)


def test_tick_oracle_catches_twice_unexcused_unrecorded_and_unwitnessed() -> None:
    twice = _judge([_ran(0), _ran(1)], [_holder(0), _holder(1), _holder(1, "w2", 2)], [])
    assert twice.twice == [tick_name(_at(1))]
    unexcused = _judge(
        [_ran(0), _missed(1), _ran(2, index=2)], [_holder(0), _holder(2, index=2)], []
    )
    assert unexcused.unexcused == [tick_name(_at(1))], "a miss no fault explains"
    gap = _judge([_ran(0), _ran(4, index=2)], [_holder(0), _holder(4, index=2)], [])
    # tick 3's window (+ MISSED_GRACE + FATE_SLACK) had not closed when the last run finished
    assert gap.unrecorded == [tick_name(_at(1)), tick_name(_at(2))]
    phantom = _judge([_ran(0), _ran(1, index=2)], [_holder(0)], [])
    assert phantom.unwitnessed == [f"{tick_name(_at(1))} (succeeded, no holder)"]
    wrong = _judge([_ran(0, index=1)], [_holder(0, index=7)], [])
    assert len(wrong.unwitnessed) == 1, "the holder's LockIndex is not the record's"


def test_tick_oracle_excuses_the_ticks_a_long_run_overlaps() -> None:
    long_run = _ran(0, seconds=scheduler.LONG)  # 8 s: tick 1 (5 s) passed while it ran
    verdict = _judge(
        [long_run, _missed(1), _ran(2, index=2)], [_holder(0), _holder(2, index=2)], []
    )
    assert verdict.problems() == [] and verdict.missed_by_overlap == 1


def test_tick_oracle_catches_a_run_killed_by_no_fence_of_its_own() -> None:
    """A run that ends `failed` was killed by something other than its lock (job.py exits 0)."""
    killed = TickRecord(_at(1), TickOutcome.FAILED, "w1", lock_index=2, exit_status=137)
    verdict = _judge([_ran(0), killed], [_holder(0), _holder(1, index=2)], [])
    assert verdict.failed == [f"{tick_name(_at(1))} (exit 137)"] and verdict.problems()
