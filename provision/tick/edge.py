"""The tick core's edges beyond the store: the clock it waits on (a `Clock` that also runs
callbacks at an instant), the `Body` it runs under a held lock, the `Run` a body is given, and
the `Note`s it tells a listener.

Everything the core waits for arrives as a callback on its `TimerClock`: a turn, a renewal, a
fencing bound, a body's end. So one thread runs it, and under a VirtualClock a whole fleet of
cores runs in one thread, deterministically (bench/simulate.py). A Body tells the core it ended
by calling the `ended` callback it was started with, from a callback of its own (a timer, a
reaper), never from inside `stop()`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Protocol, TypeVar

from provision.ledger.records import TickRecord
from provision.tick.clock import Answered, Clock
from provision.tick.skips import SkipReason as SkipReason  # where the core decides them

if TYPE_CHECKING:
    from provision.sessions import SessionTerms

T = TypeVar("T")


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class TimerClock(Clock, Protocol):
    """A Clock that also runs `callback` once monotonic time reaches `deadline` (at once, at
    the next chance, when it has), in order of due time. VirtualClock is one."""

    def call_at(self, deadline: float, callback: Callable[[], object]) -> Cancellable: ...

    def send_at(self, deadline: float, call: Callable[[], T], answered: Answered[T]) -> Cancellable:
        """At `deadline`, make `call()` without waiting for it in the clock's thread; its answer
        (clock.py `Answer`: say it to get the value or the exception) is handed, with the time
        it was sent, to `answered` as a prompt timer of now. Prompt timers run ahead of every
        other callback due: a renewal is sent and confirms its holders on time, whatever
        backlog the thread has (a burst of claims, body starts, completions)."""
        ...


class StopHow(str, enum.Enum):
    """How the core stops a body: ask (SIGTERM to the tree, an abort it may finish), or force
    (SIGKILL to every process of the tree; nothing of it runs after)."""

    TERMINATE = "terminate"
    KILL = "kill"


@dataclass(frozen=True)
class BodyEnd:
    """How a body ended: its exit status (0: success; None: none, killed before it said)."""

    exit_status: int | None


class LockLost(Exception):
    """`Run.check()`: the lock is no longer safely ours (or the run was told to stop)."""


@dataclass(frozen=True)
class Run:
    """One claimed tick as its body sees it: the tick (the one planned, claimed and recorded),
    the fencing token to hand to what it writes to, which attempt at the tick it is, and
    `check()`, which judges the fencing bound on the clock at every call (a flag another
    callback sets may not have been set yet: after a pause, the body can run before the core
    does)."""

    job: str
    worker: str
    tick: datetime
    lock_index: int
    session: str
    safe_now: Callable[[], bool] = field(repr=False, compare=False)
    attempt: int = 1  # a retry of the tick's failed run, under the same lock: 2, 3, ...
    key: str | None = None  # a keyed job's key (provision/keyed.py): its own lock and ledger

    def safe(self) -> bool:
        """Whether the lock is still vouched for now (False: stop, another may run)."""
        return self.safe_now()

    def check(self) -> None:
        """Raise LockLost unless the lock is still vouched for now."""
        if not self.safe_now():
            raise LockLost(f"{self.job} {self.tick.isoformat()}: the lock is no longer ours")


class Body(Protocol):
    """What runs under a held lock: a command's process tree, an HTTP call, a function."""

    def start(self, run: Run, ended: Callable[[], None]) -> None:
        """Start; call `ended()` (from a callback of its own) once it has ended."""
        ...

    @property
    def ending(self) -> BodyEnd | None:
        """None while anything of it runs; then how it ended."""
        ...

    def stop(self, how: StopHow) -> None:
        """Ask it to end (TERMINATE) or end it (KILL); it says it ended through `ended()`."""
        ...


BodyFactory = Callable[[str, datetime], Body]  # (job name, tick) -> the body to run for it


@dataclass(frozen=True)
class Note:
    """Something the core did or found, for a listener (events, metrics, a simulation's
    trace): `kind` in a word, the job and tick, a few words more, the record as written when
    there is one (claimed, completed, paused), and why a tick was skipped; of the session
    pool's (job ""), the session and its terms. `seconds`: how long (a renewal's round trip,
    the delay before a retry, the time since the lock was last confirmed when fenced);
    `count`: how many (the records a housekeeping pruned)."""

    kind: str
    job: str  # the job's name; a keyed job's key of it, `job/key` (JobKeys.unit)
    tick: datetime | None = None
    detail: str = ""
    record: TickRecord | None = None
    skip: SkipReason | None = None
    session: str | None = None
    terms: SessionTerms | None = None
    seconds: float | None = None
    count: int | None = None


Listener = Callable[[Note], None]
