"""The overlap policies in the tick core, in virtual time over the in-memory Consul.

overlap = "cancel": at its turn at the next tick, the replica running the job stops its run
(TERM to the body, KILL after the grace, as an aborted run), records it `cancelled`, releases
the lock and claims the next tick itself; the others' claims are refused while the lock is held.
overlap = "buffer_one": at that turn the tick is recorded `buffered` and run over that record as
soon as the run ends (by the holder, or by another replica once the lock is free), within its
start deadline; a tick meanwhile is skipped. overlap = "skip" is the default."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from provision.ledger.records import TickRecord
from provision.ledger.turns import claim_order
from provision.notify.message import decided
from provision.outcomes import (
    FINISHED,
    OPERATOR_STOPS,
    POLICY_STOPS,
    SCHEDULER_METRIC_OUTCOMES,
    Outcome,
)
from provision.scheduler.report import note_events, record_outcome_label, tick_outcome
from provision.tick.edge import Note, StopHow
from provision.tick.overlap import Busy, OverlapAction, overlap_action
from tests.unit.tick_fleet import KEYS, WORKERS, Fleet, at, every_10s

KEYS_NAME = KEYS.name
TIMINGS_DEADLINE = 30.0  # TIMINGS.start_deadline

GRACE = 5.0  # TIMINGS.kill_grace
TERM_TAKES = 0.5  # the fleet's body ends this long after TERMINATE, unless it ignores it


@pytest.mark.parametrize(
    ("policy", "busy", "action"),
    [
        ("skip", Busy(), OverlapAction.TAKE),
        ("cancel", Busy(), OverlapAction.TAKE),
        ("buffer_one", Busy(), OverlapAction.TAKE),
        ("buffer_one", Busy(buffered=True), OverlapAction.TAKE),  # kept, the job free: a turn
        ("skip", Busy(True), OverlapAction.WAIT),
        ("skip", Busy(True, True), OverlapAction.WAIT),  # the tick waits for the run's end
        ("skip", Busy(True, True, True), OverlapAction.WAIT),
        ("cancel", Busy(True, True), OverlapAction.CANCEL),
        ("cancel", Busy(True, False), OverlapAction.WAIT),  # a claim in flight, a run told to end
        ("buffer_one", Busy(True, True), OverlapAction.BUFFER),
        ("buffer_one", Busy(True, False), OverlapAction.BUFFER),  # a claim in flight
        ("buffer_one", Busy(True, True, True), OverlapAction.SKIP),  # one buffered at most
        ("buffer_one", Busy(True, False, True), OverlapAction.SKIP),
    ],
)
def test_overlap_action(policy: str, busy: Busy, action: OverlapAction) -> None:
    assert overlap_action(policy, busy) is action


def test_cancelled_is_a_finished_run_stopped_by_policy_counted_and_never_notified() -> None:
    assert Outcome.CANCELLED in FINISHED and Outcome.CANCELLED in POLICY_STOPS
    assert Outcome.CANCELLED not in OPERATOR_STOPS
    assert record_outcome_label(Outcome.CANCELLED) == "cancelled"  # not `ran`: no failure
    assert "cancelled" in SCHEDULER_METRIC_OUTCOMES
    record = TickRecord(at(0), Outcome.CANCELLED, worker="w1", exit_status=-15)
    assert decided(Note("completed", "report", at(0), "cancelled", record)) is None  # no page
    said = note_events(Note("cancelled", "report", at(0), "tick 2026-01-01T00:00:10Z came"))
    assert said == [
        (
            "cancelled",
            {
                "tick": "2026-01-01T00:00:00Z",
                "session": None,
                "reason": "tick 2026-01-01T00:00:10Z came",
            },
        )
    ]


def cancelling(workers: tuple[str, ...], ignores_term: bool) -> Fleet:
    """A job every 10 s whose body runs 25 s (it outlasts two intervals), overlap = "cancel"."""
    job = replace(every_10s(workers), overlap="cancel")
    fleet = Fleet(job=job, workers=workers, duration=25.0, ignores_term=ignores_term)
    for worker in workers:
        fleet.start(worker)
    return fleet


@pytest.mark.parametrize("replicas", [2, 3])
@pytest.mark.parametrize("ignores_term", [False, True])
def test_cancel_stops_the_run_records_it_cancelled_and_the_holder_runs_the_next_tick(
    replicas: int, ignores_term: bool
) -> None:
    workers = WORKERS[:replicas]
    fleet = cancelling(workers, ignores_term)
    fleet.run(48)  # ticks 0, 10, 20, 30 cancelled by their next; tick 40 runs
    told = [StopHow.TERMINATE, StopHow.KILL] if ignores_term else [StopHow.TERMINATE]
    for tick in (0, 10, 20, 30):
        (holder,) = fleet.ran(at(tick))  # run once
        record = fleet.record(at(tick))
        assert record is not None and record.outcome is Outcome.CANCELLED, tick
        assert record.worker == holder and record.finished_at is not None
        [(_, _, body)] = [b for b in fleet.bodies if b[1] == at(tick)]
        assert [how for _, how in body.told] == told
        assert body.ended_at is not None
        assert fleet.ran(at(tick + 10)) == [holder]  # the next tick: once, by the holder...
        [(_, _, later)] = [b for b in fleet.bodies if b[1] == at(tick + 10)]
        assert later.started_at >= body.ended_at  # ...never beside the run it cancelled
        stopped_for = GRACE if ignores_term else TERM_TAKES
        first_told, _ = body.told[0]
        assert body.ended_at - first_told <= stopped_for + 1e-6
    for worker in workers:
        assert fleet.said(worker, "fenced") == []  # stopped as asked: the lock was never lost
        assert fleet.said(worker, "missed") == []
    cancelled = [n for w in workers for _, n in fleet.said(w, "cancelled")]
    assert sorted(n.tick for n in cancelled) == [at(t) for t in (0, 10, 20, 30)]
    assert fleet.record(at(40)) is not None


def test_skip_lets_the_run_go_on_and_the_next_tick_waits_for_its_end() -> None:
    """The same job with overlap = "skip" (the default): nothing is stopped; tick 10 runs on
    the holder when tick 0 ends at 15, within its window; the tick that passed whole is
    skipped, as before the policy existed."""
    fleet = Fleet(job=every_10s(), duration=15.0)
    for worker in WORKERS:
        fleet.start(worker)
    fleet.run(28)
    assert all(body.told == [] for _, _, body in fleet.bodies)
    first = fleet.record(at(0))
    assert first is not None and first.outcome is Outcome.SUCCEEDED
    (holder,) = fleet.ran(at(0))
    assert fleet.ran(at(10)) == [holder]
    [(_, _, body)] = [b for b in fleet.bodies if b[1] == at(10)]
    assert body.started_at == pytest.approx(15.0, abs=0.5)
    assert [n for w in WORKERS for _, n in fleet.said(w, "cancelled")] == []


def test_a_cancelled_run_is_not_retried() -> None:
    job = replace(every_10s(("w1",), retries=2, retry_on_timeout=True), overlap="cancel")
    fleet = Fleet(job=job, workers=("w1",), duration=None)
    fleet.start("w1")
    fleet.run(13)
    record = fleet.record(at(0))
    assert record is not None and record.outcome is Outcome.CANCELLED
    assert len(fleet.ran(at(0))) == 1  # no retry after the cancel, even with retry_on_timeout
    assert fleet.ran(at(10)) == ["w1"]


def buffering(duration: float | None, **timings: float) -> Fleet:
    """A job every 10 s, overlap = "buffer_one", on three replicas."""
    job = replace(every_10s(**timings), overlap="buffer_one")
    fleet = Fleet(job=job, duration=duration)
    for worker in WORKERS:
        fleet.start(worker)
    return fleet


def test_buffer_one_runs_the_tick_when_the_run_before_it_ends_and_skips_one_meanwhile() -> None:
    """Runs of 13.3 s every 10 s: tick 0 runs 0-13.3; tick 10 comes while it runs: recorded
    `buffered`, run at 13.3 over that record; each later run starts as the one before it ends,
    and a tick that comes while one is buffered already is skipped (one at most), recorded
    `missed` once its window closed. Never two runs at once, never a tick twice."""
    fleet = buffering(13.3)
    fleet.run(11)
    kept = fleet.record(at(10))
    assert kept is not None and kept.outcome is Outcome.BUFFERED
    (holder,) = fleet.ran(at(0))
    assert kept.worker == holder
    fleet.run(90)
    runs = sorted((body.started_at, body.ended_at, tick) for _, tick, body in fleet.bodies)
    assert [tick for _, _, tick in runs] == [at(t) for t in (0, 10, 20, 30, 40, 60, 70, 80)]
    assert all(fleet.ran(tick) == [holder] for _, _, tick in runs)  # once each, by the holder
    for (_, ended, _), (started, _, _) in itertools.pairwise(runs):
        assert started == pytest.approx(ended, abs=1e-6)  # as the run before it ended
    for tick in (10, 20, 30, 40):
        record = fleet.record(at(tick))
        assert record is not None and record.outcome is Outcome.SUCCEEDED, tick
        assert (
            record.catchup is None and record.start_lag is not None and record.start_lag >= 3
        )  # Date: whole seconds
    for tick in (50,):
        record = fleet.record(at(tick))
        assert record is not None and record.outcome is Outcome.MISSED, tick
    said = [n.tick for _, n in fleet.said(holder, "buffered")]
    assert said == [at(t) for t in (10, 20, 30, 40, 60, 70, 80, 100)]
    skipped = [n.detail for _, n in fleet.said(holder, "skipped") if n.tick == at(50)]
    assert skipped == ["tick 2026-01-01T00:00:40Z is buffered already"]


def test_a_newer_tick_claimed_as_the_lock_frees_goes_first_and_the_buffered_one_after_it() -> None:
    """Runs of 14 s: the run of tick 20 ends at 42, the instant another replica's turn at tick
    40 claims (the lock free). Tick 40 runs first; tick 30, buffered, runs after it over its
    record, within its start deadline: each once, never two at once, none left buffered."""
    fleet = buffering(14.0)
    fleet.run(100)
    runs = sorted((body.started_at, body.ended_at, tick) for _, tick, body in fleet.bodies)
    ticks = [tick for _, _, tick in runs]
    assert len(ticks) == len(set(ticks))  # never a tick twice
    assert ticks.index(at(40)) < ticks.index(at(30))  # the race this test is about
    for (_, ended, _), (started, _, _) in itertools.pairwise(runs):
        assert ended is not None and started >= ended  # never beside the run before it
    thirty = fleet.record(at(30))
    assert thirty is not None and thirty.outcome is Outcome.SUCCEEDED
    assert thirty.start_lag is not None and thirty.start_lag <= TIMINGS_DEADLINE
    for second in range(0, 70, 10):
        record = fleet.record(at(second))
        assert record is not None and record.outcome is not Outcome.BUFFERED, second


def test_a_buffered_tick_past_its_start_deadline_is_recorded_missed_once() -> None:
    """A run of 45 s with a start deadline of 20 s: tick 10, buffered, cannot start before 45,
    past 10 + 20: recorded `missed` over its `buffered` record, and never run."""
    fleet = buffering(45.0, start_deadline=20.0)
    fleet.run(50)
    record = fleet.record(at(10))
    assert record is not None and record.outcome is Outcome.MISSED
    assert fleet.ran(at(10)) == []
    missed = [n for w in WORKERS for _, n in fleet.said(w, "missed") if n.tick == at(10)]
    assert len(missed) == 1


def test_a_buffered_tick_is_run_by_another_replica_when_its_holder_is_gone() -> None:
    """The holder stops answering (paused) while tick 0 runs and tick 10 is buffered: its
    session ends (TTL, then LockDelay), and another replica, which read tick 10 `buffered` at
    its turn, claims it over that record once the lock is free, within its deadline: once."""
    fleet = buffering(None, start_deadline=120.0)
    holder = claim_order(KEYS_NAME, at(0), WORKERS)[0]
    fleet.run(12)
    kept = fleet.record(at(10))
    assert kept is not None and kept.outcome is Outcome.BUFFERED and kept.worker == holder
    fleet.clocks[holder].paused = True
    fleet.run(80)
    ran = fleet.ran(at(10))
    assert len(ran) == 1 and ran[0] != holder
    record = fleet.record(at(10))
    assert record is not None and record.worker == ran[0]
    assert record.outcome is Outcome.RUNNING  # the body never ends on its own
    [(_, _, body)] = [b for b in fleet.bodies if b[1] == at(10)]
    assert body.run is not None and body.run.lock_index == 2  # the lock changed hands once


def test_a_stopped_holder_leaves_its_buffered_tick_to_the_others() -> None:
    """SIGTERM to the holder while tick 0 runs and tick 10 is buffered: its run is stopped,
    completed and released; another replica runs tick 10 over its record, once."""
    fleet = buffering(25.0)
    holder = claim_order(KEYS_NAME, at(0), WORKERS)[0]
    fleet.run(12)
    fleet.cores[holder].stop()
    fleet.run(30)
    ran = fleet.ran(at(10))
    assert len(ran) == 1 and ran[0] != holder
    first = fleet.record(at(0))
    assert first is not None and first.outcome is Outcome.INTERRUPTED
    record = fleet.record(at(10))
    assert record is not None and record.outcome is Outcome.SUCCEEDED


def test_buffered_is_a_ledger_word_counted_and_said() -> None:
    assert Outcome.BUFFERED not in FINISHED
    assert "buffered" in SCHEDULER_METRIC_OUTCOMES
    said = note_events(Note("buffered", "report", at(10), "tick 2026-01-01T00:00:00Z runs here"))
    assert said == [
        (
            "buffered",
            {"tick": "2026-01-01T00:00:10Z", "reason": "tick 2026-01-01T00:00:00Z runs here"},
        )
    ]
    assert tick_outcome(Note("buffered", "report", at(10))) == "buffered"
