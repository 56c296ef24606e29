"""A stop that comes while a claim waits for its answer, on real threads as `lockctl schedule`
runs them (scheduler/on_core.py): the claim waits aside on the core's ThreadTimerClock, the stop
runs meanwhile as a prompt timer, the process's end waits until the core says it has stopped,
then closes the clock. The store's claim is held on an Event the test lets go only once the
core is stopping: ordered by events, never by durations (a fixed order a slow VM made)."""

from __future__ import annotations

import threading
from datetime import datetime

from provision.consul import AgentClock
from provision.ledger.records import TickOutcome, TickRecord
from provision.ledger.store import Claim
from provision.schedule import parse_schedule
from provision.scheduler.on_core import GuardedClock
from provision.tick.aside import aside_store
from provision.tick.core import CoreJob, Identity, TickCore
from provision.tick.memory import MemoryTickStore
from provision.tick.store import PLAIN, ClaimTerms, JobKeys, TickStore
from tests.unit.tick_fleet import TIMINGS

WAIT = 10.0  # seconds a test waits for what must happen (never reached when it works)
KEYS = JobKeys("report", "jobs/report/.lock")


class HeldClaim(MemoryTickStore):
    """Its claim is applied at once, and answered when the test lets it go."""

    def __init__(self, clock: GuardedClock) -> None:
        super().__init__(clock)
        self.sent, self.answer = threading.Event(), threading.Event()

    def claim(
        self,
        job: JobKeys,
        record: TickRecord,
        session_id: str,
        holder: bytes,
        terms: ClaimTerms = PLAIN,
    ) -> Claim:
        won = super().claim(job, record, session_id, holder, terms)
        self.sent.set()
        assert self.answer.wait(WAIT)
        return won


class Body:
    """A body that must never start: its tick's claim is answered after the stop."""

    started = False
    ending = None

    def start(self, run: object, ended: object) -> None:
        self.started = True

    def stop(self, how: object) -> None:
        raise AssertionError("never started, never stopped")


def test_a_stop_while_a_claim_waits_aside_completes_its_tick_and_only_then_ends() -> None:
    errors: list[Exception] = []
    clock = GuardedClock(AgentClock(), errors.append)
    store = HeldClaim(clock)
    tick = parse_schedule("@every 1s").next_ticks(clock.wall(), 1)[0]
    job = CoreJob(KEYS, parse_schedule("@every 1s"), TIMINGS, ("w1",))
    bodies: list[Body] = []

    def body(name: str, at: datetime) -> Body:
        bodies.append(Body())
        return bodies[-1]

    reached: TickStore = aside_store(store, clock)
    core = TickCore(reached, clock, Identity("w1"), [job], body)
    thread = threading.Thread(target=clock.run, daemon=True)
    clock.call_at(clock.monotonic(), core.start)
    thread.start()
    try:
        assert store.sent.wait(WAIT + (tick - clock.wall()).total_seconds())
        stopped = threading.Event()

        def until_stopped() -> None:  # scheduler/on_core.py `_until_stopped`
            if core.stopping and not core.runs and core.pool.closed:
                stopped.set()
            else:
                clock.prompt_at(clock.monotonic() + 0.05, until_stopped)

        def stop() -> None:
            core.stop()
            until_stopped()

        clock.prompt_at(clock.monotonic(), stop)  # run nested, inside the claim's wait
        while not core.stopping:
            assert not stopped.is_set()
            threading.Event().wait(0.01)
        stopped_before_answer = stopped.wait(0.3)  # the end must wait for the claim's answer
        store.answer.set()
        assert stopped.wait(WAIT)
    finally:
        store.answer.set()
        clock.close()
        thread.join(WAIT)
    assert not stopped_before_answer
    assert errors == []
    records = [r for r in store.read_ticks(KEYS) if r.outcome is not TickOutcome.MISSED]
    assert [r.outcome for r in records] == [TickOutcome.INTERRUPTED]
    assert [b.started for b in bodies] == [False]
    assert store.watch_lock(KEYS, 0, 0)[0] is None  # released, not left to the session's end
