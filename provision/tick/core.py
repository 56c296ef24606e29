"""The tick core: one replica's ticks, each owned from plan to record, over a TickStore and a
TimerClock only (so one thread runs it, and a simulation runs a fleet of them in one thread).

    start    each job's next tick, planned (`plan`: the tick, its turn, its claim window) and
             a timer set for this replica's turn at it (ledger/turns.py: rank by the job's claim
             order, r x CLAIM_STAGGER after the planned start)
    turn     read the tick's record, and Consul's clock in the answer (a read: no Raft write;
             no write at all when the tick is taken) -> judged again on the clock as it is sent
             -> claim it: ONE transaction (the tick has no record + the lock + the record),
             the arbiter whatever the clocks and ranks say
    run      held.py: the body under the lock, renewed by the session pool (pool.py), fenced
             by the pure decision, the record completed and the lock released in one write
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
would re-acquire the lock its own run holds.
"""

from __future__ import annotations

import contextlib
import functools
import json
import signal
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from provision.consul import ConsulError, ConsulUnavailable
from provision.ledger.control import decode_note, unrun_record
from provision.ledger.records import TickOutcome, TickRecord, tick_name
from provision.ledger.ticks import (
    MISSED_GRACE,
    MISSED_WALK,
    TickChoice,
    claim_window,
    judge_tick,
    missed_ticks,
    to_prune,
)
from provision.ledger.turns import CLAIM_STAGGER, Turn, turn
from provision.schedule import Schedule
from provision.tick.calendar import Calendar
from provision.tick.edge import BodyFactory, Cancellable, Listener, Note, TimerClock
from provision.tick.held import Claimed, HeldRun
from provision.tick.pool import SessionPool, confirmation_time
from provision.tick.store import (
    Claim,
    InvalidSession,
    JobKeys,
    TickStore,
    lock_delayed,
)
from provision.timings import JobTimings

MAX_MISSED_PER_HOUSEKEEPING = 60  # one transaction's worth (ledger/store.py CHUNK)
FATE_RETRY = 5.0  # seconds: Consul did not answer a look at a tick's fate: look again then


@dataclass(frozen=True)
class CoreJob:
    """One job as the core runs it: where it is in Consul, its schedule, timings, the workers
    that may claim it (its claim order), and how many records its ledger keeps."""

    keys: JobKeys
    schedule: Schedule
    timings: JobTimings
    workers: tuple[str, ...] = ()
    history_limit: int = 50

    @property
    def name(self) -> str:
        return self.keys.name


@dataclass(frozen=True)
class Identity:
    """Who this core is, as its records and its lock's value say."""

    worker: str
    host: str | None = None
    pid: int | None = None


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

    @property
    def closes(self) -> datetime:
        """When nobody may claim it any more (on Consul's clock)."""
        return self.tick + timedelta(seconds=self.window)


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
) -> int:
    """Record `ticks` (nobody ran them) `paused` where a pause held them, else `missed`, each
    only where no record exists: how many were written. The control keys are read only when
    there is something to record (rarely)."""
    if not ticks:
        return 0
    pauses = store.read_control(job.keys).pauses
    records = [unrun_record(tick, worker, now, pauses.holding(tick)) for tick in ticks]
    return len(store.record_unrun(job.keys, records))


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
class _Job:
    """What the core knows of one job between its ticks."""

    job: CoreJob
    turn: Cancellable | None = None  # the timer of the next tick's turn
    busy: datetime | None = None  # the tick whose claim is in flight or whose run goes on
    held: HeldRun | None = None
    housekeep: bool = False  # a housekeeping is due after the next run won here
    unanswered: str | None = None  # the session of a claim Consul did not answer


class TickCore:
    """One replica's ticks: `start()` plans every job's next tick, `stop()` ends it (no more
    claims; runs interrupted, completed, released; sessions destroyed)."""

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
        self.pool = SessionPool(store, clock, identity.worker)
        self._jobs = [_Job(replace(j, schedule=Calendar.of(j.schedule))) for j in jobs]
        self.stopping = False

    @property
    def worker(self) -> str:
        return self.identity.worker

    @property
    def runs(self) -> list[HeldRun]:
        """The runs this core holds a lock for now."""
        return [state.held for state in self._jobs if state.held is not None]

    def plan(self, job: CoreJob, tick: datetime) -> TickPlan:
        return plan_tick(job, tick, self.worker)

    def start(self) -> None:
        """Plan each job's tick: the current one while its window is open, else the next; and
        a housekeeping once the windows of the ticks before now have closed."""
        now = self.clock.wall()
        for state in self._jobs:
            schedule = state.job.schedule
            current = self.plan(state.job, schedule.latest_tick_at_or_before(now))
            first = current if now < current.closes else self.plan(state.job, current.following)
            self._arm_turn(state, first)
            settled = self._monotonic_at(current.closes + timedelta(seconds=MISSED_GRACE))
            self.clock.call_at(settled, functools.partial(self._housekeep, state, True))

    def stop(self) -> None:
        """No more claims; every run is told to stop, completed and released; the sessions are
        destroyed once the last run is done (at once when none runs)."""
        self.stopping = True
        for state in self._jobs:
            if state.turn is not None:
                state.turn.cancel()
            if state.held is not None:
                state.held.interrupt(signal.SIGTERM)
        if not self.runs:
            self.pool.close()

    # -- a tick's turn -------------------------------------------------------------------------
    def _arm_turn(self, state: _Job, plan: TickPlan) -> None:
        due = plan.tick + timedelta(seconds=plan.turn.delay)
        state.turn = self.clock.call_at(self._monotonic_at(due), lambda: self._turn(state, plan))

    def _turn(self, state: _Job, plan: TickPlan) -> None:
        if self.stopping:
            return
        self._arm_turn(state, self._successor(state, plan))
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
        """This replica's turn at the tick: read, then claim unless it is taken or not due."""
        if state.busy is not None:
            self._note(
                "skipped", plan.job, plan.tick, f"busy: tick {tick_name(state.busy)} runs here"
            )
            self._arm_fate(state, plan)
            return
        sent = self.clock.monotonic()
        try:
            # stale: any server answers; a claim it missed, the claim's own transaction refuses
            record, date = self.store.read_tick(plan.job.keys, plan.tick, stale=True)
        except ConsulError as exc:
            self._note("unavailable", plan.job, plan.tick, str(exc))
            self._arm_fate(state, plan)
            return
        if not claimable(record):
            self._note("skipped", plan.job, plan.tick, "taken")
            return
        # Consul's clock now: its Date, plus all the time since the read was sent (a slow
        # answer, a pause): never less than it is. Whether the tick has come: the Date alone.
        now = self.clock.wall() if date is None else date + timedelta(seconds=self._since(sent))
        deadline = plan.job.timings.start_deadline
        judged = _Judged(judge_tick(plan.job.schedule, plan.tick, now, deadline, date), sent)
        choice = judged.choice
        if self.stopping:
            return
        if choice.too_late:
            self._note("skipped", plan.job, plan.tick, "too late")
            self._arm_fate(state, plan)
        elif choice.wait > 0:  # Consul's clock is not at the tick yet: let it come, then look
            due = self.clock.monotonic() + choice.wait
            self.clock.call_at(due, lambda: self._take(state, plan))
        elif state.busy is None:  # still free after the read (a slow answer lets others run)
            self._claim(state, plan, judged)
        else:
            self._arm_fate(state, plan)

    # -- the claim -----------------------------------------------------------------------------
    def _claim(self, state: _Job, plan: TickPlan, judged: _Judged) -> None:
        """Claim the tick (one transaction); won: its run starts under the lock."""
        state.busy = plan.tick
        sent = self._send_claim(state, plan, judged)
        if sent is None:
            return
        if not sent.claim.won:
            state.busy = None
            self._note("skipped", plan.job, plan.tick, _refusal(sent.claim))
            if not sent.claim.tick_taken:
                self._arm_fate(state, plan)
            return
        claim = sent.claim
        claimed = replace(sent.record, lock_index=claim.lock_index, modify_index=claim.record_index)
        if claim.paused is not None:
            self._complete_paused(state, claimed, sent.session, claim.paused)
            return
        confirmed = confirmation_time(sent.at, sent.answered)
        keys, timings = plan.job.keys, plan.job.timings
        following = self._monotonic_at(plan.following)
        self._run(state, plan, Claimed(keys, timings, claimed, sent.session, confirmed, following))

    def _send_claim(self, state: _Job, plan: TickPlan, judged: _Judged) -> _Sent | None:
        """The claim's transaction and what it answered. None when there was none (the job is
        free again, the tick's fate looked at later), or Consul did not answer it (it may have
        applied it: the job stays busy until `_resolve` finds out).

        Judged again on the clock just before it is sent: the claim's transaction refuses a
        tick that has a record, but not one whose record retention has deleted, which a claim
        sent long after its read (a pause, a slow answer) would run a second time."""
        for _ in range(2):  # a session Consul forgot (its TTL ran out) is made again once
            try:
                session = self.pool.session_for(plan.job.timings)
            except ConsulError as exc:
                self._note("unavailable", plan.job, plan.tick, str(exc))
                break
            at = self.clock.monotonic()
            if judged.lag(at) > judged.choice.window:
                self._note("skipped", plan.job, plan.tick, "too late")
                break
            record = self._claim_record(plan, session, judged.lag(at))
            try:
                claim = self.store.claim(plan.job.keys, record, session, self._holder(plan))
            except InvalidSession as exc:
                self.pool.drop(session, str(exc))
                continue
            except ConsulError as exc:
                self._note("unanswered", plan.job, plan.tick, str(exc))
                self._resolve(state, plan, session)
                return None
            return _Sent(claim, record, session, at, self.clock.monotonic())
        state.busy = None
        self._arm_fate(state, plan)
        return None

    def _claim_record(self, plan: TickPlan, session: str, lag: float) -> TickRecord:
        claimed_at = plan.tick + timedelta(seconds=max(0.0, lag))
        return TickRecord(
            plan.tick,
            TickOutcome.RUNNING,
            worker=self.worker,
            session=session,
            host=self.identity.host,
            pid=self.identity.pid,
            claimed_at=claimed_at,
            start_lag=max(0.0, lag),
            planned_start=plan.turn.planned or None,
        )

    def _holder(self, plan: TickPlan) -> bytes:
        """The lock's value while we hold it (who, for what tick: `lockctl status` shows it)."""
        fields = {"worker": self.worker, "job": plan.job.name, "tick": tick_name(plan.tick)}
        return json.dumps(fields, separators=(",", ":")).encode()

    def _complete_paused(self, state: _Job, claimed: TickRecord, session: str, note: bytes) -> None:
        """Our claim found the job paused: recorded `paused` (who, why) and released at once;
        its body never starts. No answer: the session's end frees the lock, the record stays."""
        said = decode_note(note)
        paused = claimed.completed(
            TickOutcome.PAUSED,
            finished_at=self.clock.wall(),
            by=said.by,
            reason=said.reason,
            asked_at=said.at,
        )
        with contextlib.suppress(ConsulError):
            self.store.complete(state.job.keys, paused, session, release=True)
        state.busy = None
        self._note("paused", state.job, claimed.tick, said.by or "")

    def _run(self, state: _Job, plan: TickPlan, claimed: Claimed) -> None:
        retry_body = None
        if claimed.timings.retries:
            retry_body = functools.partial(self.bodies, plan.job.name, plan.tick)
        held = HeldRun(self.store, self.clock, claimed, self._run_done, self.listener, retry_body)
        state.held = held
        self._note("claimed", plan.job, plan.tick, f"lock index {claimed.record.lock_index}")
        if not self.pool.hold(claimed.session, held):
            held.lose("the session is gone")
        if self.stopping:
            held.interrupt(signal.SIGTERM)
        held.start(self.bodies(plan.job.name, plan.tick))

    def _run_done(self, held: HeldRun) -> None:
        state = next(s for s in self._jobs if s.held is held)
        state.held, state.busy = None, None
        self.pool.let_go(held.claimed.session, held)
        if self.stopping:
            if not self.runs:
                self.pool.close()
            return
        if state.housekeep or housekeeps(state.job, held.tick):
            self._housekeep(state)

    # -- a tick's fate, and housekeeping ---------------------------------------------------------
    def _arm_fate(self, state: _Job, plan: TickPlan) -> None:
        """Look at the tick once its window closed on every clock within MISSED_GRACE of ours,
        staggered by rank as claims are (the first look usually settles it for the others)."""
        grace = MISSED_GRACE + plan.turn.rank * CLAIM_STAGGER
        due = self._monotonic_at(plan.closes + timedelta(seconds=grace))
        self.clock.call_at(due, lambda: self._fate(state, plan))

    def _fate(self, state: _Job, plan: TickPlan) -> None:
        """Nobody claimed the tick in its window (Consul's clock says it closed): record it
        missed, once."""
        if self.stopping:
            return
        try:
            record, date = self.store.read_tick(plan.job.keys, plan.tick)
            if record is not None:
                return
            settled = plan.closes + timedelta(seconds=MISSED_GRACE)
            if date is not None and date < settled:  # not closed on Consul's clock yet
                wait = (settled - date).total_seconds()
                self.clock.call_at(self.clock.monotonic() + wait, lambda: self._fate(state, plan))
                return
            now = date if date is not None else self.clock.wall()
            if record_missed(self.store, plan.job, [plan.tick], self.worker, now):
                self._note("missed", plan.job, plan.tick, "recorded")
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
            if record is not None and ours and record.outcome is TickOutcome.RUNNING:
                ended = record.completed(TickOutcome.INTERRUPTED, finished_at=self.clock.wall())
                answer = self.store.complete(plan.job.keys, ended, session, release=True)
                if not answer.recorded and answer.released is None:
                    raise ConsulUnavailable("no answer to the completion of an unanswered claim")
                self._note("orphan", plan.job, plan.tick, "completed interrupted")
        except ConsulError:
            due = self.clock.monotonic() + FATE_RETRY
            self.clock.call_at(due, lambda: self._resolve(state, plan, session))
            return
        state.unanswered, state.busy = None, None
        if record is None:
            self._arm_fate(state, plan)

    def _housekeep(self, state: _Job, first: bool = False) -> None:
        """The ticks nobody ran recorded missed (missed_ticks: after the oldest record, within
        its walk), and retention (to_prune). Consul's clock judges both: a read's answer. The
        first, at the start, is tried again until Consul answers (only it sees the ticks from
        before this core); a later one waits for the next run."""
        if self.stopping:
            return
        job = state.job
        try:
            recorded, date = self.store.read_tick_names(job.keys)  # names only, and the clock
            now = date if date is not None else self.clock.wall()
            deadline = job.timings.start_deadline
            limit = MAX_MISSED_PER_HOUSEKEEPING
            missed = missed_ticks(job.schedule, recorded, now, deadline, limit=limit)
            written = record_missed(self.store, job, missed[::-1], self.worker, now)
            self.store.prune(job.keys, to_prune(recorded | set(missed), job.history_limit, now=now))
        except ConsulError:
            if first:
                again = functools.partial(self._housekeep, state, True)
                self.clock.call_at(self.clock.monotonic() + FATE_RETRY, again)
            state.housekeep = True  # else after the next run won here
            return
        state.housekeep = False
        if written:
            self._note("housekeeping", job, None, f"{written} missed recorded")

    # -- helpers ---------------------------------------------------------------------------------
    def _since(self, moment: float) -> float:
        return self.clock.monotonic() - moment

    def _monotonic_at(self, moment: datetime) -> float:
        """The monotonic instant at which this replica's wall clock shows `moment`."""
        return self.clock.monotonic() + (moment - self.clock.wall()).total_seconds()

    def _note(self, kind: str, job: CoreJob, tick: datetime | None, detail: str = "") -> None:
        if self.listener is not None:
            self.listener(Note(kind, job.name, tick, detail))
