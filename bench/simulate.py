"""The tick core under simulation: a fleet of real TickCores on one in-memory Consul and one
virtual clock, in one thread, with faults drawn from a seed and an oracle after every step.

    .venv/bin/python bench/simulate.py [--seed S] [--ticks N] [--replicas 3] [--jobs 5]
                                       [--plant NAME ...] [--keep-going] [--trace K]
                                       [--no-caps]

Each replica is its own TickCore (provision/tick/core.py) with its own sessions, its own view
of the wall clock and its own timers on the shared VirtualClock; the store is
MemoryTickStore (Consul's measured semantics) behind a layer that injects the store's faults
and lets the oracle see every answer. Faults (a seeded random.Random): a replica killed (its
sessions left to expire, its bodies dead with it) and restarted later; paused for any length
(its timers and its bodies' wait, time goes on; on resume it acts on what it believes); its
wall clock skewed or stepped; the store unavailable or slow for a while (answers late, or
never: a client timeout after Consul applied the request); a session expired early; a body that
hangs. The oracle checks, after every step:

    tick-twice         no tick of a job runs twice (two bodies started for one (job, tick)),
                       but for a retry: a later attempt under the claim's own token, once the
                       attempt before it ended (one job in five retries a failed run, twice)
    overlap            no body runs past `kill_after` from its last confirmation while another
                       body of its job runs (a frozen replica's body is not running)
    token              the fencing tokens (LockIndex) of a job's successive runs only grow
    check-after-bound  a body's `run.check()` never passes once `fence_after` has passed since
                       its last confirmation (the send time of a renewal the core was answered)
    loser-wrote        a replica that read a tick as taken at its turn never claims it (no write)
    missed-too-early   no tick is recorded missed before its claim window closed
    blackout-run       no body runs a scheduled tick a blackout window of its job holds (some
                       jobs have a window of a random minute and length each hour: their
                       ticks are recorded `blackout`, never run, never caught up)
    blackout-stray     no tick outside every window of its job is recorded `blackout`
    unaccounted        every tick ends in a recorded outcome (succeeded, failed, lost, missed,
                       timed-out, interrupted, paused, blackout; or `running` under a replica killed
                       with it) within SLACK of time during which Consul and a replica were up
    over-cap           no replica ever has more bodies running at once than its cap
                       (max_concurrent_runs: drawn per replica from the seed, `--no-caps` none)
    stop-left-running  a replica's graceful stop (SIGTERM: the core stopped, the process gone
                       once its runs are completed and its sessions destroyed) leaves none of
                       its records `running` and no body of its own alive; but for a tick
                       whose claim or completion Consul did not answer (`unanswered`,
                       `complete-abandoned`: left to Consul, which the stop does not wait for)
    backfill-unrun     an operator's backfill (`lockctl backfill`: now and then, of up to
                       BACKFILL_TICKS past ticks of a job that nobody ran, as the command
                       plans them; heard by every replica up, and by each one that boots while
                       it is pending) has each of its ticks run, or found run, within
                       RUN_SLACK + SLACK of the fleet's up-time per tick; each at most once
                       (tick-twice)
    abort-unstopped    the run an operator's abort names (`lockctl abort`: now and then, of a
                       job's run going on, naming its tick and the session holding the lock;
                       heard by every replica up, and by each that boots later) is still
                       alive once its replica has been up ABORT_SLACK since the abort
    abort-stray        a run recorded `aborted` that no abort named
    cancel-unheeded    a run of an overlap = "cancel" job (one job in five: the `@every 15s`
                       one) still alive once its replica has been up kill_grace + CANCEL_SLACK
                       since that replica's turn at a later tick of the job
    cancel-overlap     a run recorded `cancelled` whose body is alive, kill_grace + a second
                       after its cancel, beside another running body of its job
    buffered-lost      a tick recorded `buffered` (overlap = "buffer_one": one job in five, the
                       `* * * * *` one) is still so once the fleet has been up its start
                       deadline + SLACK since (run over that record, or recorded missed over
                       it, by then; run at most once: tick-twice)
    trigger-unrun      an operator's trigger (`lockctl trigger`: one now and then, heard by
                       every replica up, and by each one that boots while it is pending) is
                       taken by a claim within RUN_SLACK + SLACK of the fleet's up-time; it
                       runs at most once (tick-twice, at the trigger's own instant)

One job in five catches up (`catchup = "latest"`): after a replica's first turn, and after a
turn Consul did not answer, the newest tick nobody ran is run late, once (tick-twice holds it).
Another one in five, the `@every 10s` one, catches up `"all"`: up to CATCHUP_ALL's limit of
the ticks nobody ran in its window, oldest first, each once (tick-twice holds them).

A violation prints its invariant, the seed and the last events; `--seed S` (with the same
plants) replays it exactly. `--plant NAME` replaces a named function of the core from outside
(the simulator monkeypatches it) with a known bug, which the oracle must report:

    no-fence      the fencing decision is never carried out (apply_fence does nothing)
    check-flag    run.check() reads only the flag the core's decision sets, not the clock
    blind-claim   a tick read as taken is claimed anyway (the claim's transaction still
                  refuses it: a Raft write wasted, never a tick run twice)
    no-missed     ticks nobody ran are never recorded missed
    late-confirm  a confirmation counts from its answer, not from when it was sent
    no-cap        a replica at its cap of concurrent runs claims anyway (the cap ignored)
    no-blackout   blackout windows are ignored (holding_window finds none): their ticks run
    backfill-blind a backfill runs its tick whatever the tick's record says now (may_backfill
                  always yes: a tick another replica ran for the backfill is run again)
    backfill-none a backfill's ticks are all taken for run already (may_backfill always no)
    abort-deaf    an abort stops no run (stops always no)
    abort-any     an abort stops whichever run of its job a replica holds (stops always yes:
                  a note heard again, or kept, stops a later run)
    cancel-deaf   overlap = "cancel" is never carried out (overlap_action always waits): a run
                  that outlasts its interval goes on past the next tick's turn
    buffer-dropped a tick kept `buffered` is dropped as if settled when it is looked at
                  (still_buffered always no): it stays `buffered` for good
    no-stop-wait  a stop destroys the sessions while a claim is out (its won tick never
                  completed: `running` for good)

Last line: `simulated N ticks, F faults, V violations in S s (seed X)`.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import functools
import itertools
import math
import random
import sys
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from types import ModuleType
from typing import TypeVar

from provision.blackouts import Blackout, holding_window
from provision.consul import ConsulNotReached, ConsulUnavailable
from provision.fencing import fence_bounds
from provision.ledger.aborts import AbortNote
from provision.ledger.backfill import (
    BackfillLedger,
    BackfillNote,
    beyond_ledger,
    may_backfill,
    plan_backfill,
)
from provision.ledger.control import ControlNote, manual_tick
from provision.ledger.records import TickRecord, tick_name
from provision.ledger.store import Claim, Completion
from provision.ledger.ticks import claim_window
from provision.outcomes import Outcome
from provision.schedule import parse_schedule
from provision.sessions import SessionTerms
from provision.system.control_keys import abort_key, backfill_key, trigger_key
from provision.tick import core, held, pool
from provision.tick.calendar import Calendar
from provision.tick.clock import Answer, Answered, Timer, VirtualClock, answer_of
from provision.tick.core import CoreJob, Identity, TickCore
from provision.tick.edge import BodyEnd, Cancellable, Note, Run, SkipReason, StopHow
from provision.tick.memory import MemoryTickStore
from provision.tick.overlap import Busy, OverlapAction
from provision.tick.store import (
    PLAIN,
    ClaimAnswer,
    ClaimCall,
    ClaimTerms,
    CompleteCall,
    ControlState,
    JobKeys,
    TurnRead,
)
from provision.timings import OVERLAP_BUFFER_ONE, OVERLAP_CANCEL, CatchupReach, JobTimings

START = datetime(2026, 3, 28, 23, 0, tzinfo=timezone.utc)  # a DST change ahead (Berlin)
DEFAULT_TICKS = 20_000
TRACE = 40  # events shown with a violation
STEP = 10.0  # seconds of simulated time between two looks at the ledger's accounting
FAULT_EVERY = 90.0  # mean seconds of simulated time between two faults
SLACK = 90.0  # seconds of Consul and some replica up by which a tick nobody ran is recorded
RUN_SLACK = 180.0  # seconds of its replica and Consul up by which a claimed tick is completed
BACKFILL_EVERY = 900.0  # mean seconds between two operators' backfills (a stream of its own)
BACKFILL_SPAN = 1800.0  # how far back a backfill's range starts
BACKFILL_TICKS = 5  # at most the newest so many of the range's ticks nobody ran
ABORT_EVERY = 300.0  # mean seconds between two operators' aborts (a stream of its own)
ABORT_SLACK = 15.0  # seconds of its replica up by which an aborted run's body is gone: the
# note heard (2 s at most), SIGTERM, and SIGKILL kill_grace (5 s) later
ABORT_AGE = 10.0  # an operator aborts a run that has gone on this long at least
# seconds of its replica up, beyond kill_grace, by which a run of an overlap = "cancel" job is
# gone after the replica's turn at a later tick: a run told to end already (fenced at
# kill_after, 14 s, from its last confirmation; timed out) ends by its own bound, within it
CANCEL_SLACK = 15.0
CANCELLING = 3  # the SHAPES index of the overlap = "cancel" job: `@every 15s`
BUFFERING = 2  # the SHAPES index of the overlap = "buffer_one" job: `* * * * *`
T = TypeVar("T")

CLIENT_TIMEOUT = 10.0  # seconds a call other than a renewal waits for its answer
IN_FLIGHT = 24  # requests waiting for a slow answer at once, all replicas together
CHECK_EVERY = 1.0  # seconds between a checking body's run.check() calls
DRAIN = RUN_SLACK + SLACK + 60.0  # seconds run without faults at the end

TIMINGS = JobTimings(
    ttl=15.0,
    lock_delay=15.0,
    renew_interval=5.0,
    kill_grace=5.0,
    start_deadline=30.0,
    timeout=60.0,
)
# (schedule, zone, jitter, min_hold): the spec's shapes, @every and cron, one with a jitter,
# one with a min_hold, one in a zone with a DST change on the first night
SHAPES = (
    ("@every 10s", "UTC", 0.0, 0.0),
    ("@every 5s", "UTC", 0.0, 0.0),
    ("* * * * *", "UTC", 0.0, 0.0),
    ("@every 15s", "UTC", 3.0, 2.0),
    ("*/2 * * * *", "Europe/Berlin", 0.0, 0.0),
)
HISTORY = 50  # the default history_limit
CATCHUP_ALL = CatchupReach(window=600.0, limit=5)  # the "@every 10s" job's catchup = "all"
WINDOWED = (1, 2, 4)  # the SHAPES with a blackout window: the catch-up job among them
ALL_WINDOWED = 0  # the catchup = "all" job's shape: a window too, from a draw of its own
SETTLE = 40.0  # seconds after a (re)start before a replica counts as up: its first housekeeping
STOP_POLL = 0.1  # a stopping scheduler looks whether its core has stopped (SETTLE_POLL)
LEFT_TO_CONSUL = ("unanswered", "complete-abandoned")  # a stop does not wait for these


class Killed(BaseException):
    """Unwinds a killed replica's stack out of the store call it was in (nothing of the core
    catches it: a dead process runs no more code)."""


# -- plants: known bugs put into the core from outside ---------------------------------------------
def _no_fence(body: object, decision: object) -> None:
    return None


def _flag_only(run: held.HeldRun) -> bool:
    return not run.told


def _claim_anyway(record: TickRecord | None) -> bool:
    return True


def _record_nothing(*args: object) -> list[TickRecord]:
    return []


def _from_answer(sent: float, received: float) -> float:
    return received


def _no_cap(running: int, cap: int | None) -> str | None:
    return None


def _no_window(windows: object, tick: datetime) -> Blackout | None:
    return None


def _go_at_once(stopping: bool, runs: int, claims_out: int) -> bool:
    return stopping and runs == 0


def _backfill_anyway(record: TickRecord | None) -> bool:
    return True


def _backfill_nothing(record: TickRecord | None) -> bool:
    return False


def _stops_nothing(abort: AbortNote, tick: datetime, session: str) -> bool:
    return False


def _stops_any(abort: AbortNote, tick: datetime, session: str) -> bool:
    return True


def _never_cancel(policy: str, busy: Busy) -> OverlapAction:
    return OverlapAction.WAIT if busy.claim_or_run else OverlapAction.TAKE


def _buffered_never(record: TickRecord | None) -> bool:
    return False


def _taken(record: TickRecord | None) -> bool:
    """Whether a turn's read found its tick taken: a `buffered` one is not (it is claimed over
    that record by whoever finds the lock free: never a loser's write)."""
    return record is not None and record.outcome is not Outcome.BUFFERED


PLANTS: dict[str, tuple[str, Callable[..., object]]] = {
    "no-fence": ("apply_fence", _no_fence),
    "check-flag": ("vouched", _flag_only),
    "blind-claim": ("claimable", _claim_anyway),
    "no-missed": ("record_missed", _record_nothing),
    "late-confirm": ("confirmation_time", _from_answer),
    "no-cap": ("capacity_refusal", _no_cap),
    "no-blackout": ("holding_window", _no_window),
    "no-stop-wait": ("sessions_may_go", _go_at_once),
    "backfill-blind": ("may_backfill", _backfill_anyway),
    "backfill-none": ("may_backfill", _backfill_nothing),
    "abort-deaf": ("stops", _stops_nothing),
    "abort-any": ("stops", _stops_any),
    "cancel-deaf": ("overlap_action", _never_cancel),
    "buffer-dropped": ("still_buffered", _buffered_never),
}
_CORE_MODULES: tuple[ModuleType, ...] = (core, held, pool)


@contextlib.contextmanager
def planted(names: Sequence[str]) -> Iterator[None]:
    """Replace each named function wherever the core's modules hold it; restore after."""
    saved: list[tuple[ModuleType, str, object]] = []
    try:
        for name in names:
            attr, bug = PLANTS[name]
            original = next(getattr(m, attr) for m in _CORE_MODULES if hasattr(m, attr))
            for module in _CORE_MODULES:
                if getattr(module, attr, None) is original:
                    saved.append((module, attr, original))
                    setattr(module, attr, bug)
        yield
    finally:
        for module, attr, original in reversed(saved):
            setattr(module, attr, original)


# -- what a run is told and gives back -------------------------------------------------------------
@dataclass(frozen=True)
class SimConfig:
    seed: int = 1
    replicas: int = 3
    jobs: int = 5
    ticks: int = DEFAULT_TICKS
    plants: tuple[str, ...] = ()
    fault_every: float = FAULT_EVERY
    trace: int = TRACE
    keep_going: bool = False  # go on after a violation (else stop at the first)
    digest: bool = False  # a checksum of every event, to compare two runs
    caps: bool = True  # each replica's max_concurrent_runs drawn from the seed (else none)


@dataclass(frozen=True)
class Violation:
    invariant: str
    at: float
    detail: str


@dataclass(frozen=True)
class Report:
    seed: int
    ticks: int
    faults: int
    violations: tuple[Violation, ...]
    seconds: float  # real time the run took
    simulated: float  # virtual seconds
    trace: tuple[str, ...]
    digest: int
    counts: dict[str, int]

    def last_line(self) -> str:
        return (
            f"simulated {self.ticks} ticks, {self.faults} faults, {len(self.violations)} "
            f"violations in {self.seconds:.1f} s (seed {self.seed})"
        )


# -- the trace -------------------------------------------------------------------------------------
class Trace:
    """The last events (for a violation's report: those up to the first violation, which a
    step may run past before the run stops) and, when asked, a checksum of all. An event is
    kept as it came (formatted only when shown): most are never shown."""

    def __init__(self, keep: int, digest: bool) -> None:
        self.events: collections.deque[_Event] = collections.deque(maxlen=keep)
        self.digest = 0 if digest else None
        self.counts: collections.Counter[str] = collections.Counter()
        self.first_violation: tuple[_Event, ...] | None = None

    def add(
        self,
        at: float,
        who: str,
        kind: str,
        job: str = "",
        tick: datetime | None = None,
        what: str = "",
    ) -> None:
        event = (at, who, kind, job, tick, what)
        self.events.append(event)
        if kind == "VIOLATION" and self.first_violation is None:
            self.first_violation = tuple(self.events)
        self.counts[kind] += 1
        if self.digest is not None:
            self.digest = zlib.crc32(repr(event).encode(), self.digest)

    def lines(self) -> tuple[str, ...]:
        return tuple(
            f"  t={at:12.3f} {who:<6} {kind:<17} {job:<6} "
            + " ".join(part for part in ("" if tick is None else tick_name(tick), what) if part)
            for at, who, kind, job, tick, what in self.first_violation or self.events
        )


_Event = tuple[float, str, str, str, "datetime | None", str]


# -- a replica: its clock, its store, its bodies ----------------------------------------------
@dataclass(eq=False)
class _Handle:
    timer: Timer | None = None
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True
        if self.timer is not None:
            self.timer.cancel()


class ReplicaClock:
    """One incarnation's TimerClock: the shared time, this replica's wall (skewed as the
    faults say), timers that do not run while it is paused (held, then run in order on
    resume) nor after it was killed."""

    def __init__(self, replica: Replica, store: ReplicaStore) -> None:
        self.replica, self.world = replica, replica.world
        self.incarnation = replica.incarnation
        self._time = replica.world.clock
        self._store = store

    def wall(self) -> datetime:
        return self._time.wall() + self.replica.skew

    def monotonic(self) -> float:
        return self._time.monotonic()

    def sleep_until(self, deadline: float, event: object = None) -> bool:
        raise AssertionError("the core never sleeps: it waits through timers")

    def call_at(self, deadline: float, callback: Callable[[], object]) -> Cancellable:
        handle = _Handle()
        if self.replica.incarnation == self.incarnation:
            handle.timer = self._time.call_at(
                deadline, lambda: self.fire(handle, deadline, callback)
            )
        return handle

    def call_later(self, delay: float, callback: Callable[[], object]) -> Cancellable:
        return self.call_at(self._time.monotonic() + delay, callback)

    def prompt_at(self, deadline: float, callback: Callable[[], object]) -> Cancellable:
        handle = _Handle()
        if self.replica.incarnation == self.incarnation:
            handle.timer = self._time.prompt_at(
                deadline, lambda: self.fire(handle, deadline, callback)
            )
        return handle

    def send_at(self, deadline: float, call: Callable[[], T], answered: Answered[T]) -> Cancellable:
        return self.prompt_at(deadline, lambda: self._send(call, answered))

    def _send(self, call: Callable[[], T], answered: Answered[T]) -> None:
        """A call sent without waiting (a renewal): Consul handles it now, and its answer comes
        back after the store's delay as a prompt timer of this replica's (held while it is
        paused, gone with it when it is killed), never as a nested sleep: what
        ThreadTimerClock.send_at does."""
        sending, sent = _Sending(), self.monotonic()
        self._store.sending = sending
        try:
            answer = answer_of(call)
        finally:
            self._store.sending = None
        wait = min(sending.delay, sending.timeout)
        if sending.delay >= sending.timeout:
            answer = _timed_out(sending.timeout)
        else:
            answer = _then(answer, sending.then)
        if wait > 0:  # a connection waits for the answer meanwhile (IN_FLIGHT)
            self.world.in_flight += 1
            self._time.call_at(sent + wait, self.world.answered)
        self.prompt_at(sent + wait, lambda: answered(sent, answer))

    def fire(self, handle: _Handle, due: float, callback: Callable[[], object]) -> None:
        replica = self.replica
        if handle.cancelled or replica.incarnation != self.incarnation:
            return
        if replica.paused_until is not None:
            replica.held.append((due, next(self.world.order), handle, callback, self))
            return
        try:
            callback()
        except Killed:
            return
        self.world.after_step()


@dataclass
class _Sending:
    """A call made by ReplicaClock.send: its answer's delay, and what its answer does once it
    comes (the oracle hears of a renewal the core was answered only then)."""

    delay: float = 0.0
    timeout: float = CLIENT_TIMEOUT
    then: list[Callable[[], None]] = field(default_factory=list)


def _timed_out(timeout: float) -> Answer[T]:
    def raised() -> T:
        raise ConsulUnavailable(f"simulated: no answer within {timeout:g}s")

    return raised


def _then(answer: Answer[T], then: list[Callable[[], None]]) -> Answer[T]:
    def said() -> T:
        value = answer()  # an error said as it was; else what the answer does, then its value
        for step in then:
            step()
        return value

    return said


class ReplicaStore:
    """The store as one replica reaches it: the store's faults, and every answer shown to the
    oracle. A request is handled when sent; a slow answer comes back late, or not at all (a
    client timeout), while the rest of the world goes on (the virtual clock runs meanwhile)."""

    def __init__(self, replica: Replica) -> None:
        self.replica, self.world = replica, replica.world
        self.base = replica.world.store
        self.incarnation = replica.incarnation
        self.taken: dict[str, datetime] = {}  # job -> the tick the latest answer found taken
        self.sending: _Sending | None = None  # a call ReplicaClock.send makes now

    def _send(self) -> float:
        """Before a request: Consul reached, or ConsulNotReached; the answer's delay. While
        Consul is slow, the requests waiting for their answers are each a nested sleep of the
        one thread: at most IN_FLIGHT at once, beyond which a request fails as a client with
        no free connection would (and the nesting stays bounded)."""
        world = self.world
        if world.down_until is not None:
            raise ConsulNotReached("simulated: Consul is unreachable")
        if world.slow_until is None:
            return 0.0
        if world.in_flight >= IN_FLIGHT:
            raise ConsulNotReached("simulated: every connection waits for an answer")
        return world.rng.uniform(0.0, world.slow_max)

    def _answer(self, delay: float, timeout: float = CLIENT_TIMEOUT) -> None:
        """After the request was handled: the answer's delay (the world goes on), or a client
        timeout; and the replica's fate meanwhile (paused: it waits; killed: it is gone)."""
        if self.sending is not None:  # sent, not waited for: the answer comes by a timer
            self.sending.delay, self.sending.timeout = delay, timeout
            return
        if delay <= 0:
            return  # answered at once: nothing happened meanwhile
        clock, replica, world = self.world.clock, self.replica, self.world
        world.in_flight += 1
        due = clock.monotonic() + min(delay, timeout)
        replica.waits.append(due)
        try:
            clock.sleep_until(due)
            while replica.paused_until is not None and replica.incarnation == self.incarnation:
                clock.sleep_until(replica.paused_until)
        finally:
            world.in_flight -= 1
            replica.waits.remove(due)
        if replica.incarnation != self.incarnation:
            raise Killed
        if delay >= timeout:
            raise ConsulUnavailable(f"simulated: no answer within {timeout:g}s")

    def create_session(self, terms: SessionTerms) -> str:
        delay = self._send()
        session = self.base.create_session(terms)
        self.replica.sessions[:] = [*self.replica.sessions[-7:], session]  # the recent ones
        self._answer(delay)
        return session

    def renew_session(self, session_id: str, *, timeout: float | None = None) -> None:
        limit = CLIENT_TIMEOUT if timeout is None else timeout
        delay, at = self._send(), self.world.clock.monotonic()
        self.base.renew_session(session_id)
        self._answer(delay, limit)
        self._answered(functools.partial(self.world.oracle.confirmed.__setitem__, session_id, at))

    def _answered(self, step: Callable[[], None]) -> None:
        """What an answer does once the core has it (the oracle's confirmation: it counts)."""
        if self.sending is not None:
            self.sending.then.append(step)
        else:
            step()

    def destroy_session(self, session_id: str) -> None:
        delay = self._send()
        self.base.destroy_session(session_id)
        self._answer(delay)

    def claim(
        self,
        job: JobKeys,
        record: TickRecord,
        session_id: str,
        holder: bytes,
        terms: ClaimTerms = PLAIN,
    ) -> Claim:
        delay, at = self._send(), self.world.clock.monotonic()
        if not (record.catchup or record.backfill):  # they judge on reads of their own
            self.world.oracle.claiming(self.replica, job.name, record.tick, self.taken)
        claim = self.base.claim(job, record, session_id, holder, terms)
        if claim.won:
            self.world.oracle.claimed(self.replica, job.name, record.tick, at)
        self._answer(delay)
        return claim

    def claim_many(self, claims: Sequence[ClaimCall]) -> list[ClaimAnswer]:
        """One request for several claims (a transaction on Consul): one delay, one fate; each
        claim judged by the oracle as it is handled."""
        delay, at = self._send(), self.world.clock.monotonic()
        oracle, answers = self.world.oracle, list[ClaimAnswer]()
        for call in claims:
            name, tick = call.job.name, call.record.tick
            if not (call.record.catchup or call.record.backfill):
                oracle.claiming(self.replica, name, tick, self.taken)
            [answer] = self.base.claim_many([call])
            if isinstance(answer, Claim) and answer.won:
                oracle.claimed(self.replica, name, tick, at)
            answers.append(answer)
        self._answer(delay)
        return answers

    def complete(
        self, job: JobKeys, record: TickRecord, session_id: str, *, release: bool
    ) -> Completion:
        try:
            delay = self._send()
        except ConsulUnavailable:
            return Completion(False, None)
        completion = self.base.complete(job, record, session_id, release=release)
        if completion.recorded or completion.released is not None:  # not `running` any more
            self.world.oracle.settled(job.name, record.tick)
        try:
            self._answer(delay)
        except ConsulUnavailable:
            return Completion(False, None)
        return completion

    def complete_many(self, completions: Sequence[CompleteCall]) -> list[Completion]:
        """One request for several completions (a transaction on Consul): one delay, one
        fate; unanswered, each completion may have been applied (its record settled)."""
        unanswered = [Completion(False, None)] * len(completions)
        try:
            delay = self._send()
        except ConsulUnavailable:
            return unanswered
        answers = self.base.complete_many(completions)
        for call, completion in zip(completions, answers, strict=True):
            if completion.recorded or completion.released is not None:
                self.world.oracle.settled(call.job.name, call.record.tick)
        try:
            self._answer(delay)
        except ConsulUnavailable:
            return unanswered
        return answers

    def read_tick(
        self, job: JobKeys, tick: datetime, *, stale: bool = False
    ) -> tuple[TickRecord | None, datetime | None]:
        delay = self._send()
        record, date = self.base.read_tick(job, tick, stale=stale)
        self._answer(delay)
        # what the replica knows from its latest answer at a turn (a stale read: a slow one
        # may come after another read of the same tick answered meanwhile: the later answer is
        # what it acts on). A look at a tick's fate, or a catch-up's, reads consistently, and
        # may run while a claim decided on an earlier answer is in flight: not this invariant's.
        if not stale:
            return record, date
        if _taken(record):
            self.taken[job.name] = tick
        elif self.taken.get(job.name) == tick:
            del self.taken[job.name]
        return record, date

    def read_turns(self, turns: Sequence[tuple[JobKeys, datetime]]) -> list[TurnRead]:
        """One request for the reads of several turns (a read-only transaction on Consul):
        one delay, one fate; each answer then known as read_tick's is."""
        delay = self._send()
        read = [self.base.read_tick(job, tick, stale=True) for job, tick in turns]
        self._answer(delay)
        for (job, tick), (record, _) in zip(turns, read, strict=True):
            if _taken(record):
                self.taken[job.name] = tick
            elif self.taken.get(job.name) == tick:
                del self.taken[job.name]
        answers: list[TurnRead] = [*read]
        return answers

    def read_ticks(self, job: JobKeys, *, stale: bool = False) -> list[TickRecord]:
        delay = self._send()
        records = self.base.read_ticks(job, stale=stale)
        self._answer(delay)
        return records

    def read_tick_names(self, job: JobKeys) -> tuple[set[datetime], datetime | None]:
        delay = self._send()
        names = self.base.read_tick_names(job)
        self._answer(delay)
        return names

    def record_unrun(self, job: JobKeys, records: Sequence[TickRecord]) -> list[TickRecord]:
        delay = self._send()
        written = self.base.record_unrun(job, records)
        self.world.oracle.unrun(job.name, written)
        self._answer(delay)
        return written

    def prune(self, job: JobKeys, ticks: Iterable[datetime]) -> int:
        delay = self._send()
        ticks = list(ticks)
        pruned = self.base.prune(job, ticks)
        self.world.oracle.pruned(job.name, ticks[:pruned])
        self._answer(delay)
        return pruned

    def read_control(self, job: JobKeys) -> ControlState:
        delay = self._send()
        control = self.base.read_control(job)
        self._answer(delay)
        return control

    def watch_lock(self, job: JobKeys, index: int, wait: float) -> tuple[str | None, int]:
        raise AssertionError("the core does not block on a watch")


class SimBody:
    """A body as the simulation draws it: it ends after `duration` (None: it hangs), checks
    the lock every CHECK_EVERY when `checks`, and ends `grace` after a TERMINATE unless it
    ignores it (then only KILL ends it). It runs on its replica's clock: frozen with it."""

    def __init__(self, replica: Replica, job: str, tick: datetime, shape: BodyShape) -> None:
        self.replica, self.job, self.tick, self.shape = replica, job, tick, shape
        self.clock = replica.clock
        self.end: BodyEnd | None = None
        self.run: Run | None = None
        self.claim_sent = 0.0  # the claim's send time: the first confirmation
        self._ended: Callable[[], None] = lambda: None

    @property
    def ending(self) -> BodyEnd | None:
        return self.end

    @property
    def frozen(self) -> bool:
        return self.replica.paused_until is not None

    def start(self, run: Run, ended: Callable[[], None]) -> None:
        self.run, self._ended = run, ended
        self.replica.world.oracle.started(self)
        if self.shape.duration is not None:
            status = self.shape.status
            self.clock.call_later(self.shape.duration, lambda: self._finish(status))
        if self.shape.checks:
            self.clock.call_later(CHECK_EVERY, self._check)

    def stop(self, how: StopHow) -> None:
        if self.end is not None:
            return
        if how is StopHow.KILL:
            self.die(-9)
            self.clock.call_later(0.0, self._ended)
        elif not self.shape.ignores_term:
            self.clock.call_later(self.shape.grace, lambda: self._finish(-15))

    def _check(self) -> None:
        if self.end is not None or self.run is None:
            return
        safe = self.run.safe()
        self.replica.world.oracle.checked(self, safe)
        if safe:
            self.clock.call_later(CHECK_EVERY, self._check)
        else:
            self._finish(75)  # it stops itself: the lock is not ours any more

    def _finish(self, status: int) -> None:
        if self.end is None:
            self.die(status)
            self._ended()

    def die(self, status: int) -> None:
        """Ended (also with its replica: a killed runner's namespace dies with it)."""
        if self.end is None:
            self.end = BodyEnd(status)
            self.replica.world.oracle.ended(self)


@dataclass(frozen=True)
class BodyShape:
    duration: float | None  # None: it hangs
    status: int
    checks: bool
    ignores_term: bool
    grace: float


@dataclass(eq=False)
class Replica:
    """One replica (one `lockctl schedule` process) through its kills and restarts."""

    world: World
    name: str
    incarnation: int = 0
    alive: bool = False
    booted_at: float = 0.0
    paused_until: float | None = None
    skew: timedelta = timedelta(0)
    held: list[tuple[float, int, _Handle, Callable[[], object], ReplicaClock]] = field(
        default_factory=list
    )
    sessions: list[str] = field(default_factory=list)
    hang_next: bool = False
    cap: int | None = None  # its max_concurrent_runs (None: no cap)
    stopping: bool = False  # a SIGTERM came: the process ends once its core has stopped
    # the deadlines of its store calls' answers waited for now (nested sleeps, see stalled)
    waits: list[float] = field(default_factory=list)
    excused: set[tuple[str, datetime]] = field(default_factory=set)  # left to Consul
    core: TickCore | None = None
    clock: ReplicaClock = field(init=False)

    def boot(self) -> None:
        world = self.world
        self.incarnation += 1
        self.alive, self.booted_at = True, world.clock.monotonic()
        self.paused_until, self.sessions, self.stopping = None, [], False
        self.excused = set()
        store = ReplicaStore(self)
        self.clock = ReplicaClock(self, store)
        identity = Identity(self.name, host=self.name)
        self.core = TickCore(store, self.clock, identity, world.jobs, self._body, self._note)
        self.core.capacity = self.cap
        world.trace.add(world.clock.monotonic(), self.name, "boot")
        self.core.start()
        for job, pending in world.triggers.items():  # the trigger watch's first answer
            self.hear(job, pending.note)
        for job, asked in world.backfills.items():
            self.hear_backfill(job, asked.note)
        for job, abort in world.abort_notes.items():  # the key stays: heard at every boot
            self.hear_abort(job, abort)

    def hear(self, job: str, note: ControlNote) -> None:
        """The trigger watch's answer reaches the core a moment later, on the core's thread."""
        core_now = self.core
        if core_now is None:
            return
        later = self.world.rng.uniform(0.0, 2.0)
        self.clock.call_later(later, lambda: core_now.trigger(job, note))

    def hear_backfill(self, job: str, note: BackfillNote) -> None:
        """The control watch's answer of a backfill, as of a trigger."""
        core_now = self.core
        if core_now is None:
            return
        later = self.world.rng.uniform(0.0, 2.0)
        self.clock.call_later(later, lambda: core_now.backfill(job, note))

    def hear_abort(self, job: str, abort: AbortNote) -> None:
        """The control watch's answer of an abort, as of a trigger."""
        core_now = self.core
        if core_now is None:
            return
        later = self.world.rng.uniform(0.0, 2.0)
        self.clock.call_later(later, lambda: core_now.abort(job, abort))

    def kill(self) -> None:
        self.incarnation += 1
        self.alive, self.core, self.paused_until, self.stopping = False, None, None, False
        self.held.clear()
        self.world.oracle.killed(self)

    def stop(self, exited: Callable[[], object]) -> None:
        """SIGTERM: the core's stop on a prompt timer (scheduler/on_core.py `_stop_cores`),
        then the process ends as soon as its core says it has stopped (`exited` told):
        whatever the core's thread was still waiting for then (a claim's answer) is never
        acted on."""
        core = self.core
        assert core is not None
        self.stopping = True
        now = self.clock.monotonic()
        self.clock.prompt_at(now, core.stop)
        until = functools.partial(self._until_stopped, core, exited)
        self.clock.prompt_at(now + STOP_POLL, until)

    def _until_stopped(self, core: TickCore, exited: Callable[[], object]) -> None:
        if core.stopping and not core.runs and core.pool.closed:
            self.world.change("exited", self.name, self._exit)
            exited()
            return
        again = functools.partial(self._until_stopped, core, exited)
        self.clock.prompt_at(self.clock.monotonic() + STOP_POLL, again)

    def _exit(self) -> None:
        self.incarnation += 1  # a store call it was still in unwinds (Killed)
        self.alive, self.core, self.paused_until, self.stopping = False, None, None, False
        self.held.clear()
        self.world.oracle.exited(self)

    def pause(self, until: float) -> None:
        self.paused_until = until

    def resume(self) -> None:
        """Wake: what came due meanwhile runs now, in the order it came due."""
        self.paused_until = None
        now = self.world.clock.monotonic()
        for due, _, handle, callback, clock in sorted(self.held, key=lambda h: (h[0], h[1])):
            if clock.incarnation == self.incarnation and not handle.cancelled:
                again = functools.partial(clock.fire, handle, due, callback)
                handle.timer = self.world.clock.call_at(now, again)
        self.held.clear()

    def _body(self, job: str, tick: datetime) -> SimBody:
        rng = self.world.rng
        if self.hang_next:
            self.hang_next = False
            shape = BodyShape(None, 0, False, rng.random() < 0.5, rng.uniform(0.0, 3.0))
        else:
            # most end well within their interval; some outlast it (the next ticks then find
            # the lock held), past the fencing bounds too (renewed meanwhile)
            gap = self.world.intervals[job]
            long = rng.random() < 0.05
            duration = gap * (rng.uniform(1.0, 4.0) if long else rng.uniform(0.02, 0.5))
            status = 0 if rng.random() < 0.9 else 1
            term = rng.random() < 0.2
            shape = BodyShape(duration, status, rng.random() < 0.5, term, rng.uniform(0.0, 3.0))
        return SimBody(self, job, tick, shape)

    def _note(self, note: Note) -> None:
        now = self.world.clock.monotonic()
        record = note.record
        kind = note.kind
        if kind == "missed" and record is not None and record.outcome is Outcome.BLACKOUT:
            kind = "missed-blackout"  # a fate look's record of a window's tick: no miss
        self.world.trace.add(now, self.name, kind, note.job, note.tick, note.detail)
        if note.kind == "claimed" and record is not None and (record.catchup or record.trigger):
            kind = "caught-up" if record.catchup else "trigger-run"
            self.world.trace.add(now, self.name, kind, note.job, note.tick)
        if note.kind == "claimed" and record is not None and record.backfill:
            self.world.trace.add(now, self.name, "backfill-run", note.job, note.tick)
        if note.kind == "completed" and record is not None and record.outcome is Outcome.ABORTED:
            self.world.trace.add(now, self.name, "aborted-run", note.job, note.tick)
            if (note.job, record.tick) not in self.world.aborted:
                self.world.oracle.fail("abort-stray", f"{note.job} {tick_name(record.tick)}")
        if note.kind == "due" and note.tick is not None:
            self.world.oracle.turn(self, note.job, note.tick)
        if note.kind == "cancelled" and note.tick is not None:
            self.world.oracle.cancelled[(note.job, note.tick)] = now
        if note.kind == "completed" and record is not None and record.outcome is Outcome.CANCELLED:
            self.world.trace.add(now, self.name, "cancelled-run", note.job, note.tick)
        if note.skip is SkipReason.AT_CAPACITY:  # counted apart: passed on to the next replica
            self.world.trace.add(now, self.name, "at-capacity", note.job, note.tick)
        if note.kind in LEFT_TO_CONSUL and note.tick is not None:
            self.excused.add((note.job, note.tick))


def stalled_from(replica: Replica) -> float:
    """Since when the replica's thread is held by another's wait (math.inf: it is not): the
    one thread's nested sleeps end last-in first-out, so a store call's answer due while a
    deeper call waits (another replica's, paused for minutes) is acted on only after it.
    In a real process the answer comes on time: the simulator's artifact, counted as a pause
    (no up-time), not as the replica's slowness."""
    return min(replica.waits, default=math.inf)


# -- the oracle -------------------------------------------------------------------------------
@dataclass(eq=False)
class _Fate:
    """What the ledger says of a tick, as the oracle saw it written."""

    state: str  # running | done | abandoned | buffered
    replica: str = ""
    incarnation: int = 0
    up_at: float = 0.0  # the replica's up-time when it claimed


@dataclass(eq=False)
class _Pending:
    job: str
    tick: datetime
    up_at: float  # the fleet's up-time when the tick's window closed


@dataclass(frozen=True)
class _Trigger:
    note: ControlNote
    up_at: float  # the fleet's up-time when it was asked


@dataclass
class _Abort:
    body: SimBody  # the run it names
    up_at: float  # its replica's up-time when it was asked


@dataclass
class _Backfill:
    note: BackfillNote
    up_at: float  # the fleet's up-time when it was asked


class Oracle:
    """Every invariant, checked as the world goes (see the module's docstring)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.violations: list[Violation] = []
        self.alive: dict[str, list[SimBody]] = collections.defaultdict(list)
        self.started_ticks: dict[tuple[str, datetime], float] = {}
        self.tokens: dict[str, int] = {}
        self.tokens_of: dict[tuple[str, datetime], int] = {}  # each tick's run's token
        self.confirmed: dict[str, float] = {}  # session -> newest answered renewal's send
        self.claims: dict[tuple[str, datetime], float] = {}  # won claims' send times
        self.fates: dict[tuple[str, datetime], _Fate] = {}
        self.pending: list[_Pending] = []
        self.open: set[tuple[str, datetime]] = set()  # ticks registered, not accounted for
        self.cursor: dict[str, datetime] = {}
        self.windows: dict[str, float] = {}
        self.up_fleet = 0.0
        self.up: dict[str, float] = {}
        self.updated = 0.0
        self.suspects: dict[int, float] = {}  # id(body) -> when first seen past its bound
        self.crowded: set[str] = set()  # jobs with two bodies alive or more
        self.unheeded: dict[int, _Abort] = {}  # id(body) -> a later tick's turn came (cancel)
        self.cancelled: dict[tuple[str, datetime], float] = {}  # a run told to end, when
        self.ticks = 0
        bounds = fence_bounds(TIMINGS, held.renew_timeout(TIMINGS))
        self.fence_after, self.kill_after = bounds.fence_after, bounds.kill_after

    def fail(self, invariant: str, detail: str) -> None:
        now = self.world.clock.monotonic()
        self.violations.append(Violation(invariant, now, detail))
        self.world.trace.add(now, "oracle", "VIOLATION", "", None, f"{invariant}: {detail}")

    # -- bodies ----------------------------------------------------------------------------------
    def started(self, body: SimBody) -> None:
        assert body.run is not None
        key, run = (body.job, body.tick), body.run
        now = self.world.clock.monotonic()
        if not body.tick.microsecond and holding_window(self._windows(body.job), body.tick):
            self.fail("blackout-run", f"{body.job} {tick_name(body.tick)} runs in a window")
        if key in self.started_ticks and not self._retry(body):
            self.fail("tick-twice", f"{body.job} {tick_name(body.tick)} started again")
        self.started_ticks[key] = now
        self.tokens_of[key] = run.lock_index
        if run.lock_index <= self.tokens.get(body.job, 0) and not self._retry(body):
            self.fail(
                "token",
                f"{body.job}: lock index {run.lock_index} after {self.tokens[body.job]}",
            )
        self.tokens[body.job] = max(run.lock_index, self.tokens.get(body.job, 0))
        body.claim_sent = self.claims.get(key, now)
        self.alive[body.job].append(body)
        if len(self.alive[body.job]) > 1:
            self.crowded.add(body.job)
        self._within_cap(body)
        self.world.trace.add(
            now, body.replica.name, "body-start", body.job, body.tick, f"idx {run.lock_index}"
        )

    def _within_cap(self, body: SimBody) -> None:
        """A replica's bodies alive at once (a frozen one's too: it still runs there) never
        outnumber its cap."""
        cap = body.replica.cap
        if cap is None:
            return
        here = [b for bodies in self.alive.values() for b in bodies if b.replica is body.replica]
        if len(here) > cap:
            self.fail(
                "over-cap",
                f"{body.replica.name} runs {len(here)} at once (cap {cap}): "
                + ", ".join(f"{b.job} {tick_name(b.tick)}" for b in here),
            )

    def _windows(self, job: str) -> tuple[Blackout, ...]:
        return self.world.job_named[job].blackouts

    def _retry(self, body: SimBody) -> bool:
        """A later attempt of a tick's run: under the claim's own fencing token, once the
        attempt before it ended (others' runs beside it are the overlap invariant's)."""
        assert body.run is not None
        key = (body.job, body.tick)
        same_claim = body.run.attempt > 1 and self.tokens_of.get(key) == body.run.lock_index
        earlier = [b for b in self.alive[body.job] if b.tick == body.tick and b is not body]
        return same_claim and not earlier

    def ended(self, body: SimBody) -> None:
        self.alive[body.job].remove(body)
        if len(self.alive[body.job]) < 2:
            self.crowded.discard(body.job)
        self.suspects.pop(id(body), None)
        status = body.end.exit_status if body.end is not None else None
        now = self.world.clock.monotonic()
        self.world.trace.add(
            now, body.replica.name, "body-end", body.job, body.tick, f"status {status}"
        )

    def last_confirmed(self, body: SimBody) -> float:
        assert body.run is not None
        return max(body.claim_sent, self.confirmed.get(body.run.session, body.claim_sent))

    def checked(self, body: SimBody, safe: bool) -> None:
        now = self.world.clock.monotonic()
        if safe and now >= self.last_confirmed(body) + self.fence_after:
            late = now - self.last_confirmed(body)
            self.fail(
                "check-after-bound",
                f"{body.job} {tick_name(body.tick)} on {body.replica.name}: check() passed "
                f"{late:.2f}s after its last confirmation (bound {self.fence_after:g}s)",
            )

    def turn(self, replica: Replica, job: str, tick: datetime) -> None:
        """A replica's turn at a tick of an overlap = "cancel" job: a run of it that replica
        holds, of an earlier tick, is to be gone kill_grace + CANCEL_SLACK of its up-time on."""
        if self.world.job_named[job].overlap != OVERLAP_CANCEL:
            return
        self.settle()
        up = self.up.get(replica.name, 0.0)
        for body in self.alive[job]:
            if body.replica is replica and body.tick < tick and id(body) not in self.unheeded:
                self.unheeded[id(body)] = _Abort(body, up)

    def cancels(self) -> None:
        """cancel-unheeded (see `turn`) and cancel-overlap: a body recorded cancelled runs
        beside another of its job past kill_grace (+ a second) since it was told to end."""
        now = self.world.clock.monotonic()
        for key, due in list(self.unheeded.items()):
            body = due.body
            grace = self.world.job_named[body.job].timings.kill_grace
            if body not in self.alive[body.job]:
                del self.unheeded[key]
            elif self.up.get(body.replica.name, 0.0) - due.up_at > grace + CANCEL_SLACK:
                self.fail(
                    "cancel-unheeded",
                    f"{body.job} {tick_name(body.tick)} on {body.replica.name}: a later "
                    "tick's turn came and it still runs",
                )
                del self.unheeded[key]
        for (job, tick), told in list(self.cancelled.items()):
            grace = self.world.job_named[job].timings.kill_grace
            running = [b for b in self.alive[job] if not b.frozen]
            stopped = [b for b in running if b.tick == tick]
            if not stopped and not any(b.tick == tick for b in self.alive[job]):
                del self.cancelled[(job, tick)]
            elif stopped and len(running) > 1 and now - told > grace + 1.0:
                self.fail("cancel-overlap", f"{job} {tick_name(tick)} runs beside the next run")
                del self.cancelled[(job, tick)]

    def overlaps(self) -> None:
        now = self.world.clock.monotonic()
        for job in sorted(self.crowded):
            bodies = self.alive[job]
            running = [b for b in bodies if not b.frozen]
            if len(running) < 2:
                continue
            for body in running:
                past = now - self.last_confirmed(body)
                if past <= self.kill_after:
                    continue
                seen = self.suspects.setdefault(id(body), now)
                if now > seen:
                    others = ", ".join(
                        f"{b.replica.name} {tick_name(b.tick)}" for b in running if b is not body
                    )
                    self.fail(
                        "overlap",
                        f"{job} {tick_name(body.tick)} on {body.replica.name} runs {past:.2f}s "
                        f"after its last confirmation (bound {self.kill_after:g}s) beside {others}",
                    )
                    self.suspects[id(body)] = float("inf")

    # -- the store's answers ---------------------------------------------------------------------
    def claiming(
        self, replica: Replica, job: str, tick: datetime, taken: dict[str, datetime]
    ) -> None:
        if taken.get(job) == tick:
            self.fail(
                "loser-wrote",
                f"{replica.name} claims {job} {tick_name(tick)}, which its read found taken",
            )

    def claimed(self, replica: Replica, job: str, tick: datetime, at: float) -> None:
        self.claims[(job, tick)] = at
        self.settle()
        up = self.up.get(replica.name, 0.0)
        self._mark(job, tick, _Fate("running", replica.name, replica.incarnation, up))

    def settled(self, job: str, tick: datetime) -> None:
        self._mark(job, tick, _Fate("done"))

    def _mark(self, job: str, tick: datetime, fate: _Fate) -> None:
        """What the ledger says of a tick not accounted for yet (one accounted for already,
        written again by a retry or retention, changes nothing). A trigger's instant is not a
        scheduled tick: its trigger is accounted for by `triggers`."""
        if tick.microsecond:
            return
        cursor = self.cursor.get(job)
        if cursor is None or tick >= cursor or (job, tick) in self.open:
            self.fates[(job, tick)] = fate

    def unrun(self, job: str, written: Sequence[TickRecord]) -> None:
        now = self.world.wall()
        for record in written:
            closes = record.tick + timedelta(seconds=self.window(job, record.tick))
            if record.outcome is Outcome.BUFFERED:  # at a turn while the job ran: not a miss
                self.settle()
                self._mark(job, record.tick, _Fate("buffered", up_at=self.up_fleet))
                continue
            if record.outcome is Outcome.BLACKOUT:  # recorded at the turn: not a miss
                held_by = holding_window(self._windows(job), record.tick)
                if held_by is None or held_by.name != record.window:
                    self.fail("blackout-stray", f"{job} {tick_name(record.tick)} {record.window}")
                when = self.world.clock.monotonic()
                self.world.trace.add(when, "store", "blackout-record", job, record.tick)
            elif now < closes:
                self.fail(
                    "missed-too-early",
                    f"{job} {tick_name(record.tick)} recorded {record.outcome.value} "
                    f"{(closes - now).total_seconds():.2f}s before its window closed",
                )
            self._mark(job, record.tick, _Fate("done"))

    def pruned(self, job: str, ticks: Sequence[datetime]) -> None:
        """Retention deleted these records: what they said is gone, whatever it was (a run
        still `running` there, by a replica asleep past history_limit ticks, is counted)."""
        for tick in ticks:
            fate = self.fates.get((job, tick))
            if fate is not None and fate.state == "running":
                now = self.world.clock.monotonic()
                self.world.trace.add(now, "store", "pruned-running", job, tick)
                fate.state = "done"

    def killed(self, replica: Replica) -> None:
        for fate in self.fates.values():
            if fate.state == "running" and fate.replica == replica.name:
                fate.state = "abandoned"
        for bodies in list(self.alive.values()):
            for body in [b for b in bodies if b.replica is replica]:
                body.die(-9)

    def exited(self, replica: Replica) -> None:
        """The end of a graceful stop: every run of the replica's completed, every body gone."""
        for (job, tick), fate in self.fates.items():
            mine = fate.state == "running" and fate.replica == replica.name
            if mine and (job, tick) not in replica.excused:
                self.fail("stop-left-running", f"{job} {tick_name(tick)} by {replica.name}")
        for bodies in list(self.alive.values()):
            for body in [b for b in bodies if b.replica is replica]:
                self.fail("stop-left-running", f"{body.job} {tick_name(body.tick)}: body alive")
        self.killed(replica)  # what was excused is left to its TTL, as a kill's

    # -- accounting ------------------------------------------------------------------------------
    def settle(self) -> None:
        """Count up-time to now: Consul answering and some replica up (the fleet's), and each
        replica's own. Called before anything they depend on changes (World.change) and
        before the accounting; a replica is up from SETTLE after its boot."""
        world = self.world
        now = world.clock.monotonic()
        last, self.updated = self.updated, now
        if now <= last or world.down_until is not None or world.slow_until is not None:
            return
        since = now
        for replica in world.replicas:
            if replica.alive and replica.paused_until is None:
                began = max(last, replica.booted_at + SETTLE)
                ended = min(now, stalled_from(replica))
                if began < ended:
                    self.up[replica.name] = self.up.get(replica.name, 0.0) + ended - began
                    since = min(since, began)
        self.up_fleet += now - since

    def window(self, job: str, tick: datetime) -> float:
        spec = self.world.job_named[job]
        return claim_window(spec.schedule, tick, spec.timings.start_deadline)

    def account(self) -> None:
        """Register the ticks whose window closed; judge those not yet accounted for."""
        self.settle()
        now = self.world.wall()
        for spec in self.world.jobs:
            tick = self.cursor.get(spec.name) or spec.schedule.latest_tick_at_or_before(START)
            while tick + timedelta(seconds=self.window(spec.name, tick)) <= now:
                self.pending.append(_Pending(spec.name, tick, self.up_fleet))
                self.open.add((spec.name, tick))
                self.ticks += 1
                tick = spec.schedule.next_ticks(tick, 1)[0]
            self.cursor[spec.name] = tick
        self.pending = [p for p in self.pending if not self._accounted(p)]
        self.triggers()
        self.backfills()
        self.aborts()
        self.cancels()

    def triggers(self) -> None:
        """A pending trigger is taken (the job's taken-trigger key names it) within
        RUN_SLACK + SLACK of the fleet's up-time: it may wait for a long run of the job."""
        world = self.world
        for job, pending in list(world.triggers.items()):
            taken = world.store.read_control(world.job_named[job].keys).taken
            if pending.note.id is not None and taken == pending.note.id.encode():
                del world.triggers[job]
            elif self.up_fleet - pending.up_at > RUN_SLACK + SLACK:
                self.fail("trigger-unrun", f"{job} trigger {pending.note.id}: not taken")
                del world.triggers[job]

    def aborts(self) -> None:
        """The run an abort names is gone once its replica has been up ABORT_SLACK since."""
        for key, asked in list(self.world.aborts.items()):
            body = asked.body
            if body not in self.alive[body.job]:
                del self.world.aborts[key]
            elif self.up.get(body.replica.name, 0.0) - asked.up_at > ABORT_SLACK:
                self.fail(
                    "abort-unstopped", f"{body.job} {tick_name(body.tick)} on {body.replica.name}"
                )
                del self.world.aborts[key]

    def backfills(self) -> None:
        """A pending backfill's ticks are each run (or found run: may_backfill says no) within
        RUN_SLACK + SLACK of the fleet's up-time per tick; a tick whose record retention
        deleted since (beyond_ledger) is never run, as the core decides."""
        world = self.world
        for job, asked in list(world.backfills.items()):
            keys = world.job_named[job].keys
            records = {record.tick: record for record in world.store.read_ticks(keys)}
            left = [
                tick
                for tick in asked.note.ticks
                if may_backfill(records.get(tick))
                and not (tick not in records and beyond_ledger(tick, records.keys()))
            ]
            if not left:
                del world.backfills[job]
            elif self.up_fleet - asked.up_at > (RUN_SLACK + SLACK) * len(asked.note.ticks):
                self.fail("backfill-unrun", f"{job} backfill {asked.note.id}: {tick_name(left[0])}")
                del world.backfills[job]

    def _accounted(self, pending: _Pending) -> bool:
        key = (pending.job, pending.tick)
        fate = self.fates.get(key)
        if fate is not None and fate.state not in ("running", "buffered"):
            del self.fates[key]
            self.claims.pop(key, None)
            self.open.discard(key)
            return True
        if fate is None:
            late = self.up_fleet - pending.up_at > SLACK
            what = "no record"
        elif fate.state == "buffered":
            deadline = self.world.job_named[pending.job].timings.start_deadline
            if self.up_fleet - fate.up_at > deadline + SLACK:
                self.fail("buffered-lost", f"{pending.job} {tick_name(pending.tick)}: buffered")
                self.fates.pop(key, None)
                self.open.discard(key)
                return True
            return False
        else:
            late = self.up.get(fate.replica, 0.0) - fate.up_at > RUN_SLACK
            what = f"still running on {fate.replica}"
        if late:
            self.fail("unaccounted", f"{pending.job} {tick_name(pending.tick)}: {what}")
            self.fates.pop(key, None)
            self.open.discard(key)
            return True
        return False

    def forget(self, before: float) -> None:
        """Drop what no check can ask about any more (a long soak stays small)."""
        old = [key for key, at in self.started_ticks.items() if at < before]
        for key in old:
            del self.started_ticks[key]
        for key in [k for k in self.claims if k not in self.fates and k not in self.started_ticks]:
            del self.claims[key]
        recent = {session for replica in self.world.replicas for session in replica.sessions}
        for session in [s for s in self.confirmed if s not in recent]:
            del self.confirmed[session]


# -- the world --------------------------------------------------------------------------------
class World:
    """The virtual time, Consul in memory, the replicas, the faults and the oracle."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.clock = VirtualClock(START)
        self.store = MemoryTickStore(self.clock, seed=config.seed)
        self.trace = Trace(config.trace, config.digest)
        self.order = itertools.count()
        self.down_until: float | None = None
        self.slow_until: float | None = None
        self.slow_max = 0.0
        self.in_flight = 0  # requests waiting for their answer (nested sleeps, renewals sent)
        self.faults = 0
        self.faulting = True
        self.triggers: dict[str, _Trigger] = {}  # by job: an operator's trigger not taken yet
        self.backfills: dict[str, _Backfill] = {}  # by job: an operator's backfill not run yet
        self.abort_notes: dict[str, AbortNote] = {}  # by job: its abort key (it stays)
        self.aborts: dict[tuple[str, datetime], _Abort] = {}  # the runs named, still alive
        self.aborted: set[tuple[str, datetime]] = set()  # every run an abort named
        self.abort_draw = random.Random(f"abort-{config.seed}")  # the faults' stay
        self.backfill_draw = random.Random(f"backfill-{config.seed}")  # the faults' stay
        self.asked = itertools.count(1)
        names = tuple(f"w{n + 1}" for n in range(config.replicas))
        self.jobs = make_jobs(config.jobs, names, config.seed)
        self.job_named = {job.name: job for job in self.jobs}
        self.intervals = {job.name: _interval(job) for job in self.jobs}
        self.replicas = [Replica(self, name) for name in names]
        if config.caps:  # from a stream of their own: the faults drawn stay the seed's
            caps = random.Random(f"caps {config.seed}")
            for n, replica in enumerate(self.replicas):  # the first always capped
                replica.cap = caps.choice((1, 2) if n == 0 else (None, 1, 2, 3))
        self.oracle = Oracle(self)

    def answered(self) -> None:
        """A renewal sent (ReplicaClock.send) has its answer: its connection is free."""
        self.in_flight -= 1

    def wall(self) -> datetime:
        return self.clock.wall()

    def after_step(self) -> None:
        if self.oracle.crowded:
            self.oracle.overlaps()

    def change(self, kind: str, who: str, apply: Callable[[], None], what: str = "") -> None:
        """A fault's start or end: up-time counted to now first, then the change."""
        self.oracle.settle()
        apply()
        self.trace.add(self.clock.monotonic(), who, kind, what=what)
        self.after_step()

    # -- faults ------------------------------------------------------------------------------------
    def next_fault(self) -> None:
        delay = self.rng.expovariate(1.0 / self.config.fault_every)
        self.clock.call_later(delay, self._fault)

    def next_abort(self) -> None:
        delay = self.abort_draw.expovariate(1.0 / ABORT_EVERY)
        self.clock.call_later(delay, self._abort)

    def _abort(self) -> None:
        """An operator's `lockctl abort` of a job whose run has gone on ABORT_AGE: the note names
        the run's tick and the session holding the job's lock (as the command reads them), is
        written to the job's abort key, and is heard by every replica up."""
        if not self.faulting:
            return
        self.next_abort()
        job = self.abort_draw.choice(self.jobs)
        now, started = self.clock.monotonic(), self.oracle.started_ticks
        bodies = [
            b
            for b in self.oracle.alive[job.name]
            if now - started.get((b.job, b.tick), now) >= ABORT_AGE and not b.frozen
        ]
        session = self.store.watch_lock(job.keys, 0, 0)[0]
        if not bodies or session is None or self.down_until is not None:
            return
        self.oracle.settle()
        body = bodies[-1]
        note = ControlNote("ops", self.wall(), "simulated", id=f"a-{next(self.asked)}")
        abort = AbortNote(note, body.tick, session)
        self.store.put(abort_key(job.name), abort.encode())
        self.abort_notes[job.name] = abort
        up = self.oracle.up.get(body.replica.name, 0.0)
        self.aborts[(job.name, body.tick)] = _Abort(body, up)
        self.aborted.add((job.name, body.tick))
        self.trace.add(self.clock.monotonic(), "ops", "abort-asked", job.name, body.tick)
        for each in self.replicas:
            if each.alive:
                each.hear_abort(job.name, abort)

    def next_backfill(self) -> None:
        delay = self.backfill_draw.expovariate(1.0 / BACKFILL_EVERY)
        self.clock.call_later(delay, self._backfill)

    def _backfill(self) -> None:
        """An operator's `lockctl backfill` of a job with none pending: the newest
        BACKFILL_TICKS ticks nobody ran in the last BACKFILL_SPAN, planned as the command plans
        them, written to the job's backfill key, and heard by every replica up."""
        if not self.faulting:
            return
        self.next_backfill()
        job = self.backfill_draw.choice(self.jobs)
        if job.name in self.backfills or self.down_until is not None:
            return
        now = self.wall()
        records = {record.tick: record for record in self.store.read_ticks(job.keys)}
        ledger = BackfillLedger(records)
        closed = now - timedelta(seconds=2 * SLACK)  # every claim window closed by then

        def held(tick: datetime) -> str | None:
            window = holding_window(job.blackouts, tick)
            return None if window is None else window.name

        span = (now - timedelta(seconds=BACKFILL_SPAN), closed)
        ticks = plan_backfill(job.schedule, span, closed, ledger, held).run
        if not ticks:
            return
        self.oracle.settle()
        note = BackfillNote(
            "ops", now, ticks[-BACKFILL_TICKS:], "simulated", f"b-{next(self.asked)}"
        )
        self.store.put(backfill_key(job.name), note.encode())
        self.backfills[job.name] = _Backfill(note, self.oracle.up_fleet)
        self.trace.add(self.clock.monotonic(), "ops", "backfill-asked", job.name, note.ticks[0])
        for each in self.replicas:
            if each.alive:
                each.hear_backfill(job.name, note)

    def _fault(self) -> None:
        if not self.faulting:
            return
        self.next_fault()
        kind = self.rng.choices(
            ("kill", "pause", "skew", "down", "slow", "expire", "hang", "trigger", "stop"),
            (1, 3, 1, 1, 1, 1, 1, 1, 1),
        )[0]
        replica = self.rng.choice(self.replicas)
        getattr(self, f"_{kind}")(replica)

    def _kill(self, replica: Replica) -> None:
        if not replica.alive:
            return
        self.faults += 1
        self.change("killed", replica.name, replica.kill)
        back = self.rng.uniform(5.0, 120.0)
        self.clock.call_later(back, lambda: self._restart(replica))

    def _stop(self, replica: Replica) -> None:
        """A SIGTERM just after a tick of some job (within half a second): as `systemctl stop`
        comes at any moment, but where a stop meets claims out, which most moments have none
        of."""
        job = self.rng.choice(self.jobs)
        tick = job.schedule.next_ticks(self.wall(), 1)[0]
        later = (tick - self.wall()).total_seconds() + self.rng.uniform(0.0, 0.5)
        self.clock.call_later(later, lambda: self._sigterm(replica))

    def _sigterm(self, replica: Replica) -> None:
        if not self.faulting or not replica.alive or replica.stopping:
            return
        if replica.paused_until is not None:
            return  # a paused process hears its SIGTERM on resume: a kill's case then
        self.faults += 1
        back = self.rng.uniform(5.0, 120.0)

        def exited() -> None:
            self.clock.call_later(back, lambda: self._restart(replica))

        self.change("sigterm", replica.name, lambda: replica.stop(exited))

    def _restart(self, replica: Replica) -> None:
        if not replica.alive:
            self.change("restarted", replica.name, replica.boot)

    def _pause(self, replica: Replica) -> None:
        if not replica.alive or replica.paused_until is not None:
            return
        self.faults += 1
        roll = self.rng.random()
        length = self.rng.uniform(
            *((0.1, 5.0) if roll < 0.6 else (5.0, 40.0) if roll < 0.9 else (40.0, 400.0))
        )
        until = self.clock.monotonic() + length
        self.change("paused", replica.name, lambda: replica.pause(until), f"{length:.1f}s")
        incarnation = replica.incarnation
        self.clock.call_at(until, lambda: self._resume(replica, incarnation))

    def _resume(self, replica: Replica, incarnation: int) -> None:
        if replica.incarnation == incarnation and replica.paused_until is not None:
            self.change("resumed", replica.name, replica.resume)

    def _skew(self, replica: Replica) -> None:
        self.faults += 1
        step = (
            self.rng.uniform(-20.0, 20.0)
            if self.rng.random() < 0.7
            else self.rng.choice((-1, 1)) * self.rng.uniform(30.0, 120.0)
        )

        def skew() -> None:
            replica.skew += timedelta(seconds=step)

        self.change("wall", replica.name, skew, f"{step:+.1f}s")
        back = self.rng.uniform(30.0, 600.0)  # NTP puts it right

        def unskew() -> None:
            if self.faulting:  # else calm() set every clock right already
                replica.skew -= timedelta(seconds=step)

        self.clock.call_later(
            back, lambda: self.change("wall", replica.name, unskew, f"{-step:+.1f}s")
        )

    def _down(self, replica: Replica) -> None:
        if self.down_until is not None:
            return
        self.faults += 1
        until = self.clock.monotonic() + self.rng.uniform(1.0, 45.0)
        self.change("consul-down", "store", lambda: setattr(self, "down_until", until))
        self.clock.call_at(
            until,
            lambda: self.change("consul-up", "store", lambda: setattr(self, "down_until", None)),
        )

    def _slow(self, replica: Replica) -> None:
        if self.slow_until is not None:
            return
        self.faults += 1
        until = self.clock.monotonic() + self.rng.uniform(10.0, 120.0)
        worst = self.rng.uniform(0.5, 12.0)

        def slow() -> None:
            self.slow_until, self.slow_max = until, worst

        self.change("consul-slow", "store", slow, f"answers up to {worst:.1f}s late")
        self.clock.call_at(
            until,
            lambda: self.change("consul-fast", "store", lambda: setattr(self, "slow_until", None)),
        )
        if self.rng.random() < 0.5:  # a stop that meets claims waiting for their answers
            stopped = self.rng.choice(self.replicas)
            at = self.rng.uniform(0.0, until - self.clock.monotonic() - 5.0)
            self.clock.call_later(at, lambda: self._stop(stopped))

    def _expire(self, replica: Replica) -> None:
        if not replica.alive or not replica.sessions:
            return
        self.faults += 1
        session = self.rng.choice(replica.sessions)
        end = functools.partial(self.store.destroy_session, session)
        self.change("session-ended", replica.name, end, f"session ...{session[-6:]}")

    def _trigger(self, replica: Replica) -> None:
        """An operator's `lockctl trigger` of a job with none pending: its note written to the
        trigger key, and heard by every replica up (each one's watch answers)."""
        job = self.rng.choice(self.jobs).name
        if job in self.triggers or self.down_until is not None:
            return
        self.oracle.settle()
        note = ControlNote("ops", self.wall(), "simulated", id=f"t-{next(self.asked)}")
        self.store.put(trigger_key(job), note.encode())
        self.triggers[job] = _Trigger(note, self.oracle.up_fleet)
        self.trace.add(self.clock.monotonic(), "ops", "asked", job, manual_tick(self.wall()))
        for each in self.replicas:
            if each.alive:
                each.hear(job, note)

    def _hang(self, replica: Replica) -> None:
        self.faults += 1
        replica.hang_next = True
        self.trace.add(self.clock.monotonic(), replica.name, "hang-next")

    def calm(self) -> None:
        """The end of the faults: every replica up, awake, on time; Consul answering."""
        self.faulting = False
        self.oracle.settle()
        self.down_until = self.slow_until = None
        for replica in self.replicas:
            replica.skew = timedelta(0)
            if replica.paused_until is not None:
                replica.resume()
            if not replica.alive:
                replica.boot()
        self.trace.add(self.clock.monotonic(), "world", "calm")


def _interval(job: CoreJob) -> float:
    first, second = job.schedule.next_ticks(START, 2)
    return (second - first).total_seconds()


def make_jobs(count: int, workers: tuple[str, ...], seed: int = 1) -> list[CoreJob]:
    """The jobs of the SHAPES in turn; four of every five have a blackout window, drawn from
    the seed (draws of their own: the faults' sequence is the seed's as before, and the "all"
    job's windows, added later, leave the others' as they were)."""
    draw = random.Random(f"blackout-{seed}")
    all_draw = random.Random(f"blackout-all-{seed}")
    jobs = []
    for n in range(count):
        text, zone, jitter, hold = SHAPES[n % len(SHAPES)]
        timings = dataclasses.replace(TIMINGS, jitter=jitter, min_hold=hold)
        if n % len(SHAPES) == 0:  # a failed run is tried again twice, a second apart
            timings = dataclasses.replace(timings, retries=2, retry_delay=1.0)
        name = f"job-{n + 1}"
        schedule = Calendar.of(parse_schedule(text, zone))
        keys = JobKeys(name, f"lockctl/sim/{name}/.lock")
        catchup = n % len(SHAPES) == 1  # @every 5s: a start deadline (30 s) past its interval
        windows = _window(draw, zone) if n % len(SHAPES) in WINDOWED else ()
        if n % len(SHAPES) == ALL_WINDOWED:
            windows = _window(all_draw, zone)
        job = CoreJob(keys, schedule, timings, workers, HISTORY, catchup, windows)
        if n % len(SHAPES) == 0:  # @every 10s: catchup = "all"
            job = dataclasses.replace(job, catchup=True, catchup_all=CATCHUP_ALL)
        if n % len(SHAPES) == CANCELLING:  # a run that outlasts its interval is cancelled
            job = dataclasses.replace(job, overlap=OVERLAP_CANCEL)
        if n % len(SHAPES) == BUFFERING:  # a tick while it runs is buffered
            job = dataclasses.replace(job, overlap=OVERLAP_BUFFER_ONE)
        jobs.append(job)
    return jobs


def _window(draw: random.Random, zone: str) -> tuple[Blackout, ...]:
    """An hourly window of a random minute and length (1 to 15 minutes) in the job's zone."""
    minute, length = draw.randrange(60), draw.choice((60.0, 150.0, 300.0, 600.0, 900.0))
    schedule = Calendar.of(parse_schedule(f"{minute} * * * *", zone))  # as the core keeps it
    return (Blackout(f"w{minute}", schedule, length),)


def simulate(config: SimConfig) -> Report:
    """One run: the fleet started, faults until `config.ticks` ticks have closed (or the first
    violation), then a calm DRAIN with no faults, and the last accounting."""
    began = time.perf_counter()
    with planted(config.plants):
        world = World(config)
        for replica in world.replicas:
            replica.boot()
        world.next_fault()
        world.next_backfill()
        world.next_abort()
        oracle = world.oracle
        while oracle.ticks < config.ticks and (config.keep_going or not oracle.violations):
            world.clock.advance(STEP)
            oracle.account()
            if world.clock.monotonic() % 3600.0 < STEP:
                oracle.forget(world.clock.monotonic() - 3600.0)
        if config.keep_going or not oracle.violations:
            world.calm()
            end = world.clock.monotonic() + DRAIN
            while world.clock.monotonic() < end and (config.keep_going or not oracle.violations):
                world.clock.advance(STEP)
                oracle.account()
    trace = world.trace
    return Report(
        config.seed,
        oracle.ticks,
        world.faults,
        tuple(oracle.violations),
        time.perf_counter() - began,
        world.clock.monotonic(),
        trace.lines(),
        trace.digest or 0,
        dict(trace.counts),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--ticks", type=int, default=DEFAULT_TICKS)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=5)
    parser.add_argument("--plant", action="append", default=[], choices=sorted(PLANTS))
    parser.add_argument("--fault-every", type=float, default=FAULT_EVERY)
    parser.add_argument("--trace", type=int, default=TRACE)
    parser.add_argument("--keep-going", action="store_true")
    parser.add_argument("--digest", action="store_true")
    parser.add_argument("--no-caps", action="store_true", help="no replica has a cap")
    args = parser.parse_args(argv)
    config = SimConfig(
        args.seed,
        args.replicas,
        args.jobs,
        args.ticks,
        tuple(args.plant),
        args.fault_every,
        args.trace,
        args.keep_going,
        args.digest,
        not args.no_caps,
    )
    report = simulate(config)
    print("\n".join(report_lines(report, config)))
    return 1 if report.violations else 0


def report_lines(report: Report, config: SimConfig) -> list[str]:
    """What a run prints: each violation, the trace before the first (and how to replay it),
    the counts, and the last line."""
    lines = [f"VIOLATION {v.invariant} at t={v.at:.3f}: {v.detail}" for v in report.violations[:10]]
    if report.violations:
        replay = f"--seed {report.seed}" + "".join(f" --plant {p}" for p in config.plants)
        lines.append(f"the {len(report.trace)} events up to it (replay: {replay}):")
        lines.extend(report.trace)
    counts = report.counts
    digest = f", digest {report.digest:08x}" if config.digest else ""
    lines.append(
        f"runs {counts.get('body-start', 0)}, missed recorded {counts.get('missed', 0)}, "
        f"fenced {counts.get('fenced', 0)}, timed out {counts.get('timed-out', 0)}, "
        f"triggers run {counts.get('trigger-run', 0)} of {counts.get('asked', 0)}, "
        f"runs aborted {counts.get('aborted-run', 0)} of {counts.get('abort-asked', 0)}, "
        f"runs cancelled {counts.get('cancelled-run', 0)}, "
        f"ticks buffered {counts.get('buffered', 0)}, "
        f"backfill ticks run {counts.get('backfill-run', 0)} "
        f"({counts.get('backfill-asked', 0)} backfills), "
        f"caught up {counts.get('caught-up', 0)}, "
        f"passed on at capacity {counts.get('at-capacity', 0)}, "
        f"blackout recorded {counts.get('blackout-record', 0)} "
        f"(turns {counts.get('blackout', 0)}), "
        f"simulated {report.simulated / 86400:.1f} days, "
        f"{report.ticks / max(report.seconds, 1e-9):,.0f} ticks/s{digest}"
    )
    lines.append(report.last_line())
    return lines


if __name__ == "__main__":
    sys.exit(main())
