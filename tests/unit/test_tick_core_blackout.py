"""The tick core and blackout windows, in virtual time on the in-memory store: a tick inside a
window is recorded `blackout` once by the fleet, never run, never missed, never caught up."""

from __future__ import annotations

from dataclasses import replace

from provision.blackouts import Blackout
from provision.ledger.records import TickRecord
from provision.outcomes import Outcome
from provision.schedule import parse_schedule
from provision.tick.core import CoreJob
from tests.unit.tick_fleet import KEYS, WORKERS, Counting, Fleet, at, every_10s

# Opens at 00:01:00 UTC each day and lasts 30 s: the fleet's ticks 60, 70 and 80 (START is
# midnight UTC); tick 90 is its end, so not in it.
WINDOW = Blackout("freeze", parse_schedule("1 0 * * *"), 30.0)
INSIDE = (at(60), at(70), at(80))


def windowed(workers: tuple[str, ...] = WORKERS, **timings: float) -> CoreJob:
    return replace(every_10s(workers, **timings), blackouts=(WINDOW,))


def test_ticks_in_a_window_are_recorded_blackout_once_and_none_runs() -> None:
    fleet = Fleet(job=windowed(), duration=1.0)
    stores = {worker: Counting(fleet.store) for worker in WORKERS}
    for worker in WORKERS:
        fleet.start(worker, store=stores[worker])
    fleet.run(150)
    for tick in INSIDE:
        assert fleet.ran(tick) == []
        record = fleet.record(tick)
        assert record is not None and record.outcome is Outcome.BLACKOUT
        assert record.window == "freeze"
    outside = [at(s) for s in (0, 10, 50, 90, 100, 140)]
    assert all(len(fleet.ran(tick)) == 1 for tick in outside)
    writes = sum(store.writes.count("record_unrun") for store in stores.values())
    assert writes == len(INSIDE)  # once each, by the first turn; the others read it
    assert not [r for r in fleet.store.read_ticks(KEYS) if r.outcome is Outcome.MISSED]
    for worker in WORKERS:  # every replica's turn at each of them says so
        said = fleet.said(worker, "blackout")
        assert [n.tick for _, n in said] == list(INSIDE)
        assert all(n.detail == "freeze" for _, n in said)


def test_ticks_of_a_window_nobody_saw_are_recorded_blackout_and_not_caught_up() -> None:
    job = windowed(("w1",), start_deadline=25.0)
    fleet = Fleet(workers=("w1",), job=replace(job, catchup=True), duration=1.0)
    fleet.store.record_unrun(KEYS, [TickRecord(at(40), Outcome.SUCCEEDED, worker="earlier")])
    fleet.run(95)  # every replica down through the window: 50 and 60..80 nobody ran
    fleet.start("w1")
    fleet.run(60)
    assert fleet.ran(at(80)) == []  # the newest closed tick is the window's: no catch-up
    assert fleet.said("w1", "catch-up") == []
    for tick in INSIDE:
        record = fleet.record(tick)
        assert record is not None and record.outcome is Outcome.BLACKOUT, tick
    missed = fleet.record(at(50))  # before the window: a miss as ever
    assert missed is not None and missed.outcome is Outcome.MISSED
    assert fleet.ran(at(90)) == ["w1"]


def test_the_same_outage_without_the_window_catches_tick_80_up() -> None:
    """The control of the test above: the window alone stops the catch-up."""
    job = replace(every_10s(("w1",), start_deadline=25.0), catchup=True)
    fleet = Fleet(workers=("w1",), job=job, duration=1.0)
    fleet.store.record_unrun(KEYS, [TickRecord(at(40), Outcome.SUCCEEDED, worker="earlier")])
    fleet.run(95)
    fleet.start("w1")
    fleet.run(60)
    assert fleet.ran(at(80)) == ["w1"]


def test_a_window_recorded_by_a_fate_look_when_the_turn_was_too_late() -> None:
    """A replica whose clock was held through the window's ticks: their fate looks record them
    `blackout`, not `missed`."""
    fleet = Fleet(workers=("w1",), job=windowed(("w1",)), duration=1.0)
    fleet.start("w1")
    fleet.run(55)
    fleet.clocks["w1"].paused = True
    fleet.run(40)
    fleet.clocks["w1"].resume()
    fleet.run(60)
    for tick in INSIDE:
        record = fleet.record(tick)
        assert record is not None and record.outcome is Outcome.BLACKOUT, tick
    assert fleet.ran_ticks().isdisjoint(INSIDE)
