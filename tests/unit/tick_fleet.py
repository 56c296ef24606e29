"""A small fleet of real TickCores on one VirtualClock and one in-memory Consul, for the tick
core's scenario tests (test_tick_core*.py): bodies of the test's making, clocks that can be held
(a paused process), stores that count writes or lose an answer. One thread, no real sleep."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TypeVar, cast

from provision.consul import ConsulUnavailable
from provision.ledger.records import TickRecord
from provision.ledger.store import Claim
from provision.schedule import parse_schedule
from provision.tick.clock import Answered, VirtualClock, send_now
from provision.tick.core import CoreJob, Identity, TickCore
from provision.tick.edge import BodyEnd, Cancellable, Note, Run, StopHow
from provision.tick.memory import MemoryTickStore
from provision.tick.store import PLAIN, ClaimTerms, JobKeys, TickStore
from provision.timings import JobTimings

T = TypeVar("T")

START = datetime(2026, 1, 1, tzinfo=timezone.utc)
TIMINGS = JobTimings(
    ttl=15.0, lock_delay=15.0, renew_interval=5.0, kill_grace=5.0, start_deadline=30.0
)
FENCE_AFTER, KILL_AFTER = 9.0, 14.0  # fence_bounds(TIMINGS, 2.5): 15 - 5 - 1, 15 - 1
WORKERS = ("w1", "w2", "w3")
KEYS = JobKeys("report", "jobs/report/.lock")


def every_10s(workers: tuple[str, ...] = WORKERS, **timings: float) -> CoreJob:
    chosen = TIMINGS if not timings else JobTimings(**{**TIMINGS.__dict__, **timings})
    return CoreJob(KEYS, parse_schedule("@every 10s"), chosen, workers)


def at(seconds: float) -> datetime:
    return START + timedelta(seconds=seconds)


class Body:
    """A body of the test's making: ends after `duration` (None: never on its own), ends
    `grace` after TERMINATE unless it ignores it, at once on KILL; notes what it was told."""

    def __init__(self, clock: VirtualClock, duration: float | None, ignores_term: bool) -> None:
        self.clock, self.duration, self.ignores_term = clock, duration, ignores_term
        self.end: BodyEnd | None = None
        self.run: Run | None = None
        self.told: list[tuple[float, StopHow]] = []
        self.started_at = 0.0
        self.ended_at: float | None = None  # when its end came (a kill's: at once)
        self._ended: Callable[[], None] = lambda: None

    @property
    def ending(self) -> BodyEnd | None:
        return self.end

    def start(self, run: Run, ended: Callable[[], None]) -> None:
        self.run, self._ended, self.started_at = run, ended, self.clock.monotonic()
        if self.duration is not None:
            self.clock.call_later(self.duration, lambda: self._finish(0))

    def stop(self, how: StopHow) -> None:
        self.told.append((self.clock.monotonic(), how))
        if how is StopHow.KILL:
            self._finish(-9, later=True)
        elif not self.ignores_term:
            self.clock.call_later(0.5, lambda: self._finish(-15))

    def _finish(self, status: int, later: bool = False) -> None:
        if self.end is None:
            self.end, self.ended_at = BodyEnd(status), self.clock.monotonic()
            if later:
                self.clock.call_later(0.0, self._ended)
            else:
                self._ended()


class Held:
    """A replica's clock whose timers can be held (a paused process: time goes on, nothing of
    it runs) and run in order on resume."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.paused = False
        self.held: list[tuple[float, int, Callable[[], object]]] = []

    def wall(self) -> datetime:
        return self.clock.wall()

    def monotonic(self) -> float:
        return self.clock.monotonic()

    def sleep_until(self, deadline: float, event: object = None) -> bool:
        raise AssertionError("the core never sleeps")

    def call_at(self, deadline: float, callback: Callable[[], object]) -> Cancellable:
        def fire() -> None:
            if self.paused:
                self.held.append((deadline, len(self.held), fire))
            else:
                callback()

        return self.clock.call_at(deadline, fire)

    def prompt_at(self, deadline: float, callback: Callable[[], object]) -> Cancellable:
        def fire() -> None:
            if self.paused:
                self.held.append((deadline, len(self.held), fire))
            else:
                callback()

        return self.clock.prompt_at(deadline, fire)

    def send_at(self, deadline: float, call: Callable[[], T], answered: Answered[T]) -> Cancellable:
        # sent and answered as prompt timers of this replica's: held while it is paused
        return self.prompt_at(deadline, lambda: send_now(self, call, answered))

    def resume(self) -> None:
        self.paused = False
        for _, _, fire in sorted(self.held, key=lambda h: (h[0], h[1])):
            self.clock.call_at(self.clock.monotonic(), fire)
        self.held.clear()


@dataclass
class Fleet:
    """Cores for `workers` on one clock and one store; every body and note kept."""

    job: CoreJob = field(default_factory=every_10s)
    workers: tuple[str, ...] = WORKERS
    duration: float | None = 2.0
    ignores_term: bool = False
    clock: VirtualClock = field(default_factory=lambda: VirtualClock(START))
    store: MemoryTickStore = field(init=False)
    bodies: list[tuple[str, datetime, Body]] = field(default_factory=list)
    notes: list[tuple[float, str, Note]] = field(default_factory=list)
    cores: dict[str, TickCore] = field(default_factory=dict)
    clocks: dict[str, Held] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.store = MemoryTickStore(self.clock)

    def start(self, worker: str, *, store: object = None, skew: float = 0.0) -> TickCore:
        # its own view of the time: its wall may be off, or stepped, alone
        clock = self.clocks[worker] = Held(self.clock.skewed(skew))

        def body(job: str, tick: datetime) -> Body:
            made = Body(self.clock, self.duration, self.ignores_term)
            self.bodies.append((worker, tick, made))
            return made

        def note(n: Note) -> None:
            self.notes.append((self.clock.monotonic(), worker, n))

        reached = cast(TickStore, store or self.store)  # a Counting one passes everything on
        core = TickCore(reached, clock, Identity(worker), [self.job], body, note)
        self.cores[worker] = core
        core.start()
        return core

    def run(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def ran(self, tick: datetime) -> list[str]:
        return [worker for worker, t, _ in self.bodies if t == tick]

    def ran_ticks(self) -> set[datetime]:
        return {t for _, t, _ in self.bodies}

    def said(self, worker: str, kind: str) -> list[tuple[float, Note]]:
        return [(when, n) for when, who, n in self.notes if who == worker and n.kind == kind]

    def record(self, tick: datetime) -> TickRecord | None:
        return self.store.read_tick(self.job.keys, tick)[0]


class Counting:
    """A replica's store that counts its writes (claims, completions, unrun records) and can
    lose the answer of its next claim (applied, then a client timeout)."""

    def __init__(self, store: MemoryTickStore) -> None:
        self.store = store
        self.writes: list[str] = []
        self.lose_next_claim = False

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    def claim(
        self,
        job: JobKeys,
        record: TickRecord,
        session: str,
        holder: bytes,
        terms: ClaimTerms = PLAIN,
    ) -> Claim:
        self.writes.append("claim")
        answer = self.store.claim(job, record, session, holder, terms)
        if self.lose_next_claim:
            self.lose_next_claim = False
            raise ConsulUnavailable("simulated: no answer within 10s")
        return answer

    def record_unrun(self, job: JobKeys, records: list[TickRecord]) -> list[TickRecord]:
        self.writes.append("record_unrun")
        return self.store.record_unrun(job, records)
