"""Time for the tick core, from one object: Consul's wall time, this process's monotonic time,
and waiting until an instant or an event.

    SystemClock    the real thing: the agent's clock learnt from its answers' Date headers
                   (consul/clock.py AgentClock), time.monotonic, threading.Event waits
    VirtualClock   a simulation's: time moves only when the simulation moves it (advance,
                   advance_to, or a caller's sleep_until), and timers run in order of due time
    ThreadTimerClock  the real clocks with timers (a TimerClock, tick/edge.py): one thread runs
                   them in order of due time, as a VirtualClock does, in real time; a call to
                   Consul made `aside` lets the other timers run while it waits for its answer

A VirtualClock never waits in real time. In a single-threaded simulation the caller of
`sleep_until` is the only one running, so its sleep *is* time passing: the clock moves to the
deadline, running on the way every timer due, in order (ties in registration order), and stops
early at a timer that sets the caller's event. Nothing blocks, and a run is a pure function of
its inputs (a seed's replay is exact). It is not meant to be shared between threads.
"""

from __future__ import annotations

import concurrent.futures
import heapq
import itertools
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Protocol, TypeVar

from provision.consul import AgentClock

T = TypeVar("T")

# A call's answer as it is handed back: its value, or the exception it raised, when called.
Answer = Callable[[], T]


def answer_of(call: Callable[[], T]) -> Answer[T]:
    """`call()` made now; its answer kept, to be said (returned or raised) later."""
    try:
        value = call()
    except Exception as exc:  # said to whoever reads the answer, as call() said it
        failure = exc

        def raised() -> T:
            raise failure

        return raised
    return lambda: value


Answered = Callable[[float, Answer[T]], object]  # (when it was sent, its answer)


def send_now(clock: _Timers, call: Callable[[], T], answered: Answered[T]) -> None:
    """A call sent now where nothing runs beside the clock's thread (a VirtualClock): made at
    once, its answer handed back as a prompt timer of now, never inside the caller."""
    sent = clock.monotonic()
    answer = answer_of(call)
    clock.prompt_at(sent, lambda: answered(sent, answer))


# A virtual clock's first wall time, unless told otherwise: a fixed instant, so runs repeat.
DEFAULT_START = datetime(2026, 1, 1, tzinfo=timezone.utc)


class Clock(Protocol):
    """Consul's wall time, monotonic time, and waits (one object, never a pair of callables)."""

    def wall(self) -> datetime:
        """Now on Consul's clock (UTC, aware): what ticks are judged by."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock no one steps: what deadlines, TTLs and intervals are counted on."""
        ...

    def sleep_until(self, deadline: float, event: threading.Event | None = None) -> bool:
        """Wait until `monotonic()` reaches `deadline`, or until `event` is set (at once if it
        is already); whether the event was set."""
        ...


class _Timers(Protocol):
    def monotonic(self) -> float: ...

    def prompt_at(self, deadline: float, callback: Callable[[], object]) -> object: ...


class SystemClock:
    """The real clocks. `agent_clock`: the one the Consul client learns from (Consul(...,
    agent_clock=...)); without one, a fresh AgentClock, which is this host's clock until
    something feeds it an answer."""

    def __init__(
        self,
        agent_clock: AgentClock | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._agent = agent_clock if agent_clock is not None else AgentClock(monotonic)
        self._monotonic = monotonic

    def wall(self) -> datetime:
        return self._agent()

    def monotonic(self) -> float:
        return self._monotonic()

    def sleep_until(self, deadline: float, event: threading.Event | None = None) -> bool:
        # a loop: a wait may end a little before its timeout, and a deadline is never early
        while True:
            if event is not None and event.is_set():
                return True
            left = deadline - self._monotonic()
            if left <= 0:
                return False
            if event is None:
                time.sleep(left)
            elif event.wait(left):
                return True


@dataclass(eq=False)
class Timer:
    """A callback the virtual clock runs at `due` (its monotonic time); `cancel()` drops it."""

    due: float
    callback: Callable[[], object] = field(repr=False)
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


# No simulated fleet runs this many callbacks at one instant (a few per job and replica do):
# more is a loop of timers that set themselves again at once, which would never end.
MAX_AT_ONE_INSTANT = 100_000


class Livelock(RuntimeError):
    """Virtual time stopped moving: timers keep setting timers at the same instant."""


class _Timeline:
    """The one virtual time a clock and its skewed views share, with their timers."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.queue: list[tuple[float, int, Timer]] = []
        self.prompt: list[tuple[float, int, Timer]] = []  # ahead of the others once due
        self.order = itertools.count()  # ties by registration order

    def add(self, timer: Timer, prompt: bool = False) -> None:
        heapq.heappush(self.prompt if prompt else self.queue, (timer.due, next(self.order), timer))

    def run_until(self, deadline: float, stop: Callable[[], bool]) -> bool:
        """Run the timers due by `deadline` in order, each at its due time, until `stop()` says
        so (True) or none is left; then time is at least `deadline` (False). Never backwards: a
        timer's callback may move time itself (a sleep of its own, a hold) past this deadline,
        and the timers that came due meanwhile then run in order, the prompt ones first."""
        spins = 0  # timers run at one instant: a timer that sets itself again at once spins
        while (timer := self._next(deadline)) is not None:
            spins = spins + 1 if timer.due <= self.now else 0
            if spins > MAX_AT_ONE_INSTANT:
                raise Livelock(
                    f"over {MAX_AT_ONE_INSTANT} timers at t={self.now:.3f} without time moving"
                )
            self.now = max(self.now, timer.due)
            timer.callback()
            if stop():
                return True
        self.now = max(self.now, deadline)
        return False

    def _next(self, deadline: float) -> Timer | None:
        """The next timer to run by `deadline`: a prompt one once it is due (by now, or before
        the next other one), else the next in order of due time."""
        for heap in (self.prompt, self.queue):
            while heap and heap[0][2].cancelled:
                heapq.heappop(heap)
        if self.now > deadline:
            return None  # a callback moved time past it (a hold, a longer sleep): it is over
        first = self.queue[0][0] if self.queue else math.inf
        if self.prompt and self.prompt[0][0] <= min(deadline, max(self.now, first)):
            return heapq.heappop(self.prompt)[2]
        if first <= deadline:
            return heapq.heappop(self.queue)[2]
        return None

    def next_due(self) -> float | None:
        live = [due for due, _, t in (*self.queue, *self.prompt) if not t.cancelled]
        return min(live, default=None)


class VirtualClock:
    """A deterministic clock: monotonic time starts at `monotonic` and the wall at `start`, and
    they move together, unless a test steps the wall (`step_wall`) or asks for a view of the
    same time with a wall ahead or behind (`skewed`: another replica's, or Consul's)."""

    def __init__(self, start: datetime = DEFAULT_START, *, monotonic: float = 0.0) -> None:
        if start.tzinfo is None:
            raise ValueError("a virtual clock's start is an aware datetime (UTC)")
        self._timeline = _Timeline(monotonic)
        self._origin = (start.astimezone(timezone.utc), monotonic)
        self._offset = 0.0  # seconds the wall was stepped or skewed by

    # -- the Clock -----------------------------------------------------------------------------
    def wall(self) -> datetime:
        start, at = self._origin
        return start + timedelta(seconds=self._timeline.now - at + self._offset)

    def monotonic(self) -> float:
        return self._timeline.now

    def sleep_until(self, deadline: float, event: threading.Event | None = None) -> bool:
        """Time passes until `deadline`, running the timers due on the way; a timer that sets
        `event` ends the sleep at its due time (True). Never waits in real time."""
        if event is not None and event.is_set():
            return True
        stop = (lambda: False) if event is None else event.is_set
        return self._timeline.run_until(deadline, stop)

    # -- the simulation's controls ---------------------------------------------------------------
    def advance(self, seconds: float) -> None:
        """Move time `seconds` ahead, running every timer due meanwhile, in order."""
        if seconds < 0:
            raise ValueError("monotonic time never goes back")
        self.advance_to(self._timeline.now + seconds)

    def advance_to(self, deadline: float) -> None:
        """Move time to `deadline` (monotonic), running every timer due by then, in order."""
        if deadline < self._timeline.now:
            raise ValueError(f"monotonic time never goes back ({deadline} < {self._timeline.now})")
        self._timeline.run_until(deadline, lambda: False)

    def call_at(self, deadline: float, callback: Callable[[], object]) -> Timer:
        """Run `callback` when time reaches `deadline` (at the next move if it is past)."""
        timer = Timer(max(deadline, self._timeline.now), callback)
        self._timeline.add(timer)
        return timer

    def call_later(self, delay: float, callback: Callable[[], object]) -> Timer:
        return self.call_at(self._timeline.now + delay, callback)

    def prompt_at(self, deadline: float, callback: Callable[[], object]) -> Timer:
        """`call_at`, ahead of every other timer once due: when time jumped (a `hold`) past
        several timers' due times, the prompt ones run first."""
        timer = Timer(max(deadline, self._timeline.now), callback)
        self._timeline.add(timer, prompt=True)
        return timer

    def send_at(self, deadline: float, call: Callable[[], T], answered: Answered[T]) -> Timer:
        """At `deadline`, `call()` sent; `answered(sent, answer)` a prompt timer then (tick/
        edge.py TimerClock.send_at): what ThreadTimerClock does, without its threads."""
        return self.prompt_at(deadline, lambda: send_now(self, call, answered))

    def hold(self, seconds: float) -> None:
        """The thread is held `seconds` (a call made inline, a process started): time passes
        and no timer runs meanwhile; what came due runs once the holder returns, in order, the
        prompt ones first. From a timer's callback (a simulated store's or body's)."""
        if seconds < 0:
            raise ValueError("monotonic time never goes back")
        self._timeline.now += seconds

    def next_due(self) -> float | None:
        """When the next timer not cancelled is due (None: there is none)."""
        return self._timeline.next_due()

    def step_wall(self, seconds: float) -> None:
        """The wall clock jumps `seconds` (back when negative): `date -s`, a VM resumed. The
        monotonic clock does not move, nor does any other view's wall."""
        self._offset += seconds

    def skewed(self, seconds: float) -> VirtualClock:
        """A view of the same time (same monotonic clock, same timers) whose wall is `seconds`
        ahead of this one's (behind when negative): a replica whose clock is off."""
        view = VirtualClock.__new__(VirtualClock)
        view._timeline, view._origin = self._timeline, self._origin
        view._offset = self._offset + seconds
        return view


class ThreadTimerClock(SystemClock):
    """The real clocks, and timers: `call_at` from any thread; `run()` runs the callbacks due,
    in order of due time (ties in the order they were set), one at a time, in the thread that
    calls it, until `close()`. The tick core runs in that thread: its state is never touched by
    two threads, as under a VirtualClock (a body's reaper or a renewal's answer hands its news
    over with a call_at of now).

    `aside(call)`, from a callback: the call runs on a worker thread while this thread runs the
    other callbacks as they come due, nested, until its answer is in; then the callback that
    asked goes on. So a slow or silent Consul holds back no fence and no renewal of another
    run, as the simulator's slow answers hold back none (bench/simulate.py: a request waiting
    for its answer is a nested sleep during which the replica's other timers run). At most
    MAX_ASIDE calls wait so at once; beyond, a call runs inline (it waits, and holds the thread,
    for one call's time at most)."""

    IDLE = 1.0  # seconds between two looks at a closed loop while nothing is due
    MAX_ASIDE = 16  # calls waiting for their answer at once, nested (each a few stack frames)
    SENDERS = 4  # threads for `send`'s calls (a core's renewals: one per session and interval)

    def __init__(
        self,
        agent_clock: AgentClock | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(agent_clock, monotonic)
        self._due: list[tuple[float, int, Timer]] = []
        self._prompt: list[tuple[float, int, Timer]] = []  # ahead of `_due` once due
        self._order = itertools.count()
        self._changed = threading.Condition()
        self._closed = False
        self._loop: int | None = None  # the thread running the callbacks
        self._aside = 0  # calls waiting aside now (nested)
        self._workers: concurrent.futures.ThreadPoolExecutor | None = None
        self._senders: concurrent.futures.ThreadPoolExecutor | None = None

    def call_at(self, deadline: float, callback: Callable[[], object]) -> Timer:
        timer = Timer(deadline, callback)
        with self._changed:
            heapq.heappush(self._due, (deadline, next(self._order), timer))
            self._changed.notify()
        return timer

    def call_later(self, delay: float, callback: Callable[[], object]) -> Timer:
        return self.call_at(self.monotonic() + delay, callback)

    def run(self) -> None:
        """Run the timers as they come due, until `close()` (what is due then is not run)."""
        self._loop = threading.get_ident()
        while (callback := self._next()) is not None:
            callback()

    def close(self) -> None:
        """End `run()` once the callback it runs now (if any) returns; from any thread."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        if self._workers is not None:
            self._workers.shutdown(wait=False)
        if self._senders is not None:  # an answer would find no loop to run it
            self._senders.shutdown(wait=False, cancel_futures=True)

    def prompt_at(self, deadline: float, callback: Callable[[], object]) -> Timer:
        """`call_at`, ahead of every other callback once due: a backlog of callbacks due
        earlier (a burst of claims, body starts, completions) does not hold it back."""
        timer = Timer(deadline, callback)
        with self._changed:
            heapq.heappush(self._prompt, (deadline, next(self._order), timer))
            self._changed.notify()
        return timer

    def send_at(self, deadline: float, call: Callable[[], T], answered: Answered[T]) -> Timer:
        """At `deadline` (a prompt timer), `call()` handed to a sender thread; its answer handed
        back to `answered(sent, answer)` as a prompt timer of its own. Never waited for in this
        thread, so never behind another call's wait (`aside`) nor a backlog of callbacks.
        Closed: nothing is sent, nothing answered."""
        return self.prompt_at(deadline, lambda: self._send(call, answered))

    def _send(self, call: Callable[[], T], answered: Answered[T]) -> None:
        with self._changed:
            if self._closed:
                return
            if self._senders is None:
                self._senders = concurrent.futures.ThreadPoolExecutor(
                    self.SENDERS, thread_name_prefix="lockctl-send"
                )
            sent = self.monotonic()
            future = self._senders.submit(answer_of, call)
        future.add_done_callback(lambda done: self._hand_over(done, sent, answered))

    def _hand_over(
        self, done: concurrent.futures.Future[Answer[T]], sent: float, answered: Answered[T]
    ) -> None:
        if not done.cancelled():
            answer = done.result()  # answer_of keeps the call's exception: result() never raises
            self.prompt_at(self.monotonic(), lambda: answered(sent, answer))

    def join_workers(self, timeout: float) -> None:
        """After `close()`: wait, `timeout` at most, for the threads that made calls aside or
        sent renewals to end (a process that runs many clocks, one after another, leaves none
        behind)."""
        pools = [pool for pool in (self._workers, self._senders) if pool is not None]
        if not pools:
            return

        def shut() -> None:
            for pool in pools:
                pool.shutdown()

        waiter = threading.Thread(target=shut, name="lockctl-clock-end", daemon=True)
        waiter.start()
        waiter.join(timeout)

    def aside(self, call: Callable[[], T]) -> T:
        """`call()`'s answer (or its exception), the other callbacks run meanwhile as they come
        due. Inline when not called from a callback of `run()`, or MAX_ASIDE calls wait."""
        if threading.get_ident() != self._loop or self._aside >= self.MAX_ASIDE or self._closed:
            return call()
        if self._workers is None:
            self._workers = concurrent.futures.ThreadPoolExecutor(
                self.MAX_ASIDE, thread_name_prefix="lockctl-aside"
            )
        answered = threading.Event()
        future = self._workers.submit(self._answer, call, answered)
        self._aside += 1
        try:
            while (callback := self._next(answered)) is not None:
                callback()
        finally:
            self._aside -= 1
        return future.result()  # closed meanwhile: the answer is waited for here

    def _answer(self, call: Callable[[], T], answered: threading.Event) -> T:
        try:
            return call()
        finally:
            with self._changed:
                answered.set()
                self._changed.notify_all()

    def _next(self, answered: threading.Event | None = None) -> Callable[[], object] | None:
        """The next callback once it is due (a prompt one first); None once closed, or once
        `answered` is set."""
        with self._changed:
            while not self._closed and not (answered is not None and answered.is_set()):
                for heap in (self._prompt, self._due):
                    while heap and heap[0][2].cancelled:
                        heapq.heappop(heap)
                heads = [heap[0][0] for heap in (self._prompt, self._due) if heap]
                if not heads:
                    self._changed.wait(self.IDLE)
                    continue
                left = min(heads) - self.monotonic()
                if left > 0:
                    self._changed.wait(min(left, self.IDLE))
                    continue
                now = self.monotonic()
                heap = self._prompt if self._prompt and self._prompt[0][0] <= now else self._due
                return heapq.heappop(heap)[2].callback
            return None
