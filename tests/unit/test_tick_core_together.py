"""The turns of several jobs at one instant (a burst of ticks): read together (read_turns) and
claimed together (claim_many), each then going on with its own answer, as it would alone."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from tick_fleet import START, TIMINGS, Body, at

from provision.consul import ConsulUnavailable
from provision.ledger.records import TickOutcome
from provision.schedule import parse_schedule
from provision.tick.clock import VirtualClock
from provision.tick.core import CoreJob, Identity, TickCore
from provision.tick.edge import Note
from provision.tick.memory import MemoryTickStore
from provision.tick.store import ClaimAnswer, ClaimCall, InvalidSession, JobKeys, TurnRead

WORKERS = ("w1", "w2", "w3")
JOBS = [
    CoreJob(
        JobKeys(f"job-{n}", f"jobs/job-{n}/.lock"), parse_schedule("@every 10s"), TIMINGS, WORKERS
    )
    for n in range(6)
]


class Recording:
    """A replica's store that keeps the size of each read_turns and claim_many it is asked,
    and can leave one claim_many unanswered (applied, then a client timeout) or answer its
    first claim InvalidSession (nothing applied)."""

    def __init__(self, store: MemoryTickStore) -> None:
        self.store = store
        self.reads: list[int] = []
        self.claims: list[int] = []
        self.lose_next_group = False
        self.forget_next_session = False

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    def read_turns(self, turns: Sequence[tuple[JobKeys, datetime]]) -> list[TurnRead]:
        self.reads.append(len(turns))
        return self.store.read_turns(turns)

    def claim_many(self, claims: Sequence[ClaimCall]) -> list[ClaimAnswer]:
        self.claims.append(len(claims))
        if self.forget_next_session:
            self.forget_next_session = False
            first: list[ClaimAnswer] = [InvalidSession("simulated: invalid session")]
            return first + self.store.claim_many(claims[1:])
        answers = self.store.claim_many(claims)
        if self.lose_next_group:
            self.lose_next_group = False
            raise ConsulUnavailable("simulated: no answer within 10s")
        return answers


class World:
    def __init__(self) -> None:
        self.clock = VirtualClock(START)
        self.store = MemoryTickStore(self.clock)
        self.stores = {worker: Recording(self.store) for worker in WORKERS}
        self.ran: list[tuple[str, datetime, str]] = []
        self.notes: list[tuple[str, Note]] = []
        for worker in WORKERS:
            self._start(worker)

    def _start(self, worker: str) -> None:
        def body(job: str, tick: datetime) -> Body:
            self.ran.append((job, tick, worker))
            return Body(self.clock, 2.0, False)

        def note(n: Note) -> None:
            self.notes.append((worker, n))

        store = self.stores[worker]
        TickCore(store, self.clock, Identity(worker), JOBS, body, note).start()  # type: ignore[arg-type]

    def runs_of(self, tick: datetime) -> dict[str, int]:
        counts = {job.name: 0 for job in JOBS}
        for job, t, _ in self.ran:
            if t == tick:
                counts[job] += 1
        return counts


def test_the_turns_of_one_instant_are_read_and_claimed_together_and_each_tick_runs_once() -> None:
    world = World()
    world.clock.advance(45)
    for n in range(1, 4):
        assert world.runs_of(at(10 * n)) == {job.name: 1 for job in JOBS}
        for job in JOBS:
            record = world.store.read_tick(job.keys, at(10 * n))[0]
            assert record is not None and record.outcome is TickOutcome.SUCCEEDED
    reads = [size for store in world.stores.values() for size in store.reads]
    claims = [size for store in world.stores.values() for size in store.claims]
    assert reads and max(reads) > 1  # several turns in one read
    assert claims and max(claims) > 1  # several claims sent together


def test_a_group_of_claims_left_unanswered_is_resolved_each_and_runs_nothing_twice() -> None:
    """The store applied every claim, then its answer was lost: each tick is read again, found
    claimed by this replica with no run under it, and completed interrupted; nothing ran."""
    world = World()
    world.clock.advance(5)  # every session made, no tick yet
    for store in world.stores.values():
        store.lose_next_group = True
    world.clock.advance(40)
    lost = [(who, n) for who, n in world.notes if n.kind == "unanswered"]
    assert lost, "no group went unanswered"
    keys = {job.name: job.keys for job in JOBS}
    for who, n in lost:
        assert n.tick is not None
        record = world.store.read_tick(keys[n.job], n.tick)[0]
        orphans = [
            m for w, m in world.notes if w == who and m.kind == "orphan" and m.tick == n.tick
        ]
        assert orphans, f"{who}: the unanswered claim of {n.job} at {n.tick} was not resolved"
        run = [r for r in world.ran if r[0] == n.job and r[1] == n.tick]
        assert run == []  # its body never started
        assert record is not None and record.outcome is TickOutcome.INTERRUPTED
    for n in range(1, 5):
        assert all(count <= 1 for count in world.runs_of(at(10 * n)).values())
    assert world.runs_of(at(40)) == {job.name: 1 for job in JOBS}  # after: as before


def test_a_claim_refused_for_a_forgotten_session_is_claimed_again_alone() -> None:
    world = World()
    world.clock.advance(5)
    for store in world.stores.values():
        store.forget_next_session = True
    world.clock.advance(40)
    gone = [n for _, n in world.notes if n.kind == "session-gone"]
    assert gone  # the session was dropped, and made again
    for n in range(1, 5):
        assert world.runs_of(at(10 * n)) == {job.name: 1 for job in JOBS}
