"""Renewals under a burst, in virtual time: many jobs ticking at once on one replica whose every
call to Consul is answered a little late, and waited for as ThreadTimerClock.aside waits (the
other timers run meanwhile, nested, as the simulator's slow answers run them). A renewal waited
for so reaches its holders only once every call nested after it has its answer: in a burst of
claims and completions, after the fencing bound, and healthy runs are fenced. Sent through the
clock (`TimerClock.send`), its answer is a timer of its own and confirms the runs in time."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from provision.schedule import parse_schedule
from provision.tick.clock import Answered, VirtualClock, answer_of
from provision.tick.core import CoreJob, Identity, TickCore
from provision.tick.edge import Cancellable, Note, Run
from provision.tick.memory import MemoryTickStore
from provision.tick.store import JobKeys, TickStore
from tests.unit.tick_fleet import START, TIMINGS, Body

T = TypeVar("T")

JOBS = 300  # every one of them ticks at the same instant
LATENCY = 0.01  # seconds each answer takes
NESTED = 16  # calls waiting aside at once at most (ThreadTimerClock.MAX_ASIDE); beyond, inline
RUN_FOR = 0.5  # each body's run: short, its end heard once the thread gets to it
SPAWN = 0.025  # seconds a body's start holds the thread (a process started in its namespace)


class SlowConsul:
    """The store as the replica reaches it: each call handled when sent, its answer LATENCY
    later. Waited for, that is a nested sleep (the replica's other timers run meanwhile), at most
    NESTED at once (beyond, answered at once: an inline call holds the thread, no timer runs);
    sent through the clock (`sending`), the clock hands the answer back LATENCY later."""

    def __init__(self, store: MemoryTickStore, clock: VirtualClock) -> None:
        self.store, self.clock = store, clock
        self.nested = 0
        self.sending = False

    def __getattr__(self, name: str) -> Any:
        call = getattr(self.store, name)
        return lambda *args, **kwargs: self._waited(call(*args, **kwargs))

    def _waited(self, answer: T) -> T:
        if self.sending:
            return answer
        if self.nested >= NESTED:
            self.clock.hold(LATENCY)  # inline: the thread waits, nothing else runs
            return answer
        self.nested += 1
        try:
            self.clock.sleep_until(self.clock.monotonic() + LATENCY)
        finally:
            self.nested -= 1
        return answer


class Spawned(Body):
    """A body whose start holds the replica's thread a while, as a process's start does."""

    spawn = SPAWN

    def start(self, run: Run, ended: Callable[[], None]) -> None:
        self.clock.hold(self.spawn)
        super().start(run, ended)


class ReplicaClock:
    """The replica's TimerClock: the virtual one, whose `send` answers after LATENCY."""

    def __init__(self, clock: VirtualClock, consul: SlowConsul) -> None:
        self.clock, self.consul = clock, consul

    def wall(self) -> datetime:
        return self.clock.wall()

    def monotonic(self) -> float:
        return self.clock.monotonic()

    def sleep_until(self, deadline: float, event: object = None) -> bool:
        raise AssertionError("the core never sleeps: it waits through timers")

    def call_at(self, deadline: float, callback: Callable[[], object]) -> Cancellable:
        return self.clock.call_at(deadline, callback)

    def prompt_at(self, deadline: float, callback: Callable[[], object]) -> Cancellable:
        return self.clock.prompt_at(deadline, callback)

    def send_at(self, deadline: float, call: Callable[[], T], answered: Answered[T]) -> Cancellable:
        return self.prompt_at(deadline, lambda: self._send(call, answered))

    def _send(self, call: Callable[[], T], answered: Answered[T]) -> None:
        sent = self.clock.monotonic()
        self.consul.sending = True
        try:
            answer = answer_of(call)
        finally:
            self.consul.sending = False
        self.prompt_at(sent + LATENCY, lambda: answered(sent, answer))


def burst(spawn: float = SPAWN) -> tuple[list[Body], list[Note]]:
    """JOBS jobs on `@every 20s`, one replica, the first two ticks of each: every body and note
    (each body's start holding the thread `spawn` seconds)."""
    clock = VirtualClock(START)
    consul = SlowConsul(MemoryTickStore(clock), clock)
    schedule = parse_schedule("@every 20s")
    jobs = [
        CoreJob(JobKeys(f"job-{n}", f"jobs/job-{n}/.lock"), schedule, TIMINGS, ("w1",))
        for n in range(JOBS)
    ]
    bodies: list[Body] = []
    notes: list[Note] = []

    def body(job: str, tick: datetime) -> Body:
        bodies.append(Spawned(clock, RUN_FOR, ignores_term=False))
        bodies[-1].spawn = spawn
        return bodies[-1]

    store: TickStore = consul  # type: ignore[assignment]  # every call passed on, answered late
    core = TickCore(store, ReplicaClock(clock, consul), Identity("w1"), jobs, body, notes.append)
    core.start()
    clock.advance(2)  # the first ticks' turns are taken at once, later ones 20 s apart
    first_ran = len(bodies)
    clock.advance(45)
    assert first_ran > 0 and len(bodies) > first_ran  # the burst came, and came again
    return bodies, notes


def test_healthy_runs_in_a_burst_are_confirmed_by_their_renewals_in_time() -> None:
    bodies, notes = burst()
    fenced = [n for n in notes if n.kind == "fenced"]
    assert not fenced, f"{len(fenced)} healthy runs fenced, e.g. {fenced[0]}"
    assert all(not b.told for b in bodies)  # none told to end
    completed = [n for n in notes if n.kind == "completed"]
    finished = [b for b in bodies if b.end is not None]
    assert len(completed) == len(finished) > 0
    assert {n.detail for n in completed} == {"succeeded"}
    assert any(n.kind == "renewed" for n in notes)


def test_a_run_started_after_the_fencing_bound_is_vouched_for_by_its_session_s_renewals() -> None:
    """Body starts that take longer together than the fencing bound (300 x 40 ms = 12 s, the
    bound 9 s): a run whose claim was answered long before its turn to start is still vouched
    for, by the renewals of its session sent meanwhile (the session alive then, the lock it
    took is held), never recorded lost for the replica's own slowness."""
    bodies, notes = burst(spawn=0.04)
    lost = [n for n in notes if n.kind == "completed" and n.detail == "lost"]
    assert not lost, f"{len(lost)} runs lost before they started, e.g. {lost[0]}"
    assert all(b.run is not None for b in bodies)  # every claimed run started
    assert not [n for n in notes if n.kind == "fenced"]
