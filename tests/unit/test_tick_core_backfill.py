"""The tick core running an operator's backfill (`lockctl backfill`), in virtual time against the
in-memory Consul: every replica hears it, and each of its ticks that nobody ran runs once, at its
own instant, recorded as backfill; a tick that ran is not run again, nor is a backfill heard
again, nor an old one; a tick beyond a pruned ledger is never run."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from tick_fleet import KEYS, Fleet, at, every_10s

from provision.ledger.backfill import BACKFILL_WINDOW, BackfillNote
from provision.ledger.records import TickOutcome, TickRecord
from provision.system.control_keys import backfill_key

TWO = ("w1", "w2")


def backfill(fleet: Fleet, seconds: float, ticks: list[float], backfill_id: str = "b-1") -> None:
    """`lockctl backfill`'s note at `seconds`, written and handed to every core (as each one's
    watch would: all hear it)."""
    asked = at(seconds) + timedelta(milliseconds=250)
    note = BackfillNote("alice", asked, tuple(at(s) for s in ticks), "outage", backfill_id)
    fleet.store.put(backfill_key(KEYS.name), note.encode())
    for core in fleet.cores.values():
        core.backfill(KEYS.name, note)


def recorded(fleet: Fleet, seconds: float, outcome: TickOutcome) -> None:
    fleet.store.put(KEYS.tick(at(seconds)), TickRecord(at(seconds), outcome, worker="w9").encode())


def two_replicas(**job: int) -> Fleet:
    fleet = Fleet(workers=TWO, job=replace(every_10s(workers=TWO), **job), duration=1.0)
    recorded(fleet, -60, TickOutcome.SUCCEEDED)  # the ledger's oldest: the job existed then
    recorded(fleet, -40, TickOutcome.SUCCEEDED)  # ran: a backfill skips it
    recorded(fleet, -30, TickOutcome.MISSED)  # nobody ran it: run
    recorded(fleet, -20, TickOutcome.PAUSED)  # held by a pause: run, the operator asks for it
    for worker in TWO:
        fleet.start(worker)
    fleet.run(3)
    return fleet


def test_each_tick_nobody_ran_runs_once_across_two_replicas_recorded_as_backfill() -> None:
    fleet = two_replicas()
    backfill(fleet, 3, [-50, -40, -30, -20, -10])
    fleet.run(20)
    for seconds in (-50, -30, -20, -10):
        assert len(fleet.ran(at(seconds))) == 1, seconds
        record = fleet.record(at(seconds))
        assert record is not None and record.outcome is TickOutcome.SUCCEEDED
        assert (record.backfill, record.by, record.reason) == ("b-1", "alice", "outage")
    assert fleet.ran(at(-40)) == []
    assert fleet.record(at(-40)) == TickRecord(
        at(-40),
        TickOutcome.SUCCEEDED,
        worker="w9",
        modify_index=fleet.record(at(-40)).modify_index,  # type: ignore[union-attr]
    )
    backfill(fleet, 23, [-50, -40, -30, -20, -10])  # heard again (the watch answers again)
    fleet.run(10)
    assert all(len(fleet.ran(at(s))) == 1 for s in (-50, -30, -20, -10))


def test_the_scheduled_ticks_still_run_once_each_during_a_backfill() -> None:
    fleet = two_replicas()
    backfill(fleet, 3, [-50, -30, -20, -10])
    fleet.run(30)
    for seconds in (10, 20, 30):
        assert len(fleet.ran(at(seconds))) == 1, seconds
        record = fleet.record(at(seconds))
        assert record is not None and record.backfill is None


def test_a_backfill_older_than_its_window_is_not_run() -> None:
    fleet = two_replicas()
    backfill(fleet, 3 - BACKFILL_WINDOW - 60, [-50, -10])
    fleet.run(20)
    assert fleet.ran(at(-50)) == fleet.ran(at(-10)) == []


def test_a_tick_older_than_a_pruned_ledger_is_never_run_by_a_backfill() -> None:
    fleet = two_replicas(history_limit=4)  # retention may have pruned the records older ones
    backfill(fleet, 3, [-70, -50])
    fleet.run(20)
    assert fleet.ran(at(-70)) == []
    assert len(fleet.ran(at(-50))) == 1  # within the ledger: nobody ran it
    skipped = [n.detail for _, _, n in fleet.notes if n.kind == "skipped" and n.tick == at(-70)]
    assert skipped and all("oldest record" in detail for detail in skipped)


def test_a_backfill_waits_while_a_run_holds_the_lock_and_the_scheduled_ticks_go_on() -> None:
    fleet = Fleet(workers=TWO, job=every_10s(workers=TWO), duration=6.0)
    recorded(fleet, -60, TickOutcome.SUCCEEDED)
    for worker in TWO:
        fleet.start(worker)
    fleet.run(1)  # one replica runs tick 0 until 6: the other's claims find the lock held
    backfill(fleet, 1, [-50, -30])
    fleet.run(4)
    assert fleet.ran(at(-50)) == []  # not beside tick 0's run: one run of a job at a time
    refused = [n for _, _, n in fleet.notes if n.tick == at(-50) and n.kind == "skipped"]
    assert refused and {n.detail for n in refused} == {"lock held"}  # tried again, later
    fleet.run(40)
    for seconds in (-50, -30):
        assert len(fleet.ran(at(seconds))) == 1, seconds
        record = fleet.record(at(seconds))
        assert record is not None and record.backfill == "b-1"
    for seconds in (0, 10, 20, 30, 40):  # each scheduled tick once, none lost to the backfill
        assert len(fleet.ran(at(seconds))) == 1, seconds
