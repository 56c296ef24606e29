"""overlap = "cancel" in the tick core, in virtual time over the in-memory Consul: at its turn
at the next tick, the replica running the job stops its run (TERM to the body, KILL after the
grace, as an aborted run), records it `cancelled`, releases the lock and claims the next tick
itself; the others' claims are refused while the lock is held. overlap = "skip" is today's."""

from __future__ import annotations

from dataclasses import replace

import pytest

from provision.ledger.records import TickRecord
from provision.notify.message import decided
from provision.outcomes import (
    FINISHED,
    OPERATOR_STOPS,
    POLICY_STOPS,
    SCHEDULER_METRIC_OUTCOMES,
    Outcome,
)
from provision.scheduler.report import note_events, record_outcome_label
from provision.tick.edge import Note, StopHow
from provision.tick.overlap import OverlapAction, overlap_action
from tests.unit.tick_fleet import WORKERS, Fleet, at, every_10s

GRACE = 5.0  # TIMINGS.kill_grace
TERM_TAKES = 0.5  # the fleet's body ends this long after TERMINATE, unless it ignores it


@pytest.mark.parametrize(
    ("policy", "busy", "stoppable", "action"),
    [
        ("skip", False, False, OverlapAction.TAKE),
        ("cancel", False, False, OverlapAction.TAKE),
        ("skip", True, False, OverlapAction.WAIT),
        ("skip", True, True, OverlapAction.WAIT),  # today's: the tick waits for the run's end
        ("cancel", True, True, OverlapAction.CANCEL),
        ("cancel", True, False, OverlapAction.WAIT),  # a claim in flight, a run told to end
    ],
)
def test_overlap_action(policy: str, busy: bool, stoppable: bool, action: OverlapAction) -> None:
    assert overlap_action(policy, busy, stoppable) is action


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
