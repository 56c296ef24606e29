"""`lockctl abort` in the tick core, in virtual time over the in-memory Consul: every replica
hears the note; only the one running the run it names stops it (TERM to the body, KILL after
the grace, as a timed-out run), records it `aborted` with who and why, and releases the lock;
the next tick runs as usual; a note heard late stops nothing."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from provision.ledger.aborts import AbortNote
from provision.ledger.control import ControlNote
from provision.outcomes import Outcome
from provision.system.control_keys import abort_key
from provision.tick.edge import StopHow
from tests.unit.test_tick_core_retries import Replica
from tests.unit.test_tick_core_retries import job as retry_job
from tests.unit.tick_fleet import KEYS, WORKERS, Fleet, at, every_10s

GRACE = 5.0  # TIMINGS.kill_grace


def abort(fleet: Fleet, tick: datetime, session: str, abort_id: str = "a-1") -> AbortNote:
    """`lockctl abort`'s note aimed at the run of `tick` under `session`, written to the
    job's abort key and handed to every core (as each one's watch would)."""
    note = AbortNote(ControlNote("alice", fleet.clock.wall(), "stuck", id=abort_id), tick, session)
    fleet.store.put(abort_key(KEYS.name), note.encode())
    for core in fleet.cores.values():
        core.abort(KEYS.name, note)
    return note


def running(fleet: Fleet, tick: datetime) -> tuple[str, str]:
    """The worker running `tick` and its session, as `lockctl abort` reads them."""
    record = fleet.record(tick)
    assert record is not None and record.outcome is Outcome.RUNNING
    assert record.worker is not None and record.session is not None
    return record.worker, record.session


def test_only_the_replica_running_the_named_run_stops_it_and_records_who_and_why() -> None:
    fleet = Fleet(job=every_10s(), duration=8.0, ignores_term=True)
    for worker in WORKERS:
        fleet.start(worker)
    fleet.run(2)  # tick 0 runs on one replica until 8, and ignores SIGTERM
    worker, session = running(fleet, at(0))
    abort(fleet, at(0), session)
    fleet.run(GRACE + 1)
    [(_, _, body)] = [b for b in fleet.bodies if b[1] == at(0)]
    assert [how for _, how in body.told] == [StopHow.TERMINATE, StopHow.KILL]
    record = fleet.record(at(0))
    assert record is not None and record.outcome is Outcome.ABORTED
    assert (record.by, record.reason, record.worker) == ("alice", "stuck", worker)
    assert record.asked_at is not None and record.finished_at is not None
    assert [n.kind for _, n in fleet.said(worker, "aborted")] == ["aborted"]
    assert fleet.said(worker, "fenced") == []  # stopped as asked: the lock was never lost
    for other in WORKERS:
        if other != worker:
            assert fleet.said(other, "aborted") == []
            assert len(fleet.said(other, "abort")) == 1  # heard; nothing of it runs there
    fleet.run(4)  # tick 10: claimed and run as usual
    assert len(fleet.ran(at(10))) == 1
    fleet.run(10)
    later = fleet.record(at(10))
    assert later is not None and later.outcome is Outcome.SUCCEEDED


def test_a_note_heard_late_never_stops_a_later_run() -> None:
    fleet = Fleet(job=every_10s(), duration=4.0)
    for worker in WORKERS:
        fleet.start(worker)
    fleet.run(2)
    _, session = running(fleet, at(0))
    fleet.run(10)  # tick 0 ended at 4; tick 10 runs until 14
    abort(fleet, at(0), session)  # aimed at tick 0: heard after its end
    fleet.run(8)
    record = fleet.record(at(10))
    assert record is not None and record.outcome is Outcome.SUCCEEDED
    assert all(body.told == [] for _, _, body in fleet.bodies)
    earlier = fleet.record(at(0))
    assert earlier is not None and earlier.outcome is Outcome.SUCCEEDED


def test_a_note_heard_before_the_claims_answer_stops_the_run_it_names_at_its_start() -> None:
    """The watch's answer may come before the replica acts on its claim's answer: the note is
    kept, and the run it names is stopped as it starts."""
    fleet = Fleet(workers=("w1",), job=every_10s(workers=("w1",)), duration=3.0)
    fleet.start("w1")
    fleet.run(5)  # tick 0 ran; the replica's session lives on for tick 10
    first = fleet.record(at(0))
    assert first is not None and first.session is not None
    abort(fleet, at(10), first.session)  # aimed at tick 10, under that session, before it
    fleet.run(7)
    record = fleet.record(at(10))
    assert record is not None and record.outcome is Outcome.ABORTED
    assert first.outcome is Outcome.SUCCEEDED


def test_an_aborted_run_is_not_retried() -> None:
    fleet = Fleet(workers=("w1",), job=every_10s(workers=("w1",), retries=2), duration=None)
    fleet.start("w1")
    fleet.run(2)
    _, session = running(fleet, at(0))
    abort(fleet, at(0), session)
    fleet.run(6)
    record = fleet.record(at(0))
    assert record is not None and record.outcome is Outcome.ABORTED
    assert len(fleet.ran(at(0))) == 1  # the one attempt: no retry after the abort


def test_an_abort_while_a_retry_is_waited_for_cuts_the_retries_and_records_aborted() -> None:
    replica = Replica(retry_job(retries=3, retry_delay=6.0), statuses=[1] * 10)
    replica.clock.advance(2)  # the first attempt failed at 0.5; the retry is due at 6.5
    (first,) = replica.of(at(0))
    assert first.run is not None
    note = AbortNote(ControlNote("bob", replica.clock.wall(), None, id="a-2"), at(0), "")
    replica.core.abort(KEYS.name, replace(note, session=first.run.session))
    replica.clock.advance(6)  # past 6.5, when the retry was due; before tick 10
    assert len(replica.of(at(0))) == 1  # the retry was not made
    record = replica.record(at(0))
    assert record is not None
    assert (record.outcome, record.by, record.attempts, record.retries_cut) == (
        Outcome.ABORTED,
        "bob",
        (1,),
        "aborted",
    )
    assert replica.store.watch_lock(KEYS, 0, 0)[0] is None  # released at once
