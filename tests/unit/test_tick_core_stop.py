"""A stop with many runs under way, in virtual time: every run is told to end, and once its
body has ended its completion goes with the others' (TickStore.complete_many: a transaction per
32 on Consul), not one transaction each, in line; the sessions go last. At 1,000 jobs a stop
ends hundreds of runs at once, and a completion each made it seconds long."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime

from provision.consul import ConsulUnavailable
from provision.ledger.records import TickOutcome, TickRecord
from provision.ledger.store import Claim, Completion
from provision.schedule import parse_schedule
from provision.tick.clock import VirtualClock
from provision.tick.core import CoreJob, Identity, TickCore
from provision.tick.memory import MemoryTickStore
from provision.tick.store import (
    ClaimAnswer,
    ClaimCall,
    ClaimTerms,
    CompleteCall,
    JobKeys,
    TickStore,
)
from tests.unit.tick_fleet import START, TIMINGS, Body, Fleet, every_10s

JOBS = 100  # every one of them runs when the stop comes
PER_TRANSACTION = 32  # completions in one transaction (64 operations: the record, the unlock)


class Watched:
    """The store as the replica reaches it: each completion's round trip counted as Consul
    would count its transactions, with whether the run's body had ended when it was sent; and
    when the sessions were destroyed."""

    def __init__(self, store: MemoryTickStore, clock: VirtualClock) -> None:
        self.store, self.clock = store, clock
        self.bodies: dict[str, Body] = {}
        self.transactions = 0
        self.completed: list[tuple[float, str, bool]] = []  # (when, job, its body had ended)
        self.destroyed: list[float] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    def _sent(self, job: JobKeys) -> None:
        ended = self.bodies[job.name].end is not None
        self.completed.append((self.clock.monotonic(), job.name, ended))

    def complete(
        self, job: JobKeys, record: TickRecord, session_id: str, *, release: bool
    ) -> Completion:
        self.transactions += 1
        self._sent(job)
        return self.store.complete(job, record, session_id, release=release)

    def complete_many(self, completions: Sequence[CompleteCall]) -> list[Completion]:
        self.transactions += math.ceil(len(completions) / PER_TRANSACTION)
        for call in completions:
            self._sent(call.job)
        return self.store.complete_many(completions)

    def destroy_session(self, session_id: str) -> None:
        self.destroyed.append(self.clock.monotonic())
        self.store.destroy_session(session_id)


def stopped() -> tuple[Watched, MemoryTickStore, TickCore, list[CoreJob]]:
    """JOBS jobs on one replica, each run going on (it never ends by itself; 0.5 s after its
    SIGTERM it does) when the core is stopped."""
    clock = VirtualClock(START)
    memory = MemoryTickStore(clock)
    store = Watched(memory, clock)
    schedule = parse_schedule("@every 20s")
    jobs = [
        CoreJob(JobKeys(f"job-{n}", f"jobs/job-{n}/.lock"), schedule, TIMINGS, ("w1",))
        for n in range(JOBS)
    ]

    def body(job: str, tick: datetime) -> Body:
        store.bodies[job] = Body(clock, None, ignores_term=False)
        return store.bodies[job]

    reached: TickStore = store  # type: ignore[assignment]  # every call passed on
    core = TickCore(reached, clock, Identity("w1"), jobs, body)
    core.start()
    clock.advance(2)
    assert len(core.runs) == JOBS  # every job's run is under way
    core.stop()
    clock.advance(5)
    return store, memory, core, jobs


def test_a_stop_completes_its_runs_together_not_one_transaction_each() -> None:
    store, _, core, _ = stopped()
    assert core.runs == [] and core.pool.closed
    assert len(store.completed) == JOBS
    assert store.transactions <= math.ceil(JOBS / PER_TRANSACTION), store.transactions


def test_every_stopped_run_is_recorded_after_its_processes_ended_and_before_the_sessions_go() -> (
    None
):
    store, memory, _, jobs = stopped()
    for job in jobs:
        record, _ = memory.read_tick(job.keys, START)
        assert record is not None and record.outcome is TickOutcome.INTERRUPTED
        assert memory.watch_lock(job.keys, 0, 0)[0] is None  # released: free for the next
    assert all(ended for _, _, ended in store.completed)  # never before the body's end
    assert store.destroyed and min(store.destroyed) >= max(when for when, _, _ in store.completed)


class StoppedWhileRead:
    """A replica's store whose housekeeping read is answered after the core was stopped (the
    read waited aside, and the stop ran meanwhile): the calls made after it are kept."""

    def __init__(self, store: MemoryTickStore) -> None:
        self.store = store
        self.core: TickCore | None = None
        self.after_stop: list[str] = []

    def __getattr__(self, name: str) -> object:
        found = getattr(self.store, name)
        if self.core is None or not self.core.stopping or not callable(found):
            return found
        self.after_stop.append(name)
        return found

    def read_tick_names(self, job: JobKeys) -> tuple[set[datetime], datetime | None]:
        answer = self.store.read_tick_names(job)
        if self.core is not None and not self.core.stopping:
            self.core.stop()
        return answer


def test_a_housekeeping_answered_after_a_stop_writes_nothing_more() -> None:
    """The stop's end waits for what the core's thread still does: a housekeeping whose read
    was answered after the stop leaves its writes (missed records, retention) to a later one."""
    fleet = Fleet(workers=("w1",), job=every_10s(workers=("w1",)), duration=1.0)
    store = StoppedWhileRead(fleet.store)
    store.core = fleet.start("w1", store=store)
    fleet.run(60)
    assert store.core.stopping  # a housekeeping read came, and the stop with it
    assert "prune" not in store.after_stop and "record_unrun" not in store.after_stop
    assert store.core.pool.closed


class StoppedWhileClaimed:
    """A replica's store whose claim is applied, and answered after the core was stopped (the
    claim waited aside for its answer, and the stop ran meanwhile: a SIGTERM as a tick's claim
    was out, on a slow host)."""

    def __init__(self, store: MemoryTickStore) -> None:
        self.store = store
        self.core: TickCore | None = None
        self.destroyed_before_answer = False

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    def claim(
        self, job: JobKeys, record: TickRecord, session: str, holder: bytes, terms: ClaimTerms
    ) -> Claim:
        answer = self.store.claim(job, record, session, holder, terms)
        self._stop()
        return answer

    def claim_many(self, claims: Sequence[ClaimCall]) -> list[ClaimAnswer]:
        answers = self.store.claim_many(claims)
        self._stop()
        return answers

    def _stop(self) -> None:
        if self.core is not None and not self.core.stopping:
            self.core.stop()
            self.destroyed_before_answer = self.core.pool.closed


def test_a_claim_won_as_the_stop_came_is_completed_interrupted_before_the_sessions_go() -> None:
    """The stop waits for a claim that is out: the tick it won is completed `interrupted`
    (its body never started) and its lock released, then the sessions go. A stop that
    destroyed them first left the tick's record `running` for good (nobody completes it)."""
    fleet = Fleet(workers=("w1",), job=every_10s(workers=("w1",)), duration=1.0)
    store = StoppedWhileClaimed(fleet.store)
    store.core = fleet.start("w1", store=store)
    fleet.run(15)
    assert store.core.stopping  # the first tick's claim came, and the stop with it
    assert not store.destroyed_before_answer
    record = fleet.record(START)
    assert record is not None and record.outcome is TickOutcome.INTERRUPTED, record
    assert all(body.run is None for _, _, body in fleet.bodies)  # the job never started
    assert fleet.store.watch_lock(fleet.job.keys, 0, 0)[0] is None  # released
    assert store.core.pool.closed and not store.core.runs
    assert [n.kind for _, _, n in fleet.notes].count("completed") == 1


def test_claims_sent_together_and_won_as_the_stop_came_are_each_completed_interrupted() -> None:
    """Two jobs' claims in one transaction (claim_many), answered after the stop: each run's
    answer is acted on by a callback of its own, and the sessions wait for both."""
    clock = VirtualClock(START)
    memory = MemoryTickStore(clock)
    store = StoppedWhileClaimed(memory)
    schedule = parse_schedule("@every 20s")
    jobs = [
        CoreJob(JobKeys(f"job-{n}", f"jobs/job-{n}/.lock"), schedule, TIMINGS, ("w1",))
        for n in range(2)
    ]
    started: list[str] = []

    def body(job: str, tick: datetime) -> Body:
        made = Body(clock, 1.0, ignores_term=False)
        made.start = lambda run, ended: started.append(job)  # type: ignore[method-assign]
        return made

    reached: TickStore = store  # type: ignore[assignment]  # every call passed on
    store.core = TickCore(reached, clock, Identity("w1"), jobs, body)
    store.core.start()
    clock.advance(5)
    assert store.core.stopping and not store.destroyed_before_answer
    assert started == []
    for job in jobs:
        record, _ = memory.read_tick(job.keys, START)
        assert record is not None and record.outcome is TickOutcome.INTERRUPTED, record
        assert memory.watch_lock(job.keys, 0, 0)[0] is None
    assert store.core.pool.closed and not store.core.runs


class StoppedWhileCompletionRetried:
    """A replica's store that does not answer a run's first completion, and answers its retry
    after the core was stopped (the retry waited aside for its answer, and the stop ran
    meanwhile)."""

    def __init__(self, store: MemoryTickStore) -> None:
        self.store = store
        self.core: TickCore | None = None
        self.completions = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    def complete(
        self, job: JobKeys, record: TickRecord, session_id: str, *, release: bool
    ) -> Completion:
        self.completions += 1
        if self.completions == 1:
            raise ConsulUnavailable("simulated: no answer within 10s")
        answer = self.store.complete(job, record, session_id, release=release)
        if self.core is not None and not self.core.stopping:
            self.core.stop()
        return answer


def test_a_completion_retried_as_the_stop_came_is_sent_once_and_the_run_ends_once() -> None:
    """The stop sends a completion that waits for its retry at once; one already being sent
    is not sent again. Before, the stop found the retry's record kept and sent it a second
    time: the run ended twice, and the core's thread failed on the second end."""
    fleet = Fleet(workers=("w1",), job=every_10s(workers=("w1",)), duration=1.0)
    store = StoppedWhileCompletionRetried(fleet.store)
    store.core = fleet.start("w1", store=store)
    fleet.run(15)
    assert store.core.stopping  # the retried completion came, and the stop with it
    assert store.completions == 2
    record = fleet.record(START)
    assert record is not None and record.outcome is TickOutcome.SUCCEEDED, record
    assert store.core.pool.closed and not store.core.runs
    assert [n.kind for _, _, n in fleet.notes].count("completed") == 1
