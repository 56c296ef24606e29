"""Keyed jobs in the tick core, in virtual time over the in-memory Consul: one job's keys are
units of their own on one core (each its lock and ledger, under the job's name): each key's
tick runs once, beside the other keys'; a trigger of the job runs once per key; an abort that
names a key stops that key's run only, and one without a key stops none of them."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from provision.keyed import keyed_lock_key
from provision.ledger.aborts import AbortNote, decode_abort
from provision.ledger.control import ControlNote
from provision.outcomes import Outcome
from provision.tick.clock import VirtualClock
from provision.tick.core import CoreJob, Identity, TickCore
from provision.tick.edge import Note
from provision.tick.memory import MemoryTickStore
from provision.tick.store import JobKeys
from tests.unit.tick_fleet import KEYS, START, Body, at, every_10s

TENANTS = ("tenant-1", "tenant-2")


def keyed(job: CoreJob, key: str) -> CoreJob:
    lock = keyed_lock_key(job.keys.lock_key, key)
    return replace(job, keys=JobKeys(job.keys.name, lock, key))


class OneReplica:
    """One core running the keys of a job every 10 s (bodies of `duration` seconds)."""

    def __init__(self, duration: float) -> None:
        self.clock = VirtualClock(START)
        self.store = MemoryTickStore(self.clock)
        self.bodies: list[tuple[str, datetime, Body]] = []
        self.notes: list[Note] = []
        self.jobs = [keyed(every_10s(("w1",)), key) for key in TENANTS]

        def body(unit: str, tick: datetime) -> Body:
            made = Body(self.clock, duration, False)
            self.bodies.append((unit, tick, made))
            return made

        identity = Identity("w1")
        self.core = TickCore(self.store, self.clock, identity, self.jobs, body, self.notes.append)
        self.core.start()

    def record(self, key: str, tick: datetime) -> Outcome | None:
        job = next(job for job in self.jobs if job.keys.key == key)
        found = self.store.read_tick(job.keys, tick)[0]
        return None if found is None else found.outcome

    def ran(self, tick: datetime) -> list[str]:
        return sorted(unit for unit, t, _ in self.bodies if t == tick)


def test_each_key_runs_each_tick_once_beside_the_other_keys() -> None:
    replica = OneReplica(duration=5.0)
    replica.clock.advance(25)
    for second in (0, 10, 20):
        assert replica.ran(at(second)) == ["report/tenant-1", "report/tenant-2"]
        for key in TENANTS:
            assert replica.record(key, at(second)) is Outcome.SUCCEEDED
    # at once: both keys' bodies of a tick started before either ended
    first = [body for _, tick, body in replica.bodies if tick == at(0)]
    assert max(body.started_at for body in first) < min(body.ended_at or 99 for body in first)
    assert replica.store.read_tick(KEYS, at(0))[0] is None  # the job's own ledger: untouched


def test_a_trigger_of_the_job_runs_once_per_key() -> None:
    replica = OneReplica(duration=1.0)
    replica.clock.advance(3)
    note = ControlNote("alice", replica.clock.wall(), "rerun", id="t-1")
    replica.core.trigger(KEYS.name, note)
    replica.core.trigger(KEYS.name, note)  # heard again: nothing more
    replica.clock.advance(3)
    manual = [unit for unit, tick, _ in replica.bodies if tick.microsecond or tick == note.at]
    assert sorted(manual) == ["report/tenant-1", "report/tenant-2"]


def test_an_abort_naming_a_key_stops_that_keys_run_only() -> None:
    replica = OneReplica(duration=30.0)
    replica.clock.advance(2)
    held = {run.claimed.keys.key: run for run in replica.core.runs}
    assert sorted(held) == list(TENANTS)
    session = held["tenant-1"].claimed.session
    assert held["tenant-2"].claimed.session == session  # one replica, one session for both
    asked = ControlNote("alice", replica.clock.wall(), "stuck", id="a-1")
    replica.core.abort(KEYS.name, AbortNote(asked, at(0), session))  # no key: the job's own run
    replica.clock.advance(1)
    assert sorted(run.claimed.keys.key or "" for run in replica.core.runs) == list(TENANTS)
    replica.core.abort(KEYS.name, AbortNote(asked, at(0), session, "tenant-2"))
    replica.clock.advance(8)  # the body told at once, SIGKILLed after kill_grace at the latest
    assert replica.record("tenant-2", at(0)) is Outcome.ABORTED
    assert replica.record("tenant-1", at(0)) is Outcome.RUNNING  # goes on


def test_an_abort_note_says_its_key_and_a_note_naming_no_key_lockctl_runs_stops_nothing() -> None:
    asked = ControlNote("alice", START, "stuck", id="a-1")
    note = AbortNote(asked, at(0), "s-1", "tenant-2")
    assert decode_abort(note.encode()) == note
    unkeyed = AbortNote(asked, at(0), "s-1")
    assert b'"key"' not in unkeyed.encode() and decode_abort(unkeyed.encode()) == unkeyed
    forged = note.encode().replace(b'"tenant-2"', b'"../x"')
    assert decode_abort(forged) is None
