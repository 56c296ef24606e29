"""The tick core: one replica's ticks, each owned from plan to record, over a TickStore and a
TimerClock only (so one thread runs it, and a simulation runs a fleet of them in one thread).

    start    each job's next tick, planned (`plan`: the tick, its turn, its claim window) and
             a timer set for this replica's turn at it (ledger/turns.py: rank by the job's claim
             order, r x CLAIM_STAGGER after the planned start)
    turn     read the tick's record, and Consul's clock in the answer (a read: no Raft write;
             no write at all when the tick is taken) -> judged again on the clock as it is sent
             -> claim it: ONE transaction (the tick has no record + the lock + the record),
             the arbiter whatever the clocks and ranks say. The turns of every job due at one
             instant are read together, and their claims sent together (one transaction while
             they all apply, else each alone): each judged, and answered, as its own
    run      held.py: the body under the lock, renewed by the session pool (pool.py), fenced
             by the pure decision, the record completed and the lock released in one write
    off the schedule  an operator's trigger (`trigger`): a claim at the trigger's own instant,
             which also records the trigger taken, tried again while another run holds the
             lock; a catch-up (`catchup`): after this replica's first turn (and after a turn
             Consul did not answer), the newest tick nobody ran, once, while within its start
             deadline (ledger/catchup.py), its claim over its `missed` record as read; an
             operator's backfill (`backfill`): each listed tick at its own instant, oldest
             first, over its record as read (ledger/backfill.py)
    fate     a tick whose fate this replica did not learn (Consul did not answer, the lock was
             refused, the job was busy here, the turn came too late) is read again once its
             claim window closed on Consul's clock, and recorded `missed` if nobody claimed it
             (record_unrun: at most once, whoever writes first)
    housekeeping  after the run of one tick in every history_limit / 2 (`housekeeps`: a hash
             of the job and tick, alike on every replica) and at the start: the ticks nobody
             ran recorded missed (a second net under the fate looks), retention

The tick planned is the tick claimed, recorded and completed: `TickPlan.tick`, one frozen
value carried through, never recomputed from a clock. A job busy here (its run, or its claim in
flight) claims nothing: the session is this replica's for all its locks, and a claim under it
would re-acquire the lock its own run holds. A tick whose turn comes while the job runs here
waits for that run's end, and is taken then if its window is still open (a run that outlasts
its interval delays the next tick, as a cron job's late start would); one that passes whole
meanwhile is skipped (overlap). With the job's overlap = "cancel" the run is stopped at that
turn first (tick/overlap.py: as an abort stops it, recorded `cancelled`), so the tick waits
only for the stop. With overlap = "buffer_one" the tick is recorded `buffered` at that turn
(one write) and claimed over that record when the run ends, within its start deadline (the
next tick cuts it not; a tick meanwhile is skipped); another replica whose turn (or fate look)
reads it `buffered` claims it so too, from a timer, once the lock is free: the holder may be
gone. Past its deadline it is recorded `missed` over it, once.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import signal
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from provision.blackouts import Blackout, holding_window
from provision.consul import ConsulError, ConsulUnavailable, PermissionDenied
from provision.ledger.aborts import AbortNote, stops
from provision.ledger.backfill import BACKFILL_WINDOW, BackfillNote, beyond_ledger, may_backfill
from provision.ledger.catchup import catchup_tick, may_catch_up, ticks_to_catch_up
from provision.ledger.control import (
    NO_PAUSES,
    ControlNote,
    decode_note,
    manual_tick,
    pause_holds,
    unrun_record,
)
from provision.ledger.records import TickRecord, tick_name
from provision.ledger.ticks import (
    MISSED_GRACE,
    MISSED_WALK,
    TickChoice,
    claim_window,
    judge_tick,
    missed_ticks,
    to_prune,
    unsettled_ticks,
)
from provision.ledger.turns import CLAIM_STAGGER, Turn, turn
from provision.outcomes import Outcome
from provision.schedule import Schedule
from provision.sessions import AgentlessNode
from provision.tick.calendar import Calendar
from provision.tick.capacity import capacity_refusal
from provision.tick.edge import BodyFactory, Cancellable, Listener, Note, SkipReason, TimerClock
from provision.tick.held import Claimed, Completions, HeldRun
from provision.tick.overlap import Busy, OverlapAction, overlap_action
from provision.tick.pool import SessionPool, confirmation_time
from provision.tick.store import (
    PLAIN,
    REFUSALS,
    Claim,
    ClaimAnswer,
    ClaimCall,
    ClaimTerms,
    InvalidSession,
    JobKeys,
    TickStore,
    TurnRead,
    lock_delayed,
)
from provision.timings import DEFAULT_OVERLAP, CatchupReach, JobTimings

MAX_MISSED_PER_HOUSEKEEPING = 60  # one transaction's worth (ledger/store.py CHUNK)
# Housekeepings under way at once (each a read, some a write, waiting aside); the others wait
# their turn. Every job's first one comes due at the same instant after a start: 1,000 of them
# filled the thread's aside slots (ThreadTimerClock.MAX_ASIDE) and then ran inline, a Consul
# round trip each, while the start's claims waited under them: their runs started 10 s late,
# past the fencing bound, and were recorded lost (bench/scale.py, a start inside a tick's window).
HOUSEKEEPINGS_AT_ONCE = 4
FATE_RETRY = 5.0  # seconds: Consul did not answer a look at a tick's fate: look again then
SETTLE_AGAIN = 1.0  # seconds: the start's housekeeping found a tick not missable yet (Date's step)
# A trigger waits for the job's lock (a run of it going on here or elsewhere) at most this
# long after it was asked, trying again after TRIGGER_POLL, doubling up to TRIGGER_POLL_MAX.
TRIGGER_WINDOW = 24 * 3600.0
TRIGGER_POLL, TRIGGER_POLL_MAX = 1.0, 16.0


@dataclass(frozen=True)
class CoreJob:
    """One job as the core runs it: where it is in Consul, its schedule, timings, the workers
    that may claim it (its claim order), and how many records its ledger keeps."""

    keys: JobKeys
    schedule: Schedule
    timings: JobTimings
    workers: tuple[str, ...] = ()
    history_limit: int = 50
    catchup: bool = False  # catchup = "latest" or "all": ticks nobody ran are run late, once
    blackouts: tuple[Blackout, ...] = ()  # the windows its ticks are not run in (blackouts.py)
    catchup_all: CatchupReach | None = None  # "all": every one in this reach (None: "latest")
    overlap: str = DEFAULT_OVERLAP  # a turn while it runs here: "skip" waits, "cancel" stops it

    @property
    def name(self) -> str:
        return self.keys.name

    @property
    def unit(self) -> str:
        """The job, or one key of it: what the core tells apart (a job's keys share its name,
        its control keys and its operators' notes)."""
        return self.keys.unit


@dataclass(frozen=True)
class Identity:
    """Who this core is, as its records and its lock's value say."""

    worker: str
    host: str | None = None
    pid: int | None = None
    node: AgentlessNode | None = None  # an agentless worker's catalog node: its sessions' home


@dataclass(frozen=True)
class OffSchedule:
    """A claim outside a tick's own turn: an operator's trigger (`note`: who asked, when, why,
    its id) or, without a note, a catch-up of a tick nobody ran. `terms`: what its claim checks
    beyond the tick (the trigger not taken since it was read; the `missed` record as read)."""

    terms: ClaimTerms
    note: ControlNote | None = None
    backfill: BackfillNote | None = None  # an operator's backfill, whose tick this is
    buffered: bool = False  # a tick recorded `buffered` (overlap = "buffer_one")


@dataclass(frozen=True)
class TickPlan:
    """One tick of one job as this replica plans it: the instant (carried to the claim, the
    record and its completion), this replica's turn, the claim window (seconds after the
    tick), and the schedule's next tick."""

    job: CoreJob
    tick: datetime
    turn: Turn
    window: float
    following: datetime
    off: OffSchedule | None = None

    @property
    def closes(self) -> datetime:
        """When nobody may claim it any more (on Consul's clock)."""
        return self.tick + timedelta(seconds=self.window)


def sessions_may_go(stopping: bool, runs: int, claims_out: int) -> bool:
    """Whether a core destroys its sessions now: stopping, no run holds a lock, and no claim
    is out (the tick a claim out wins is completed under its session first)."""
    return stopping and runs == 0 and claims_out == 0


def plan_tick(job: CoreJob, tick: datetime, worker: str) -> TickPlan:
    """`worker`'s plan of `tick` (pure): its turn, its window, its neighbours."""
    window, following = _around(job, tick)
    mine = turn(job.name, tick, worker, job.workers, job.timings.jitter, window)
    return TickPlan(job, tick, mine, window, following)


@functools.lru_cache(maxsize=1024)  # the same for every replica: a fleet asks once per tick
def _around(job: CoreJob, tick: datetime) -> tuple[float, datetime]:
    """The tick's claim window, and the schedule's next tick."""
    window = claim_window(job.schedule, tick, job.timings.start_deadline)
    return window, job.schedule.next_ticks(tick, 1)[0]


def housekeeps(job: CoreJob, tick: datetime) -> bool:
    """Whether the run of `tick` housekeeps after it: one tick in every history_limit / 2,
    chosen by a hash of (job, tick) so every replica agrees and the fleet reads the whole
    ledger about that often, whatever its size. Between two, the ledger grows past the limit
    by that many records at most, on average (a housekeeping reads the records' names
    alone, and Consul's clock in the same answer: one read)."""
    every = max(1, job.history_limit // 2)
    return zlib.crc32(f"{job.name}\0{tick_name(tick)}".encode()) % every == 0


def claimable(record: TickRecord | None) -> bool:
    """Whether a tick whose read found `record` is worth a claim: only while it has none (a
    claim that loses costs Consul a Raft write; the claim's transaction refuses a taken tick
    anyway)."""
    return record is None


def record_missed(
    store: TickStore, job: CoreJob, ticks: Sequence[datetime], worker: str, now: datetime
) -> list[TickRecord]:
    """Record `ticks` (nobody ran them) `blackout` where a blackout window held them, `paused`
    where a pause did, else `missed`, each only where no record exists: those written. The
    control keys are read only when there is something a window does not explain (rarely)."""
    if not ticks:
        return []
    windows = [holding_window(job.blackouts, tick) for tick in ticks]
    pauses = NO_PAUSES if all(windows) else store.read_control(job.keys).pauses
    records = [
        unrun_record(tick, worker, now, pauses.holding(tick), window)
        for tick, window in zip(ticks, windows, strict=True)
    ]
    return store.record_unrun(job.keys, records)


def trigger_plan(job: CoreJob, note: ControlNote, taken_index: int, now: datetime) -> TickPlan:
    """The plan of a trigger's run (pure): at the trigger's own instant (never a scheduled
    tick's), first in line, claimable for TRIGGER_WINDOW, its claim checking that no replica
    took a trigger since the taken-trigger key was read at `taken_index`."""
    assert note.id is not None and note.at is not None
    terms = ClaimTerms(trigger=(note.id, taken_index))
    following = job.schedule.next_ticks(now, 1)[0]  # its retries end where the schedule goes on
    first = Turn(0, 0.0, 0.0)
    return TickPlan(
        job, manual_tick(note.at), first, TRIGGER_WINDOW, following, OffSchedule(terms, note)
    )


def backfill_plan(
    job: CoreJob, tick: datetime, record: TickRecord | None, note: BackfillNote, worker: str
) -> TickPlan:
    """The plan of a backfill's tick (pure): claimed at the tick's own instant over its record
    as read (None, `missed` or `paused`: ledger/backfill.py), as a catch-up is, while within
    BACKFILL_WINDOW of when the backfill was asked."""
    assert note.at is not None
    terms = ClaimTerms(over=0 if record is None else record.modify_index)
    window = (note.at - tick).total_seconds() + BACKFILL_WINDOW
    return replace(plan_tick(job, tick, worker), window=window, off=OffSchedule(terms, None, note))


def catchup_plan(job: CoreJob, tick: datetime, missed: TickRecord | None, worker: str) -> TickPlan:
    """The plan of the catch-up of `tick` (pure): claimable while within the job's start
    deadline, or with catchup = "all" its catchup_window (the next tick cuts neither), over
    `missed` as read (None: no record)."""
    terms = ClaimTerms(over=0 if missed is None else missed.modify_index)
    plan = plan_tick(job, tick, worker)
    reach = job.catchup_all
    window = job.timings.start_deadline if reach is None else reach.window
    return replace(plan, window=window, off=OffSchedule(terms))


def buffered_plan(job: CoreJob, tick: datetime, record: TickRecord | None, worker: str) -> TickPlan:
    """The plan of a tick kept `buffered` (overlap = "buffer_one", pure): claimable within the
    job's start deadline (the next tick cuts it not: buffering is what lets it pass that one),
    over its `buffered` record as read (None: not read yet)."""
    terms = ClaimTerms(over=0 if record is None else record.modify_index)
    plan = plan_tick(job, tick, worker)
    return replace(plan, window=job.timings.start_deadline, off=OffSchedule(terms, buffered=True))


def still_buffered(record: TickRecord | None) -> bool:
    """Whether a tick kept `buffered` is still to be run (or recorded missed) by whoever comes
    first: its record says `buffered` yet (None: pruned, or never written)."""
    return record is not None and record.outcome is Outcome.BUFFERED


@dataclass(frozen=True)
class _Sent:
    """A claim's transaction: its answer, the record it wrote, under which session, when it
    was sent and when answered (monotonic)."""

    claim: Claim
    record: TickRecord
    session: str
    at: float
    answered: float


@dataclass(frozen=True)
class _Judged:
    """A tick judged claimable on Consul's clock, and when that clock was read (monotonic:
    the read's send, so that the lag since is never under-counted)."""

    choice: TickChoice
    at: float

    def lag(self, now: float) -> float:
        """Seconds after the tick at monotonic `now`, on Consul's clock at the latest."""
        return self.choice.lag + (now - self.at)


def _refusal(claim: Claim) -> str:
    if claim.tick_taken:
        return "taken"
    return "lock-delay" if lock_delayed(claim) else "lock held"


@dataclass(eq=False)
class _Backoff:
    """Something not claimed yet (the lock held elsewhere, Consul not answering), looked at
    again after TRIGGER_POLL, doubling up to TRIGGER_POLL_MAX (never at once: the same refusal);
    one timer at a time."""

    timer: Cancellable | None = None
    delay: float = TRIGGER_POLL

    @property
    def waiting(self) -> bool:
        return self.timer is not None

    def arm(self, clock: TimerClock, then: Callable[[], None]) -> None:
        if self.timer is not None:
            return
        due = clock.monotonic() + self.delay
        self.delay = min(self.delay * 2, TRIGGER_POLL_MAX)

        def fire() -> None:
            self.timer = None
            then()

        self.timer = clock.call_at(due, fire)

    def reset(self) -> None:
        """Settled: the next one starts afresh."""
        self.delay = TRIGGER_POLL


@dataclass(eq=False)
class _Job:
    """What the core knows of one job between its ticks."""

    job: CoreJob
    turn: Cancellable | None = None  # the timer of the next tick's turn
    turn_at: float | None = None  # when that timer is due (monotonic)
    busy: datetime | None = None  # the tick whose claim is in flight or whose run goes on
    held: HeldRun | None = None
    housekeep: bool = False  # a housekeeping is due after the next run won here
    unanswered: str | None = None  # the session of a claim Consul did not answer
    last: datetime | None = None  # the scheduled tick of the last turn taken here
    waiting: TickPlan | None = None  # a tick whose turn came while the job ran here
    retired: bool = False  # a reload removed the job: no more turns; its run ends as it would
    catchup_look: bool = False  # a catch-up is to be looked for after the next turn...
    catchup_due: bool = False  # ...once the job is free here (one look per turn at most)
    catchups: list[datetime] = field(default_factory=list)  # "all": ticks to catch up, in order
    triggers: list[ControlNote] = field(default_factory=list)  # heard, not claimed or taken
    trigger_retry: _Backoff = field(default_factory=_Backoff)
    idle_timer: Cancellable | None = None
    backfills: list[tuple[BackfillNote, datetime]] = field(default_factory=list)  # in order
    backfills_heard: set[str] = field(default_factory=set)  # the ids of backfills heard
    backfill_retry: _Backoff = field(default_factory=_Backoff)  # a tick not claimed
    housekeeping: int = 0  # housekeepings under way (their reads wait aside): not quiet yet
    abort: AbortNote | None = None  # the newest `lockctl abort` heard (the run it names)
    buffered: list[TickPlan] = field(default_factory=list)  # ticks read or written `buffered`
    buffer_retry: _Backoff = field(default_factory=_Backoff)  # a buffered tick not claimed

    @property
    def timers(self) -> tuple[Cancellable | None, ...]:
        return (
            self.turn,
            self.trigger_retry.timer,
            self.idle_timer,
            self.backfill_retry.timer,
            self.buffer_retry.timer,
        )


class TickCore:
    """One replica's ticks: `start()` plans every job's next tick, `stop()` ends it (no more
    claims; runs interrupted, completed, released; sessions destroyed). Every method runs on
    the core's clock's thread: another thread hands a call over with `clock.call_at(now, ...)`
    (ThreadTimerClock's is thread-safe)."""

    # Told a job's name when the job is free here with nothing left to do (no run, no claim in
    # flight, nothing waiting): the end of a `take` (tick/once.py, `lockctl run`'s one tick).
    on_quiet: Callable[[str], None] | None = None
    # Whether a tick this replica did not learn the fate of is looked at once its window closed
    # (`_arm_fate`): not for one tick whose process ends after it (tick/once.py); its own rule
    # records a tick it came too late for, and a later run's housekeeping the others.
    fates = True
    # Whether the process was asked to stop (a signal), seen at once from the clock's thread:
    # the stop itself reaches the core a moment later (runner/on_core.py hands it over), and a
    # claim that wins meanwhile must not start its job (`lockctl run` sets it).
    stop_asked: Callable[[], bool] = staticmethod(lambda: False)
    # The most runs (claims in flight counted) this replica has at once: a claim over it is
    # passed on to the next in the tick's claim order (tick/capacity.py); None: no cap.
    capacity: int | None = None

    def __init__(
        self,
        store: TickStore,
        clock: TimerClock,
        identity: Identity,
        jobs: Iterable[CoreJob],
        bodies: BodyFactory,
        listener: Listener | None = None,
    ) -> None:
        self.store, self.clock, self.identity = store, clock, identity
        self.bodies, self.listener = bodies, listener
        self.pool = SessionPool(store, clock, identity.worker, identity.node, listener)
        self._jobs = [_Job(_calendared(job)) for job in jobs]
        self._retiring: list[_Job] = []  # removed by a reload while their run goes on
        self._housekeepings: collections.deque[tuple[_Job, datetime | None]] = collections.deque()
        self._housekeeping_now = 0  # under way (HOUSEKEEPINGS_AT_ONCE at most)
        self._reading: list[tuple[_Job, TickPlan]] = []  # turns whose read waits for _read_turns
        self._read_timer: Cancellable | None = None
        self._completions = Completions(store, clock)
        self.stopping = False

    @property
    def worker(self) -> str:
        return self.identity.worker

    @property
    def jobs(self) -> list[CoreJob]:
        return [state.job for state in self._jobs]

    @property
    def runs(self) -> list[HeldRun]:
        """The runs this core holds a lock for now."""
        return [state.held for state in self._jobs + self._retiring if state.held is not None]

    def plan(self, job: CoreJob, tick: datetime) -> TickPlan:
        return plan_tick(job, tick, self.worker)

    def start(self) -> None:
        """Make the replica's sessions (one per PoolKey: a Raft write each, off the first
        claim's path; Consul not answering, the first claim makes it), then plan each job's
        tick: the current one while its window is open, else the next; and a housekeeping once
        the windows of the ticks before now have closed."""
        for timings in dict.fromkeys(state.job.timings for state in self._jobs):
            with contextlib.suppress(ConsulError):
                self.pool.session_for(timings)
        for state in self._jobs:
            self._begin(state)

    def stop(self) -> None:
        """No more claims; every run is told to stop, completed and released; the sessions are
        destroyed once the last run is done and no claim is out (at once when there is none)."""
        self.stopping = True
        for state in self._jobs + self._retiring:
            for timer in state.timers:
                if timer is not None:
                    timer.cancel()
            if state.held is not None:
                state.held.interrupt(signal.SIGTERM)
        self._close_when_done()

    def _close_when_done(self) -> None:
        """Stopping: the sessions go once no run holds a lock and no claim is out. A claim out
        waits aside, and the stop runs meanwhile: the tick it wins is completed `interrupted`
        (its body never starts) and released under its session first. Destroyed before the
        answer, the record stayed `running` for good, and the tick's lock went by the session's
        end, with its lock-delay."""
        if not self.stopping or self.pool.closed:
            return  # looked at after every run and claim: never a walk of every job then
        if sessions_may_go(self.stopping, len(self.runs), self._out()):
            self.pool.close()

    def _out(self) -> int:
        """Claims sent and not yet acted on (one Consul did not answer is `_resolve`'s: it
        waits for Consul, which the stop does not)."""
        states = self._jobs + self._retiring
        return sum(s.busy is not None and s.held is None and s.unanswered is None for s in states)

    def update(self, jobs: Iterable[CoreJob]) -> None:
        """A reload: a job no longer in `jobs` gets no more turns (its run going on ends as it
        would have); a changed job's next turn is planned anew (a run going on keeps the terms
        it was claimed with); a new job is planned as at the start."""
        wanted = {job.unit: _calendared(job) for job in jobs}
        current = []
        for state in self._jobs:
            job = wanted.pop(state.job.unit, None)
            if job is None:
                self._retire(state)
                continue
            current.append(state)
            if job != state.job:
                if state.turn is not None:
                    state.turn.cancel()
                state.job = job
                self._arm_turn(state, self._first_plan(state))
        added = [_Job(job) for job in wanted.values()]
        self._jobs = current + added
        for state in added:
            self._begin(state)
        self.pool.keep_only([state.job.timings for state in self._jobs + self._retiring])

    def trigger(self, name: str, note: ControlNote) -> None:
        """An operator's trigger of job `name` (lockctl trigger): run it once now, claimed at
        the trigger's own instant (trigger_plan); right after the job's run when one goes on
        here, and tried again while a run of it elsewhere holds the lock. Every replica hears
        of it and tries; the claim (which records the trigger taken) lets one run it, once: for
        a keyed job, once per key (each key's claim records it taken in the key's own key)."""
        if note.id is None or note.at is None:
            return
        for state in self._units(name):
            if not self._live(state) or any(heard.id == note.id for heard in state.triggers):
                continue  # heard again (the watch answers again): one attempt at a time
            state.triggers.append(note)
            self._note("trigger", state.job, manual_tick(note.at), note.id)
            self._idle(state)

    def backfill(self, name: str, note: BackfillNote) -> None:
        """An operator's backfill of job `name` (lockctl backfill): each of its ticks claimed at
        its own instant, oldest first, once the job is free here (after the scheduled tick
        and the triggers waiting). Every replica hears of it and tries; each tick's claim
        (over its record as read) lets one run it, once; for a keyed job, once per key."""
        if note.id is None or note.at is None:
            return
        if (self.clock.wall() - note.at).total_seconds() > BACKFILL_WINDOW:
            return  # an old one, heard at a start: over
        for state in self._units(name):
            if not self._live(state) or note.id in state.backfills_heard:
                continue  # heard again (the watch answers again): its ticks are queued or done
            state.backfills_heard.add(note.id)
            state.backfills.extend((note, tick) for tick in note.ticks)
            detail = f"{len(note.ticks)} ticks ({note.id})"
            self._note("backfill", state.job, note.ticks[0], detail)
            self._idle(state)

    def abort(self, name: str, abort: AbortNote) -> None:
        """An operator's `lockctl abort` of job `name`: the run it names (its tick and session,
        read from the lock when it was asked: `stops`) is stopped, if this replica runs it now
        or starts it later (a claim answered after the note was heard); any other run of the
        job, here or later, goes on: a note heard late stops nothing. A keyed job's note names
        its key too (the keys' runs share this replica's session, and may share a tick)."""
        unit = name if abort.key is None else f"{name}/{abort.key}"
        state = next((s for s in self._jobs + self._retiring if s.job.unit == unit), None)
        if state is None:
            return
        held = state.held
        if held is not None and stops(abort, held.tick, held.claimed.session):
            state.abort = None  # one run named, and this is it: kept no longer
            held.abort(abort.note)  # says `aborted`
        else:
            state.abort = abort  # a claim answered after it may be the run it names
            self._note("abort", state.job, abort.tick, "names no run of this replica")

    # -- one tick outside the replica's loop (tick/once.py: `lockctl run`) ---------------------
    def take(self, name: str, tick: datetime, *, catchup: bool = False) -> None:
        """One turn at `tick` of job `name`, outside the loop (`start` is never called): read,
        judged, claimed, run and completed as at any turn, housekept after a run won here, and
        with `catchup` a catch-up looked for after it; no later turn is planned. `on_quiet`
        hears when all that is over."""
        state = next(s for s in self._jobs if s.job.unit == name)
        state.last, state.catchup_due, state.housekeep = tick, catchup, True
        self._take(state, self.plan(state.job, tick))

    def adopt(self, job: CoreJob) -> None:
        """A job (a keyed job's key) this core takes turns of with `take` only, known from now
        on: nothing planned for it (a call's key, chosen at run time: embed/called.py)."""
        if all(state.job.unit != job.unit for state in self._jobs):
            self._jobs.append(_Job(_calendared(job)))

    def _units(self, name: str) -> list[_Job]:
        """Job `name` as this core runs it: the job, or each of its keys."""
        return [state for state in self._jobs if state.job.name == name]

    def _quiet(self, state: _Job) -> None:
        """Tell `on_quiet` when the job is free here and nothing waits for it."""
        catching_up = state.catchup_due or bool(state.catchups) or bool(state.backfills)
        waits = state.buffered or state.waiting or state.triggers or catching_up or state.idle_timer
        busy = state.busy is not None or state.held is not None or state.housekeeping > 0
        if self.on_quiet is not None and not busy and not waits:
            self.on_quiet(state.job.unit)

    def _begin(self, state: _Job) -> None:
        self._arm_turn(state, self._first_plan(state))
        state.catchup_look = state.job.catchup
        current = self.plan(
            state.job, state.job.schedule.latest_tick_at_or_before(self.clock.wall())
        )
        settled = self._monotonic_at(current.closes + timedelta(seconds=MISSED_GRACE))
        self.clock.call_at(settled, functools.partial(self._housekeep, state, current.following))

    def _first_plan(self, state: _Job) -> TickPlan:
        """The current tick while its window is open and no turn was taken at it here, else
        the next one."""
        schedule = state.job.schedule
        current = self.plan(state.job, schedule.latest_tick_at_or_before(self.clock.wall()))
        taken = state.last is not None and current.tick <= state.last
        if self.clock.wall() < current.closes and not taken:
            return current
        return self.plan(state.job, current.following)

    def _retire(self, state: _Job) -> None:
        state.retired = True
        for timer in state.timers:
            if timer is not None:
                timer.cancel()
        if state.held is not None:
            self._retiring.append(state)

    def _live(self, state: _Job) -> bool:
        return not self.stopping and not state.retired

    # -- a tick's turn -------------------------------------------------------------------------
    def _arm_turn(self, state: _Job, plan: TickPlan) -> None:
        due = plan.tick + timedelta(seconds=plan.turn.delay)
        state.turn_at = self._monotonic_at(due)
        state.turn = self.clock.call_at(state.turn_at, lambda: self._turn(state, plan))

    def _turn(self, state: _Job, plan: TickPlan) -> None:
        if not self._live(state):
            return
        state.last, state.catchup_due = plan.tick, state.catchup_look
        self._arm_turn(state, self._successor(state, plan))
        self._note("due", plan.job, plan.tick)
        self._take(state, plan)

    def _successor(self, state: _Job, plan: TickPlan) -> TickPlan:
        """The tick after `plan`'s, or, when this turn came late (a pause, a clock step), the
        current one: the ticks slept through get a look at their fate instead."""
        latest = state.job.schedule.latest_tick_at_or_before(self.clock.wall())
        if latest <= plan.following:
            return self.plan(state.job, plan.following)
        skipped = plan.following
        for _ in range(MISSED_WALK):
            if skipped >= latest:
                break
            self._arm_fate(state, self.plan(state.job, skipped))
            skipped = state.job.schedule.next_ticks(skipped, 1)[0]
        return self.plan(state.job, latest)

    def _take(self, state: _Job, plan: TickPlan) -> None:
        """This replica's turn at the tick: read, then claim unless it is taken or not due. The
        read waits for the other turns due at this instant, if any (a timer of now, after
        theirs)."""
        held = state.held
        stoppable = held is not None and held.stoppable
        busy = Busy(state.busy is not None, stoppable, bool(state.buffered))
        action = overlap_action(state.job.overlap, busy)
        if action is OverlapAction.BUFFER:
            self._buffer(state, plan)
            return
        if action is OverlapAction.SKIP:  # one tick is buffered already: at most one
            detail = f"tick {tick_name(state.buffered[0].tick)} is buffered already"
            self._note("skipped", plan.job, plan.tick, detail, skip=SkipReason.OVERLAP)
            self._arm_fate(state, plan)
            return
        if action is not OverlapAction.TAKE:  # taken once the run ends, while its window is open
            self._overlapped(state, state.waiting)
            state.waiting = plan
            self._arm_fate(state, plan)
            if action is OverlapAction.CANCEL and held is not None:
                held.cancel(plan.tick)  # its end frees the job here: the tick is claimed then
            return
        self._reading.append((state, plan))
        if self._read_timer is not None:
            return
        if self._other_turn_due(state):
            self._read_timer = self.clock.call_at(self.clock.monotonic(), self._read_turns)
        else:
            self._read_turns()

    def _other_turn_due(self, state: _Job) -> bool:
        """Whether another job's turn is due and not taken yet (asked at the first turn of an
        instant only: the others join the read it waits for)."""
        now = self.clock.monotonic()
        return any(
            other.turn_at is not None and other.turn_at <= now
            for other in self._jobs
            if other is not state
        )

    def _read_turns(self) -> None:
        """The reads of every turn due now, together (300 jobs ticking at once: a few requests,
        not 300); a lone one is read_tick's. Stale: any server answers; a claim it missed, the
        claim's own transaction refuses. Then each turn goes on with its own answer."""
        self._read_timer = None
        turns, self._reading = self._reading, []
        sent = self.clock.monotonic()
        answers: list[TurnRead]
        try:
            if len(turns) == 1:
                plan = turns[0][1]
                answers = [self.store.read_tick(plan.job.keys, plan.tick, stale=True)]
            else:
                answers = self.store.read_turns([(plan.job.keys, plan.tick) for _, plan in turns])
        except ConsulError as exc:
            answers = [exc] * len(turns)
        claims = []
        for (state, plan), answer in zip(turns, answers, strict=True):
            judged = self._turn_read(state, plan, sent, answer)
            if judged is not None:
                claims.append((state, plan, judged))
        self._claim_turns(claims)

    def _turn_read(
        self, state: _Job, plan: TickPlan, sent: float, answer: TurnRead
    ) -> _Judged | None:
        """A turn's read answered (sent at monotonic `sent`): the tick judged claimable, unless
        it is taken, too late, or not come on Consul's clock yet (None: dealt with here)."""
        if isinstance(answer, ConsulError):
            self._failed(answer, plan.job, plan.tick)
            state.catchup_look = state.job.catchup  # the tick may need catching up
            self._arm_fate(state, plan)
            self._idle(state)
            return None
        record, date = answer
        window = holding_window(plan.job.blackouts, plan.tick) if plan.off is None else None
        if window is not None and (record is None or record.outcome is Outcome.BLACKOUT):
            self._blackout(state, plan, window, record)
            return None
        if not claimable(record):
            self._note("skipped", plan.job, plan.tick, "taken", skip=SkipReason.TAKEN)
            if record is not None and plan.off is None:
                self._buffered_seen(state, plan, record)
            self._idle(state)
            return None
        # Consul's clock now: its Date, plus all the time since the read was sent (a slow
        # answer, a pause): never less than it is. Whether the tick has come: the Date alone.
        now = self.clock.wall() if date is None else date + timedelta(seconds=self._since(sent))
        deadline = plan.job.timings.start_deadline
        judged = _Judged(judge_tick(plan.job.schedule, plan.tick, now, deadline, date), sent)
        choice = judged.choice
        if not self._live(state):
            return None
        if choice.too_late:
            self._note("too-late", plan.job, plan.tick, "its claim window closed")
            self._arm_fate(state, plan)
            self._idle(state)
        elif choice.wait > 0:  # Consul's clock is not at the tick yet: let it come, then look
            due = self.clock.monotonic() + choice.wait
            self.clock.call_at(due, lambda: self._take(state, plan))
        elif state.busy is None:  # still free after the read (a slow answer lets others run)
            return judged
        else:
            self._arm_fate(state, plan)
        return None

    def _blackout(
        self, state: _Job, plan: TickPlan, window: Blackout, record: TickRecord | None
    ) -> None:
        """A blackout window holds the tick: not claimed; recorded `blackout` (at most once,
        whoever writes first) unless it is already. Consul not answering: its fate look
        records it later, `blackout` as well."""
        if record is None:
            try:
                written = record_missed(
                    self.store, plan.job, [plan.tick], self.worker, self.clock.wall()
                )
            except ConsulError as exc:
                self._failed(exc, plan.job, plan.tick)
                self._arm_fate(state, plan)
                self._idle(state)
                return
            record = written[0] if written else None
        self._note("blackout", plan.job, plan.tick, window.name, record=record)
        self._idle(state)

    # -- the claim -----------------------------------------------------------------------------
    def _claim(self, state: _Job, plan: TickPlan, judged: _Judged) -> None:
        """Claim the tick (one transaction); won: its run starts under the lock. Not while the
        job is busy here: a slow read before this claim (a trigger's, a catch-up's) may have let
        another claim of the job go first, and under the replica's one session this claim would
        re-acquire the lock that run holds, with its fencing token."""
        if state.busy is not None or not self._live(state) or self._at_capacity(plan):
            self._unclaimed(state, plan)
            return
        state.busy = plan.tick
        sent = self._send_claim(state, plan, judged)
        if sent is not None:
            self._answered(state, plan, sent)

    def _at_capacity(self, plan: TickPlan) -> bool:
        """Whether this replica runs its cap already (a claim in flight counted: it may win),
        said as a skip; nothing is written: the tick is left to the next in its claim order,
        and to its fate (missed, once nobody claimed it) like any tick not claimed here."""
        if self.capacity is None:
            return False
        running = sum(other.busy is not None for other in self._jobs + self._retiring)
        why = capacity_refusal(running, self.capacity)
        if why is not None:
            self._note("skipped", plan.job, plan.tick, why, skip=SkipReason.AT_CAPACITY)
        return why is not None

    def _answered(self, state: _Job, plan: TickPlan, sent: _Sent) -> None:
        """A claim's answer: won, its run starts (or, the job paused, it is recorded so);
        lost, the tick is skipped."""
        claim = sent.claim
        if plan.off is not None and plan.off.note is not None and (claim.won or claim.tick_taken):
            self._forget_trigger(state, plan.off.note)  # run here, or taken: never tried again
        if not claim.won:
            self._note("skipped", plan.job, plan.tick, _refusal(claim), skip=_skip_reason(claim))
            if not claim.tick_taken:
                self._unclaimed(state, plan)
            elif plan.off is not None and plan.off.backfill is not None:
                # its record changed since the read (recorded missed meanwhile?): read again
                state.backfills.insert(0, (plan.off.backfill, plan.tick))
            self._free(state)
            return
        claimed = replace(sent.record, lock_index=claim.lock_index, modify_index=claim.record_index)
        pause = None if claim.paused is None else decode_note(claim.paused)
        if pause is not None and pause_holds(pause, plan.tick):  # a time-boxed one ended: run
            self._complete_paused(state, claimed, sent.session, pause)
            return
        confirmed = confirmation_time(sent.at, sent.answered)
        keys, timings = plan.job.keys, plan.job.timings
        following = self._monotonic_at(plan.following)
        self._run(state, plan, Claimed(keys, timings, claimed, sent.session, confirmed, following))

    def _claim_turns(self, turns: Sequence[tuple[_Job, TickPlan, _Judged]]) -> None:
        """The claims of the turns read together, sent together (the store's claim_many: on
        Consul one transaction while they all apply); a lone one is `_claim`'s. Each is judged
        again on the clock just before they are sent, and goes on with its own answer as
        `_claim`'s would: the claim's transaction is the arbiter, each claim's alone."""
        if len(turns) <= 1:
            for state, plan, judged in turns:
                self._claim(state, plan, judged)
            return
        ready = []
        for state, plan, judged in turns:
            if state.busy is not None or not self._live(state) or self._at_capacity(plan):
                self._unclaimed(state, plan)
                continue
            state.busy = plan.tick
            try:
                session = self.pool.session_for(plan.job.timings)
            except ConsulError as exc:
                self._failed(exc, plan.job, plan.tick)
                self._unclaimed(state, plan)
                self._free(state)
                continue
            ready.append((state, plan, judged, session))
        at = self.clock.monotonic()
        sending, calls = [], []
        for state, plan, judged, session in ready:
            if judged.lag(at) > judged.choice.window:
                self._note("too-late", plan.job, plan.tick, "its claim window closed")
                self._unclaimed(state, plan)
                self._free(state)
                continue
            record = self._claim_record(plan, session, judged.lag(at))
            terms = PLAIN if plan.off is None else plan.off.terms
            sending.append((state, plan, judged))
            calls.append(ClaimCall(plan.job.keys, record, session, self._holder(plan), terms))
        answers = self._claims_sent(calls)
        answered = self.clock.monotonic()
        for (state, plan, judged), call, answer in zip(sending, calls, answers, strict=True):
            if isinstance(answer, InvalidSession):  # made again, and claimed again, once
                self.pool.drop(call.session, str(answer))
                again = self._send_claim(state, plan, judged, attempts=1)
                if again is not None:
                    self._answered(state, plan, again)
            elif isinstance(answer, REFUSALS):  # answered: nothing applied
                self._failed(answer, plan.job, plan.tick)
                self._unclaimed(state, plan)
                self._free(state)
            elif isinstance(answer, ConsulError):
                self._note("unanswered", plan.job, plan.tick, str(answer))
                self._resolve(state, plan, call.session)
            else:  # each run started by a callback of its own: a renewal goes between them
                sent = _Sent(answer, call.record, call.session, at, answered)
                self.clock.call_at(answered, functools.partial(self._answered, state, plan, sent))

    def _claims_sent(self, calls: Sequence[ClaimCall]) -> list[ClaimAnswer]:
        """The store's answers to `calls` (a lone one is `claim`'s), an error in its place."""
        if len(calls) != 1:
            try:
                return self.store.claim_many(calls) if calls else []
            except ConsulError as exc:
                return [exc] * len(calls)
        call = calls[0]
        try:
            return [self.store.claim(call.job, call.record, call.session, call.holder, call.terms)]
        except ConsulError as exc:
            return [exc]

    def _send_claim(
        self, state: _Job, plan: TickPlan, judged: _Judged, attempts: int = 2
    ) -> _Sent | None:
        """The claim's transaction and what it answered. None when there was none (the job is
        free again, the plan left to `_unclaimed`), or Consul did not answer it (it may have
        applied it: the job stays busy until `_resolve` finds out).

        Judged again on the clock just before it is sent: the claim's transaction refuses a
        tick that has a record, but not one whose record retention has deleted, which a claim
        sent long after its read (a pause, a slow answer) would run a second time."""
        terms = PLAIN if plan.off is None else plan.off.terms
        for _ in range(attempts):  # a session Consul forgot (its TTL ran out) is made again once
            try:
                session = self.pool.session_for(plan.job.timings)
            except ConsulError as exc:
                self._failed(exc, plan.job, plan.tick)
                break
            at = self.clock.monotonic()
            if judged.lag(at) > judged.choice.window:
                self._note("too-late", plan.job, plan.tick, "its claim window closed")
                break
            record = self._claim_record(plan, session, judged.lag(at))
            try:
                claim = self.store.claim(plan.job.keys, record, session, self._holder(plan), terms)
            except InvalidSession as exc:
                self.pool.drop(session, str(exc))
                continue
            except REFUSALS as exc:  # answered: nothing applied
                self._failed(exc, plan.job, plan.tick)
                break
            except ConsulError as exc:
                self._note("unanswered", plan.job, plan.tick, str(exc))
                self._resolve(state, plan, session)
                return None
            return _Sent(claim, record, session, at, self.clock.monotonic())
        self._unclaimed(state, plan)
        self._free(state)
        return None

    def _claim_record(self, plan: TickPlan, session: str, lag: float) -> TickRecord:
        claimed_at = plan.tick + timedelta(seconds=max(0.0, lag))
        record = TickRecord(
            plan.tick,
            Outcome.RUNNING,
            worker=self.worker,
            session=session,
            host=self.identity.host,
            pid=self.identity.pid,
            claimed_at=claimed_at,
            start_lag=max(0.0, lag),
            planned_start=plan.turn.planned or None,
        )
        if plan.off is None:
            return record
        note, backfill = plan.off.note, plan.off.backfill
        if plan.off.buffered:
            return record
        if backfill is not None:
            said = (backfill.by, backfill.reason, backfill.at, backfill.id)
            return replace(record, by=said[0], reason=said[1], asked_at=said[2], backfill=said[3])
        if note is None:
            return replace(record, catchup=True)
        return replace(record, by=note.by, reason=note.reason, asked_at=note.at, trigger=note.id)

    def _holder(self, plan: TickPlan) -> bytes:
        """The lock's value while we hold it (who, for what tick: `lockctl status` shows it),
        with the fields every release writes there (tick/plain.py too): the claim's time, the
        worker, the job, the host and the pid, and the tick."""
        fields: dict[str, str | int] = {
            "acquired_at": self.clock.wall().isoformat(timespec="seconds"),
            "worker": self.worker,
            "job": plan.job.name,
        }
        if self.identity.host is not None:
            fields["host"] = self.identity.host
        if self.identity.pid is not None:
            fields["pid"] = self.identity.pid
        fields["tick"] = tick_name(plan.tick)
        return json.dumps(fields, separators=(",", ":")).encode()

    def _complete_paused(
        self, state: _Job, claimed: TickRecord, session: str, said: ControlNote
    ) -> None:
        """Our claim found the job paused: recorded `paused` (who, why) and released at once;
        its body never starts. No answer: the session's end frees the lock, the record stays."""
        paused = claimed.completed(
            Outcome.PAUSED,
            finished_at=self.clock.wall(),
            by=said.by,
            reason=said.reason,
            asked_at=said.at,
        )
        with contextlib.suppress(ConsulError):
            self.store.complete(state.job.keys, paused, session, release=True)
        self._note("paused", state.job, claimed.tick, said.by or "", record=paused)
        self._free(state)

    def _run(self, state: _Job, plan: TickPlan, claimed: Claimed) -> None:
        retry_body = None
        if claimed.timings.retries:
            retry_body = functools.partial(self.bodies, plan.job.unit, plan.tick)
        held = HeldRun(self.store, self.clock, claimed, self._run_done, self.listener, retry_body)
        held.together = self._completions  # after a stop, completed with the other runs
        state.held = held
        lock_index = claimed.record.lock_index
        self._note(
            "claimed", plan.job, plan.tick, f"lock index {lock_index}", record=claimed.record
        )
        if not self.pool.hold(claimed.session, held):
            held.lose("the session is gone")
        if self.stopping or self.stop_asked():  # ended interrupted, its job never started
            held.interrupt(signal.SIGTERM)
        held.start(self.bodies(plan.job.unit, plan.tick))
        if state.abort is not None and stops(state.abort, plan.tick, claimed.session):
            held.abort(state.abort.note)  # heard before this claim's answer was acted on
            state.abort = None

    def _run_done(self, held: HeldRun) -> None:
        state = next(s for s in self._jobs + self._retiring if s.held is held)
        state.held = None
        self.pool.let_go(held.claimed.session, held)
        if state in self._retiring:
            self._retiring.remove(state)
        if self.stopping:
            state.busy = None
            self._close_when_done()
            return
        due = state.housekeep or housekeeps(state.job, held.tick)
        if due:
            state.housekeeping += 1  # counted before the job is free: not quiet until it ends
        self._free(state)
        if due:
            self._housekeep(state, counted=True)  # a retired job's does nothing

    # -- what waits for the job to be free here: a trigger, a catch-up --------------------------
    def _free(self, state: _Job) -> None:
        state.busy = None
        self._close_when_done()
        self._idle(state)

    def _idle(self, state: _Job) -> None:
        """The job may be free here: a trigger heard meanwhile, or a catch-up to look for after
        a turn, goes next (from a timer of its own: never inside the step that freed it)."""
        self._quiet(state)
        backfilling = bool(state.backfills) and not state.backfill_retry.waiting
        buffered = bool(state.buffered) and not state.buffer_retry.waiting
        off = state.triggers or state.catchup_due or state.catchups or backfilling
        wanted = buffered or state.waiting or off
        if not wanted or state.idle_timer is not None or not self._live(state):
            return
        state.idle_timer = self.clock.call_at(self.clock.monotonic(), lambda: self._next(state))

    def _next(self, state: _Job) -> None:
        state.idle_timer = None
        if state.busy is not None or not self._live(state):
            return  # looked at again when the job is free
        if state.buffered and not state.buffer_retry.waiting:  # older than any tick waiting
            self._buffered_next(state)
        elif state.waiting is not None:  # the scheduled tick first: its window is the shortest
            plan, state.waiting = state.waiting, None
            self._take(state, plan)
        elif state.triggers:
            if not state.trigger_retry.waiting:
                self._try_trigger(state)
        elif state.backfills and not state.backfill_retry.waiting:
            self._backfill_next(state)
        elif state.catchups:
            self._catch_up_next(state)
        elif state.catchup_due:
            self._look_for_catchup(state)

    def _overlapped(self, state: _Job, plan: TickPlan | None) -> None:
        """A tick whose turn came while the job ran here, and whose next tick's turn came
        before that run ended: it passed whole, skipped (overlap)."""
        if plan is not None and state.busy is not None:
            detail = f"tick {tick_name(state.busy)} ran here meanwhile"
            self._note("skipped", plan.job, plan.tick, detail, skip=SkipReason.OVERLAP)

    def _try_trigger(self, state: _Job) -> None:
        """The oldest trigger heard: read whether one took it, then claim (trigger_plan)."""
        if not state.triggers or state.busy is not None or not self._live(state):
            return
        note = state.triggers[0]
        sent = self.clock.monotonic()
        try:
            control = self.store.read_control(state.job.keys)
        except ConsulError as exc:
            self._failed(exc, state.job, None)  # no tick lost: tried again
            self._retry_trigger(state)
            return
        now = self.clock.wall()
        plan = trigger_plan(state.job, note, control.taken_index, now)
        lag = (now - plan.tick).total_seconds()
        if note.id is not None and control.taken == note.id.encode():
            self._forget_trigger(state, note)
            self._note("skipped", state.job, plan.tick, "trigger taken", skip=SkipReason.TAKEN)
            self._idle(state)
        elif lag > TRIGGER_WINDOW:
            self._forget_trigger(state, note)
            self._note("skipped", state.job, plan.tick, "trigger expired", skip=SkipReason.OTHER)
            self._idle(state)
        else:
            self._claim(state, plan, _Judged(TickChoice(plan.tick, TRIGGER_WINDOW, lag, 0.0), sent))

    def _retry_trigger(self, state: _Job) -> None:
        """A trigger not claimed (the lock held elsewhere, Consul not answering): again later."""
        if self._live(state):
            state.trigger_retry.arm(self.clock, lambda: self._try_trigger(state))

    def _forget_trigger(self, state: _Job, note: ControlNote) -> None:
        state.triggers = [heard for heard in state.triggers if heard.id != note.id]
        state.trigger_retry.reset()

    def _look_for_catchup(self, state: _Job) -> None:
        """catchup = "latest" (ledger/catchup.py): the newest tick nobody ran, claimed over its
        `missed` record as read, once. Looked for after this replica's first turn and after a
        turn Consul did not answer, once the job is free here (the due tick goes first: its
        window is the shorter); a look Consul does not answer is made after the next turn."""
        if state.job.catchup_all is not None:
            self._look_for_all(state, state.job.catchup_all)
            return
        job, state.catchup_due = state.job, False
        sent = self.clock.monotonic()
        try:
            recorded, date = self.store.read_tick_names(job.keys)
            now = self.clock.wall() if date is None else date
            tick = catchup_tick(job.schedule, now, job.timings.start_deadline, recorded)
            record = None
            if tick is not None and tick in recorded:
                record, _ = self.store.read_tick(job.keys, tick)
            held = tick is not None and may_catch_up(record) and self._held(job, tick)
        except ConsulError as exc:
            self._failed(exc, job, None)
            self._quiet(state)
            return
        state.catchup_look = False
        if tick is None or not may_catch_up(record) or held:
            self._quiet(state)
            return
        plan = catchup_plan(job, tick, record, self.worker)
        lag = (now - tick).total_seconds()
        # the tick to catch up, and the `missed` record (if any) its claim goes over
        self._note("catch-up", job, tick, f"{lag:.1f}s after it", record=record)
        self._claim(state, plan, _Judged(TickChoice(tick, plan.window, lag, 0.0), sent))

    def _look_for_all(self, state: _Job, reach: CatchupReach) -> None:
        """catchup = "all" (ledger/catchup.py `ticks_to_catch_up`): every tick nobody ran in
        the job's reach, oldest first, each claimed in turn once the job is free here. One
        read of the ledger's names, of its records when it has any, and of the control keys
        when a tick may have been paused."""
        job, state.catchup_due = state.job, False
        try:
            names, date = self.store.read_tick_names(job.keys)
            now = self.clock.wall() if date is None else date
            records = {r.tick: r for r in self.store.read_ticks(job.keys)} if names else {}
            deadline = job.timings.start_deadline
            ticks = ticks_to_catch_up(job.schedule, now, deadline, reach, records, self._holds(job))
        except ConsulError as exc:
            self._failed(exc, job, None)
            self._quiet(state)
            return
        state.catchup_look, state.catchups = False, ticks
        self._idle(state)

    def _catch_up_next(self, state: _Job) -> None:
        """The next tick "all" catches up: its record read again (someone may have run it or
        recorded it missed since the look), then claimed over it as read."""
        job, tick = state.job, state.catchups.pop(0)
        sent = self.clock.monotonic()
        try:
            record, date = self.store.read_tick(job.keys, tick)
        except ConsulError as exc:
            self._failed(exc, job, None)
            state.catchups, state.catchup_look = [], True  # looked for after the next turn
            self._quiet(state)
            return
        if not may_catch_up(record):
            self._idle(state)  # taken meanwhile: on to the next one
            return
        now = self.clock.wall() if date is None else date
        plan = catchup_plan(job, tick, record, self.worker)
        lag = (now - tick).total_seconds()
        self._note("catch-up", job, tick, f"{lag:.1f}s after it", record=record)
        self._claim(state, plan, _Judged(TickChoice(tick, plan.window, lag, 0.0), sent))

    def _backfill_next(self, state: _Job) -> None:
        """The next tick of a backfill: its record read (someone may have run it since the
        backfill was asked), then claimed over it as read; dropped once the backfill is older
        than BACKFILL_WINDOW."""
        job, (note, tick) = state.job, state.backfills.pop(0)
        assert note.at is not None
        sent = self.clock.monotonic()
        try:
            record, date = self.store.read_tick(job.keys, tick)
            # a tick with no record may be one whose record retention deleted: asked of its
            # ledger's names (one cheap read), as `lockctl backfill` asked
            names = self.store.read_tick_names(job.keys)[0] if record is None else set()
        except ConsulError as exc:
            self._failed(exc, job, tick)
            self._backfill_later(state, note, tick)
            return
        now = self.clock.wall() if date is None else date
        if record is None and beyond_ledger(tick, names):
            detail = "backfill: older than the ledger's oldest record"
            self._note("skipped", job, tick, detail, skip=SkipReason.OTHER)
            self._idle(state)
            return
        if (now - note.at).total_seconds() > BACKFILL_WINDOW:
            state.backfills = [(n, t) for n, t in state.backfills if n.id != note.id]
            self._note("skipped", job, tick, "backfill expired", skip=SkipReason.OTHER)
            self._idle(state)
        elif not may_backfill(record):
            state.backfill_retry.reset()  # settled: the next one starts afresh
            self._idle(state)  # run already (here, elsewhere, or before the backfill)
        else:
            plan = backfill_plan(job, tick, record, note, self.worker)
            lag = (now - tick).total_seconds()
            self._note("backfill", job, tick, f"{lag:.1f}s after it ({note.id})", record=record)
            self._claim(state, plan, _Judged(TickChoice(tick, plan.window, lag, 0.0), sent))

    def _backfill_later(self, state: _Job, note: BackfillNote, tick: datetime) -> None:
        """A backfill's tick not claimed (the lock held elsewhere, Consul not answering): first
        in line again, looked at after TRIGGER_POLL, doubling up to TRIGGER_POLL_MAX (never at
        once: the same refusal); the scheduled ticks and triggers meanwhile go on as usual."""
        state.backfills.insert(0, (note, tick))
        if self._live(state):
            state.backfill_retry.arm(self.clock, lambda: self._idle(state))

    # -- overlap = "buffer_one": a tick kept until the run before it ends ----------------------
    def _buffer(self, state: _Job, plan: TickPlan) -> None:
        """The tick came while the job runs here: recorded `buffered` (one write, where it has
        no record), and claimed over that record once the job is free here (`_buffered_next`).
        A blackout window's tick is recorded so instead; Consul not answering, the tick waits
        as under "skip" (its fate look records it)."""
        window = holding_window(plan.job.blackouts, plan.tick)
        if window is not None:
            self._blackout(state, plan, window, None)
            return
        kept = TickRecord(
            plan.tick,
            Outcome.BUFFERED,
            worker=self.worker,
            host=self.identity.host,
            pid=self.identity.pid,
            claimed_at=self.clock.wall(),
        )
        try:
            written = self.store.record_unrun(plan.job.keys, [kept])
        except ConsulError as exc:
            self._failed(exc, plan.job, plan.tick)
            self._overlapped(state, state.waiting)
            state.waiting = plan
            self._arm_fate(state, plan)
            return
        if not written:  # recorded meanwhile (its fate, a claim elsewhere): not to keep
            self._note("skipped", plan.job, plan.tick, "taken", skip=SkipReason.TAKEN)
            return
        state.buffered.append(buffered_plan(plan.job, plan.tick, None, self.worker))
        detail = f"tick {tick_name(state.busy)} runs here" if state.busy is not None else ""
        self._note("buffered", plan.job, plan.tick, detail, record=written[0])

    def _buffered_seen(self, state: _Job, plan: TickPlan, record: TickRecord) -> None:
        """A turn or a fate look read the tick `buffered` (by this replica or another): kept,
        and claimed over that record from a timer once the lock is free, whoever held it (its
        holder may be gone). Not by a core whose process ends after its one tick."""
        if record.outcome is not Outcome.BUFFERED or not self.fates:
            return
        if any(kept.tick == plan.tick for kept in state.buffered):
            return  # kept already (here, its own)
        self._buffered_later(state, buffered_plan(plan.job, plan.tick, None, self.worker))

    def _buffered_next(self, state: _Job) -> None:
        """The oldest tick kept `buffered`: its record read (run or recorded since?), then
        claimed over it as read while within its start deadline, else recorded `missed` over
        it (once, whoever writes first)."""
        plan = state.buffered.pop(0)
        job, tick = plan.job, plan.tick
        sent = self.clock.monotonic()
        try:
            record, date = self.store.read_tick(job.keys, tick)
        except ConsulError as exc:
            self._failed(exc, job, tick)
            self._buffered_later(state, plan)
            return
        if record is None or not still_buffered(record):
            state.buffer_retry.reset()  # settled: the next one starts afresh
            self._idle(state)  # run, or recorded, since
            return
        now = self.clock.wall() if date is None else date
        lag = (now - tick).total_seconds()
        if lag > plan.window:
            self._expire_buffered(state, plan, replace(record, worker=self.worker), now)
            return
        terms = ClaimTerms(over=record.modify_index)
        over = replace(plan, off=OffSchedule(terms, buffered=True))
        self._claim(state, over, _Judged(TickChoice(tick, plan.window, lag, 0.0), sent))

    def _expire_buffered(
        self, state: _Job, plan: TickPlan, record: TickRecord, now: datetime
    ) -> None:
        """A buffered tick past its start deadline: recorded `missed` over its record as read."""
        missed = record.completed(Outcome.MISSED, finished_at=now)
        try:
            written = self.store.record_unrun(plan.job.keys, [missed])
        except ConsulError as exc:
            self._failed(exc, plan.job, plan.tick)
            self._buffered_later(state, plan)
            return
        state.buffer_retry.reset()
        self._missed(plan.job, written)
        self._idle(state)

    def _buffered_later(self, state: _Job, plan: TickPlan) -> None:
        """A buffered tick not claimed (the lock held, Consul not answering): first in line
        again, looked at after TRIGGER_POLL, doubling up to TRIGGER_POLL_MAX."""
        state.buffered.insert(0, plan)
        if self._live(state):
            state.buffer_retry.arm(self.clock, lambda: self._idle(state))

    def _holds(self, job: CoreJob) -> Callable[[datetime], bool]:
        """`_held` for many ticks: the control keys read once, and only if a tick needs them."""
        pauses: list[Any] = []

        def held(tick: datetime) -> bool:
            if holding_window(job.blackouts, tick) is not None:
                return True
            if not pauses:
                pauses.append(self.store.read_control(job.keys).pauses)
            return pauses[0].holding(tick) is not None

        return held

    def _held(self, job: CoreJob, tick: datetime) -> bool:
        """Whether a pause held `tick` (resumed since: every replica was down meanwhile), so it
        was not due and is not caught up (a pause's tick is no missed one); read only for a
        tick that would be caught up otherwise."""
        if holding_window(job.blackouts, tick) is not None:
            return True  # a blackout's tick is not due either: never caught up
        return self.store.read_control(job.keys).pauses.holding(tick) is not None

    def _unclaimed(self, state: _Job, plan: TickPlan) -> None:
        """`plan` was not claimed, and may still be: a tick's fate is looked at once its window
        closed, a trigger is tried again, a catch-up looked for after the next turn (never at
        once: a claim refused for good, too late, would be tried again at the same instant)."""
        if plan.off is None:
            self._arm_fate(state, plan)
        elif plan.off.buffered:
            self._buffered_later(state, plan)
        elif plan.off.backfill is not None:
            self._backfill_later(state, plan.off.backfill, plan.tick)
        elif plan.off.note is not None:
            self._retry_trigger(state)
        else:  # the lock held elsewhere (maybe catching up the rest): looked for after a turn
            state.catchups, state.catchup_look = [], True

    # -- a tick's fate, and housekeeping ---------------------------------------------------------
    def _arm_fate(self, state: _Job, plan: TickPlan) -> None:
        """Look at the tick once its window closed on every clock within MISSED_GRACE of ours,
        staggered by rank as claims are (the first look usually settles it for the others)."""
        if not self.fates:
            return
        grace = MISSED_GRACE + plan.turn.rank * CLAIM_STAGGER
        due = self._monotonic_at(plan.closes + timedelta(seconds=grace))
        self.clock.call_at(due, lambda: self._fate(state, plan))

    def _fate(self, state: _Job, plan: TickPlan) -> None:
        """Nobody claimed the tick in its window (Consul's clock says it closed): record it
        missed, once."""
        if not self._live(state):
            return
        try:
            record, date = self.store.read_tick(plan.job.keys, plan.tick)
            # a stop that came while it was read does not skip the record: nobody else may write
            # it before a replica starts again (one write, and only for a tick nobody ran)
            if record is not None:
                self._buffered_seen(state, plan, record)
                return
            settled = plan.closes + timedelta(seconds=MISSED_GRACE)
            if date is not None and date < settled:  # not closed on Consul's clock yet
                wait = (settled - date).total_seconds()
                self.clock.call_at(self.clock.monotonic() + wait, lambda: self._fate(state, plan))
                return
            now = date if date is not None else self.clock.wall()
            self._missed(
                plan.job, record_missed(self.store, plan.job, [plan.tick], self.worker, now)
            )
        except REFUSALS as exc:  # no retry fixes it: said once; housekeeping records it later
            self._failed(exc, plan.job, plan.tick)
        except ConsulError:
            due = self.clock.monotonic() + FATE_RETRY
            self.clock.call_at(due, lambda: self._fate(state, plan))

    def _resolve(self, state: _Job, plan: TickPlan, session: str) -> None:
        """A claim Consul did not answer may have been applied: until a read tells, the job is
        busy here (a claim of the next tick under the same session would re-acquire that lock,
        and a later release would free it under that run). Applied: the tick is ours with no
        run under it, completed `interrupted` (the body never started) and the lock released.
        Consul still not answering: read again in FATE_RETRY."""
        state.unanswered = session
        try:
            record, _ = self.store.read_tick(plan.job.keys, plan.tick)
            ours = record is not None and record.session == session
            if record is not None and ours and record.outcome is Outcome.RUNNING:
                ended = record.completed(Outcome.INTERRUPTED, finished_at=self.clock.wall())
                answer = self.store.complete(plan.job.keys, ended, session, release=True)
                if not answer.recorded and answer.released is None:
                    raise ConsulUnavailable("no answer to the completion of an unanswered claim")
                self._note("orphan", plan.job, plan.tick, "completed interrupted", record=ended)
        except ConsulError:
            due = self.clock.monotonic() + FATE_RETRY
            self.clock.call_at(due, lambda: self._resolve(state, plan, session))
            return
        state.unanswered = None
        if record is None:
            self._unclaimed(state, plan)
        self._free(state)

    def _housekeep(
        self, state: _Job, settle: datetime | None = None, *, counted: bool = False
    ) -> None:
        """One housekeeping (below); the job is not quiet while it goes on: a `lockctl run`
        ends at its quiet, and a stop while the read is out would leave the retention of a
        per-tick run to nobody (`counted`: the caller counted it already)."""
        if not counted:
            state.housekeeping += 1
        self._housekeepings.append((state, settle))
        self._next_housekeeping()

    def _next_housekeeping(self) -> None:
        """The oldest housekeeping waiting, unless HOUSEKEEPINGS_AT_ONCE are under way; the
        next one from a timer of its own once it is over (never nested in this one)."""
        if self._housekeeping_now >= HOUSEKEEPINGS_AT_ONCE or not self._housekeepings:
            return
        state, settle = self._housekeepings.popleft()
        self._housekeeping_now += 1
        try:
            self._housekeep_now(state, settle)
        finally:
            self._housekeeping_now -= 1
            state.housekeeping -= 1
        self._quiet(state)
        if self._housekeepings:
            self.clock.call_at(self.clock.monotonic(), self._next_housekeeping)

    def _housekeep_now(self, state: _Job, settle: datetime | None) -> None:
        """The ticks nobody ran recorded missed (missed_ticks: after the oldest record, within
        its walk), and retention (to_prune). Consul's clock judges both: a read's answer. The
        first, at the start, settles every tick before `settle` (only it sees the ticks from
        before this core): tried again until Consul answers, and while one of them can not be
        called missed yet on Consul's clock (its Date has whole seconds: up to a second behind
        the instant this turn was timed for); a later one waits for the next run."""
        if not self._live(state):
            return
        job = state.job
        try:
            recorded, date = self.store.read_tick_names(job.keys)  # names only, and the clock
            # A stop that came while it was read (the read waits aside) still lets it record the
            # ticks nobody ran (a `lockctl run` from a timer is the only replica that sees the
            # ticks before its start; writes only for such ticks); retention waits (below)
            now = date if date is not None else self.clock.wall()
            deadline = job.timings.start_deadline
            limit = MAX_MISSED_PER_HOUSEKEEPING
            missed = missed_ticks(job.schedule, recorded, now, deadline, limit=limit)
            written = record_missed(self.store, job, missed[::-1], self.worker, now)
            pruned = 0
            if self._live(state):  # retention can wait for a later housekeeping
                pruned = self.store.prune(
                    job.keys, to_prune(recorded | set(missed), job.history_limit, now=now)
                )
        except ConsulError as exc:
            if isinstance(exc, REFUSALS):  # no retry fixes it: said; after the next run again
                self._failed(exc, job, None)
            elif settle is not None:
                again = functools.partial(self._housekeep, state, settle)
                self.clock.call_at(self.clock.monotonic() + FATE_RETRY, again)
            state.housekeep = True  # else after the next run won here
            return
        state.housekeep = False
        self._missed(job, written)
        if written or pruned:
            said = f"{len(written)} missed recorded, {pruned} pruned"
            self._note("housekeeping", job, None, said, count=pruned)
        if settle is not None:
            deadline = job.timings.start_deadline
            if unsettled_ticks(job.schedule, recorded | set(missed), now, deadline, settle):
                again = functools.partial(self._housekeep, state, settle)
                self.clock.call_at(self.clock.monotonic() + SETTLE_AGAIN, again)

    def _failed(self, exc: ConsulError, job: CoreJob, tick: datetime | None) -> None:
        """A request that failed: `refused` (Consul's 403, a seam's check: not an outage, and no
        retry fixes it), else `unavailable` (Consul did not answer)."""
        if not isinstance(exc, REFUSALS):
            self._note("unavailable", job, tick, str(exc))
        elif isinstance(exc, PermissionDenied):  # unknown, deleted, or lacking a right
            self._note("refused", job, tick, f"Consul refused the token: {exc}")
        else:
            self._note("refused", job, tick, str(exc))

    def _missed(self, job: CoreJob, written: Sequence[TickRecord]) -> None:
        for record in written:
            self._note("missed", job, record.tick, record.outcome.value, record=record)

    # -- helpers ---------------------------------------------------------------------------------
    def _since(self, moment: float) -> float:
        return self.clock.monotonic() - moment

    def _monotonic_at(self, moment: datetime) -> float:
        """The monotonic instant at which this replica's wall clock shows `moment`."""
        return self.clock.monotonic() + (moment - self.clock.wall()).total_seconds()

    def _note(
        self, kind: str, job: CoreJob, tick: datetime | None, detail: str = "", **more: Any
    ) -> None:
        """Tell the listener; `more`: the note's record and skip reason (edge.py Note)."""
        if self.listener is not None:
            self.listener(Note(kind, job.unit, tick, detail, **more))


def _calendared(job: CoreJob) -> CoreJob:
    """The job with its schedule's ticks cached (tick/calendar.py): asked for at every turn,
    and its blackout windows' alike (each turn asks which window holds its tick)."""
    windows = tuple(replace(w, schedule=Calendar.of(w.schedule)) for w in job.blackouts)
    return replace(job, schedule=Calendar.of(job.schedule), blackouts=windows)


def _skip_reason(claim: Claim) -> SkipReason:
    if claim.tick_taken:
        return SkipReason.TAKEN
    return SkipReason.LOCK_DELAY if lock_delayed(claim) else SkipReason.OVERLAP
