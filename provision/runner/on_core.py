"""`lockctl run` of a scheduled job on the tick core (provision/tick/): the process around the
core's one tick (tick/once.py). A plain lock (no schedule) runs in runner/plain.py.

    the clock thread   one ThreadTimerClock on the Consul agent's clock: the core's turn at the
                       tick (read, judge, claim, HeldRun, complete), the session's renewals, the
                       fencing bounds, the body's end, housekeeping and a catch-up after
    the main thread    starts the turn, waits for the core to be quiet (a stop asked by a signal
                       stops the core: the run interrupted, completed, released); with --wait, a
                       claim refused for the lock is taken again once the lock's key changes
                       (watch_lock), until the tick's window closes or --timeout; then the
                       sessions destroyed, the clock closed
    the abort watch    from the first body's start to the turn's end, a blocking read of the
                       job's abort key (abort_watch.py): `lockctl abort` of this run stops it on
                       the clock (core.abort), recorded `aborted`, exit 143
    the events         the core's notes as today's event lines (acquired, fenced, timed-out,
                       aborted, retrying, released / lost, catch-up, housekeeping); the tick's
                       verdict as today's skipped / missed / interrupted lines and exit codes
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import ClassVar, Protocol, TypeVar

from provision.consul import (
    AgentClock,
    Consul,
    ConsulError,
    ConsulUnavailable,
    PermissionDenied,
    RetryPolicy,
)
from provision.errors import EXIT_ABORTED, EXIT_JOB_TIMEOUT, EXIT_LOCK_LOST, EXIT_WAIT_TIMEOUT
from provision.ledger.aborts import AbortNote
from provision.ledger.catchup import ALL, LATEST
from provision.ledger.records import TickRecord, taken_fields, tick_name
from provision.ledger.store import Claim, ClaimTerms
from provision.ledger.ticks import MISSED_GRACE, skew_to_say
from provision.outcomes import Outcome
from provision.runner.abort_watch import AbortWatch
from provision.runner.child import Child, check_program
from provision.runner.containment import first_telling
from provision.runner.core_body import RunnerBody, Unfenced, run_env
from provision.runner.environment import credential_files, job_environment
from provision.runner.events import EventLog, ms
from provision.runner.http_job import HttpJob
from provision.runner.output import runner_secrets
from provision.runner.results import RunOptions, RunResult, SkipReason
from provision.runner.stop import StopRequest
from provision.runner.tick_lock import job_schedule, lock_refusal
from provision.runner.tick_verdicts import missed_fields, paused_refusal
from provision.sessions import AgentlessNode, SessionTerms
from provision.tick.aside import aside_store
from provision.tick.clock import Clock, ThreadTimerClock
from provision.tick.consul_store import ConsulTickStore, TailedStore, Tails, TailsOf
from provision.tick.core import CoreJob, Identity, TickCore, record_missed
from provision.tick.edge import Body, Note, Run
from provision.tick.once import OneTick, Verdict, wait_deadline
from provision.tick.store import PLAIN, JobKeys
from provision.workers.config import JobConfig

# The core's store calls wait aside (tick/aside.py) and retry briefly, as the scheduler's do
# (scheduler/on_core.py): a call retried for the client's whole deadline would hold the claim.
CORE_RETRY = RetryPolicy(deadline=1.0, first_backoff=0.05, max_backoff=0.25)
STOP_POLL = 0.1  # seconds between two looks at a stop request while the core works
WATCH_POLL = 1.0  # seconds: the longest blocking read of the lock's key while waiting (--wait)
MIN_DELAY_RETRY = 0.1
SETTLE_WITHIN = 20.0  # seconds the core is given to end its run and destroy its sessions

_T = TypeVar("_T")


@dataclass(frozen=True)
class TickAsk:
    """What `lockctl run` asks of the core: the job, this worker (and its agentless node), the
    command, the flags, and the tick chosen when the run started (precheck.scheduled_tick)."""

    job: JobConfig
    worker: str
    command: tuple[str, ...]
    options: RunOptions
    tick: datetime
    node: AgentlessNode | None = None


class Asked(Protocol):
    """What Said and prepare_body read of a run's ask: a tick's (TickAsk), or a plain lock's
    (runner/plain.py PlainAsk, whose tick is None)."""

    @property
    def job(self) -> JobConfig: ...

    @property
    def command(self) -> tuple[str, ...]: ...

    @property
    def tick(self) -> datetime | None: ...


def core_job(ask: TickAsk) -> CoreJob:
    """The job as the core runs it; --min-hold overrides the config's min_hold."""
    job, schedule = ask.job, job_schedule(ask.job)
    assert schedule is not None  # the CLI takes this path for a scheduled job only
    timings = job.timings
    if ask.options.min_hold is not None:
        timings = replace(timings, min_hold=ask.options.min_hold)
    workers = tuple(job.workers)
    catchup = job.catchup in (LATEST, ALL)
    keys = JobKeys(job.name, job.lock_key, job.key)
    history = job.history_limit
    core = CoreJob(keys, schedule, timings, workers, history, catchup, job.blackouts)
    return replace(core, catchup_all=job.catchup_reach if job.catchup == ALL else None)


class RunStore(TailedStore):
    """The core's store on Consul, keeping the last error a call raised (the run's exit status
    names it, as the old engine's error did); its records carry the run's output tails."""

    def __init__(self, consul: Consul, tails: TailsOf) -> None:
        super().__init__(consul, tails)
        self.error: ConsulError | None = None

    def read_tick(
        self, job: JobKeys, tick: datetime, *, stale: bool = False
    ) -> tuple[TickRecord | None, datetime | None]:
        return self._kept(functools.partial(super().read_tick, job, tick, stale=stale))

    def create_session(self, terms: SessionTerms) -> str:
        return self._kept(functools.partial(super().create_session, terms))

    def claim(
        self,
        job: JobKeys,
        record: TickRecord,
        session_id: str,
        holder: bytes,
        terms: ClaimTerms = PLAIN,
    ) -> Claim:
        return self._kept(functools.partial(super().claim, job, record, session_id, holder, terms))

    def _kept(self, call: Callable[[], _T]) -> _T:
        try:
            return call()
        except ConsulError as exc:
            self.error = exc
            raise


class RunBody(RunnerBody):
    """A runner's body (core_body.py) as `lockctl run` starts it: told LOCK_MODIFY_INDEX too,
    `acquired` (its PID, its containment) or `retry-started` said once its job started."""

    def __init__(
        self,
        prepare: Callable[[], Unfenced],
        lock_key: str,
        clock: ThreadTimerClock,
        say: Said,
        modify_index: int | None,
    ) -> None:
        super().__init__(prepare, lock_key, clock)
        self.say, self.modify_index = say, modify_index

    def start(self, run: Run, ended: Callable[[], None]) -> None:
        body = self.prepare()
        environment = run_env(self.lock_key, run)
        if self.modify_index is not None:  # the claim's one transaction: the lock's index too
            environment["LOCK_MODIFY_INDEX"] = str(self.modify_index)
        body.start(environment)
        self._body = body
        self.say.attempt_started(run, body)
        threading.Thread(target=self._reap, args=(body, ended), daemon=True).start()


class Said:
    """The core's notes as today's event lines (on the core's clock thread)."""

    def __init__(self, events: EventLog, clock: Clock, ask: Asked) -> None:
        self.events, self.clock = events, clock
        self.tick: datetime | None = ask.tick  # None: a plain lock's (runner/plain.py)
        self.timeout = ask.job.timings.timeout
        self.began = clock.monotonic()  # the run's start: `acquired` says how long it waited
        self.started: dict[datetime, float] = {}  # when each tick's body started (monotonic)
        self.pids: dict[datetime, int | None] = {}
        self.agent_clock: AgentClock | None = None  # its skew is said at the turn's first note
        self.sessions: dict[datetime, str] = {}
        self.missed: list[TickRecord] = []  # recorded by a housekeeping, said with it

    def event(self, name: str, tick: datetime | None, **fields: object) -> None:
        session = None if tick is None else self.sessions.get(tick)
        self.events.emit(
            name, tick=None if tick is None else tick_name(tick), session=session, **fields
        )

    def acquired(self, run: Run, body: Unfenced) -> None:
        self.body_started(run, body.pid, body.containment)
        if body.warning and first_telling(body.warning):
            self.events.emit(
                "containment",
                session=run.session,
                mode=body.containment,
                warning=f"no PID namespace ({body.warning}): a process of the job that leaves "
                "its process group and outlives a killed runner is not contained, and the "
                "worker's token and TLS key are not hidden from the job",
            )

    def attempt_started(self, run: Run, body: Unfenced) -> None:
        """A runner's body started: `acquired` for the first attempt, `retry-started` for a
        retry's."""
        if run.attempt == 1:
            self.acquired(run, body)
            return
        self.pids[run.tick] = body.pid  # a timeout names the attempt's job
        self.event("retry-started", run.tick, attempt=run.attempt, child_pid=body.pid)

    def body_started(self, run: Run, pid: int | None, containment: str) -> None:
        """`acquired`: the first attempt's body started under the lock (its PID, how it is
        contained, how long the run waited for it)."""
        now = self.clock.monotonic()
        self.started[run.tick], self.sessions[run.tick] = now, run.session
        self.pids[run.tick] = pid
        self.event(
            "acquired",
            run.tick,
            lock_index=run.lock_index,
            waited_ms=ms(now - self.began),
            child_pid=pid,
            containment=containment,
        )

    def skew(self, agent_clock: AgentClock) -> None:
        """This host's clock off the agent's (learnt from the turn's read): said with the tick,
        before the claim's events, as the old engine's read says it (it moves no decision)."""
        width = agent_clock.uncertainty
        spread = 0.0 if width is None else width.total_seconds()
        skew = skew_to_say(agent_clock.host_ahead(), spread, None)
        if skew is not None:
            self.events.emit(
                "clock-skew",
                tick=None if self.tick is None else tick_name(self.tick),
                skew_ms=ms(skew),
                warning="this host's clock and the Consul agent's differ; lockctl judges ticks "
                "by the agent's, keep them in sync (NTP)",
            )

    def __call__(self, note: Note) -> None:
        if self.agent_clock is not None and note.tick == self.tick:  # the turn's first word
            agent_clock, self.agent_clock = self.agent_clock, None
            self.skew(agent_clock)
        if note.kind == "renew-failed":  # the session pool's (no job)
            self.events.emit("renew-failed", session=note.session, error=note.detail)
            return
        if note.kind == "renewed":  # the session pool's: the round trip, as the old engine's
            self.events.emit("renewed", session=note.session, took_ms=_ms(note.seconds))
            return
        handler = self._handlers.get(note.kind)
        if handler is not None and note.job:
            handler(self, note)

    def _catch_up(self, note: Note) -> None:
        """The core claims a catch-up next: `catch-up`, its lag, whether over a missed record."""
        if note.tick is None:
            return
        lag = (self.clock.wall() - note.tick).total_seconds()
        missed = note.record is not None and note.record.outcome is Outcome.MISSED
        self.events.emit(
            "catch-up", tick=tick_name(note.tick), lag_ms=ms(lag), recorded_missed=missed
        )

    def _skipped(self, note: Note) -> None:
        """A claim of another tick than the run's own (a catch-up) refused: said, with why (the
        lock held by another replica's run, or the tick taken since the look). The run's own
        tick's skip is said from its verdict."""
        if note.tick is not None and note.tick != self.tick:
            self.events.emit("skipped", tick=tick_name(note.tick), reason=note.detail)

    def _aborted(self, note: Note) -> None:
        """`lockctl abort` named this run: who asked, when, why (the note's words)."""
        self.event("aborted", note.tick, asked=note.detail)

    def _abort_heard(self, note: Note) -> None:
        """An abort note that names no run here: said when it names a tick this process ran
        (another session's run of it); a past run's note, left in the key, goes unsaid."""
        if note.tick is not None and note.tick in self.sessions:
            self.event("abort-ignored", note.tick, reason=note.detail)

    def _fenced(self, note: Note) -> None:
        reason = note.detail or "no confirmation of the lock in time"
        self.event("fenced", note.tick, reason=reason, since_confirmed_ms=_ms(note.seconds))

    def _timed_out(self, note: Note) -> None:
        after = None if self.timeout is None else ms(self.timeout)
        pid = None if note.tick is None else self.pids.get(note.tick)
        self.event("timed-out", note.tick, after_ms=after, child_pid=pid)

    def _retrying(self, note: Note) -> None:
        attempts = () if note.record is None else note.record.attempts or ()
        after = attempts[-1] if attempts else None
        attempt, delay = len(attempts) + 1, _ms(note.seconds)
        self.event("retrying", note.tick, attempt=attempt, after_status=after, delay_ms=delay)

    def _completed(self, note: Note) -> None:
        record, tick = note.record, note.tick
        if record is None or tick is None:
            return
        lost = record.outcome is Outcome.LOST
        if record.retries_cut is not None:
            attempts = len(record.attempts or ())
            self.event("retries-cut", tick, attempt=attempts, reason=record.retries_cut)
        began = self.started.get(tick)
        held = None if began is None else ms(self.clock.monotonic() - began)
        self.event(
            "lost" if lost else "released",
            tick,
            lock_index=record.lock_index,
            held_ms=held,
            child_status=record.exit_status,
            released=not lost,
        )

    def _missed(self, note: Note) -> None:
        if note.record is not None and note.tick != self.tick:
            self.missed.append(note.record)

    def _housekeeping(self, note: Note) -> None:
        written, self.missed = self.missed, []
        held = [r.tick for r in written if r.outcome is Outcome.PAUSED]
        windowed = [r.tick for r in written if r.outcome is Outcome.BLACKOUT]
        missed = sorted(r.tick for r in written if r.outcome is Outcome.MISSED)
        self.events.emit(
            "housekeeping",
            missed_recorded=len(missed),
            missed_ticks=[tick_name(t) for t in missed][:8] or None,
            paused_recorded=len(held) or None,
            blackout_recorded=len(windowed) or None,
            pruned=note.count or 0,
        )

    _handlers: ClassVar[dict[str, Callable[[Said, Note], None]]] = {
        "catch-up": _catch_up,
        "skipped": _skipped,
        "aborted": _aborted,
        "abort": _abort_heard,
        "fenced": _fenced,
        "timed-out": _timed_out,
        "retrying": _retrying,
        "completed": _completed,
        "missed": _missed,
        "housekeeping": _housekeeping,
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else ms(seconds)


def prepare_body(consul: Consul, ask: Asked) -> Callable[[], Unfenced]:
    """What makes each attempt's job: the job's call, or its command (checked now, before any
    lock is taken: a command that cannot start is refused here, exit 2, as today)."""
    environment = job_environment(os.environ)
    http = ask.job.http
    if http is None:
        check_program(ask.command, environment)
    hidden = credential_files(consul.settings)
    sent = consul.transport.tokens.current or consul.settings.token
    token = None if sent is None else sent.reveal()
    secrets = runner_secrets(token, os.environ, consul.settings.client_key)
    if http is not None:
        return lambda: HttpJob(http, secrets)
    checked = [True]  # the first attempt's command was checked just now

    def prepare() -> Unfenced:
        fresh, checked[0] = checked[0], False  # a retry's attempt checks it again
        return Child(ask.command, environment, None, hidden, secrets, checked=fresh)

    return prepare


@dataclass
class _Core:
    """The one job's core, its clock and thread, its store, and what says its notes."""

    core: TickCore
    one: OneTick
    clock: ThreadTimerClock
    store: RunStore
    said: Said
    thread: threading.Thread
    aborts: AbortWatch


def _core(consul: Consul, agent_clock: AgentClock, ask: TickAsk, events: EventLog) -> _Core:
    clock = ThreadTimerClock(agent_clock)
    said = Said(events, clock, ask)
    said.agent_clock = agent_clock
    bodies: dict[datetime, RunBody] = {}

    def tails(name: str, tick: datetime) -> Tails | None:
        body = bodies.get(tick)
        return None if body is None else body.tails

    prepare = prepare_body(consul, ask)

    def body(name: str, tick: datetime) -> Body:
        held = next((run for run in core.runs if run.tick == tick), None)
        index = None if held is None else held.claimed.record.modify_index
        made = bodies[tick] = RunBody(prepare, ask.job.lock_key, clock, said, index)
        aborts.start()  # a claim won: from now on a note may name this run
        return made

    def abort(note: AbortNote) -> None:  # from the watch's thread: to the core's
        clock.call_at(clock.monotonic(), functools.partial(core.abort, ask.job.name, note))

    aborts = AbortWatch(consul, ask.job.name, abort)

    store = RunStore(consul.with_retry(CORE_RETRY), tails)
    identity = Identity(ask.worker, socket.gethostname(), os.getpid(), ask.node)
    job = core_job(ask)
    one = OneTick(job.unit, said)  # a keyed run's: the job's key of it
    core = TickCore(aside_store(store, clock), clock, identity, [job], body, one.hear)
    one.attach(core)
    thread = threading.Thread(target=clock.run, name="lockctl-core", daemon=True)
    return _Core(core, one, clock, store, said, thread, aborts)


def run_tick_on_core(
    consul: Consul, agent_clock: AgentClock, ask: TickAsk, events: EventLog, stop: StopRequest
) -> RunResult:
    """`lockctl run` of `ask.tick` on the tick core: its result (the exit status, the events
    said meanwhile), as the old engine's were for the same tick."""
    made = _core(consul, agent_clock, ask, events)
    made.core.stop_asked = lambda: stop.requested
    made.thread.start()
    try:
        found, waited_out = _take(made, ask, events, stop)
    finally:
        made.aborts.stop()  # the turn is over: a note heard now names no run of it
        shut_clock(made.clock, made.one.quiet, made.one.stop, made.thread)
    if waited_out:
        events.emit("gave-up", waited_ms=ms(ask.options.timeout or 0.0))
        return RunResult(Outcome.GAVE_UP, EXIT_WAIT_TIMEOUT, tick=ask.tick)
    return _result(found, made, ask, events, stop)


def _take(made: _Core, ask: TickAsk, events: EventLog, stop: StopRequest) -> tuple[Verdict, bool]:
    """The turn at the tick, and again while --wait waits for the lock: the verdict, and
    whether the wait ran out (the window closed, or --timeout passed)."""
    clock, one = made.clock, made.one
    catchup = ask.job.catchup in (LATEST, ALL)
    give_up = None
    if ask.options.wait:
        give_up = wait_deadline(one.plan(ask.tick), clock.wall(), clock.monotonic())
        if ask.options.timeout is not None:
            give_up = min(give_up, clock.monotonic() + ask.options.timeout)
    announced = False
    while True:
        if stop.requested:  # before each turn: a stop while --wait waited claims nothing
            return Verdict(Outcome.UNSETTLED, ask.tick), False
        one.notes.clear()
        on_clock(clock, one.quiet, functools.partial(one.take, ask.tick, catchup=catchup))
        until_quiet(clock, one.quiet, one.stop, stop)
        found = one.verdict(ask.tick)
        if give_up is None or not found.lock_refused:
            return found, False
        if stop.requested:  # stopped while waiting for the lock: interrupted, as today
            return Verdict(Outcome.UNSETTLED, ask.tick), False
        if clock.monotonic() >= give_up:
            return found, True
        if not announced:
            events.emit("waiting", tick=tick_name(ask.tick))
            announced = True
        _watch(made, ask, give_up - clock.monotonic())


def _watch(made: _Core, ask: TickAsk, remaining: float) -> None:
    """Block on the lock's key until it changes, at most WATCH_POLL (a stop is seen within
    it); a free key that refused the claim is in lock-delay: look again within an eighth of
    it."""
    keys = JobKeys(ask.job.name, ask.job.lock_key, ask.job.key)
    try:
        holder, index = made.store.watch_lock(keys, 0, 0.0)
        wait = min(WATCH_POLL, max(remaining, 0.001))
        if holder is None:
            wait = min(wait, max(MIN_DELAY_RETRY, ask.job.timings.lock_delay / 8))
        made.store.watch_lock(keys, index, wait)
    except ConsulError:
        made.clock.sleep_until(made.clock.monotonic() + min(WATCH_POLL, max(remaining, 0.0)))


def on_clock(clock: ThreadTimerClock, quiet: threading.Event, call: Callable[[], None]) -> None:
    """`call` on the clock's thread now, `quiet` cleared first so a wait sees its end."""
    quiet.clear()
    clock.call_at(clock.monotonic(), call)


def until_quiet(
    clock: ThreadTimerClock, quiet: threading.Event, halt: Callable[[], None], stop: StopRequest
) -> None:
    """Wait for `quiet`; a stop asked meanwhile halts the work on the clock (once)."""
    stopping = False
    while not quiet.wait(STOP_POLL):
        if stop.requested and not stopping:
            stopping = True
            clock.call_at(clock.monotonic(), halt)


def shut_clock(
    clock: ThreadTimerClock,
    quiet: threading.Event,
    halt: Callable[[], None],
    thread: threading.Thread,
) -> None:
    """The work halted on the clock if it still goes on (an error above) and given
    SETTLE_WITHIN to end (its sessions destroyed), the clock closed, its thread joined."""
    on_clock(clock, quiet, halt)
    quiet.wait(SETTLE_WITHIN)
    clock.close()
    thread.join(SETTLE_WITHIN)


_RAN = {
    Outcome.SUCCEEDED: Outcome.RAN,
    Outcome.FAILED: Outcome.RAN,
    Outcome.TIMED_OUT: Outcome.TIMED_OUT,
    Outcome.LOST: Outcome.LOST,
    Outcome.INTERRUPTED: Outcome.INTERRUPTED,
    Outcome.ABORTED: Outcome.ABORTED,
}


def _result(
    found: Verdict, made: _Core, ask: TickAsk, events: EventLog, stop: StopRequest
) -> RunResult:
    """The verdict as today's result: its exit status, and the event the core's notes did not
    say already (a skip, a miss, a stop before the job started)."""
    tick = ask.tick
    if found.came is Outcome.CLAIMED and found.record is not None:
        return ran_result(found.record, stop.signum)
    if found.came is Outcome.PAUSED and found.record is not None:
        refusal = paused_refusal(found.record)
        events.emit("skipped", **refusal.event_fields())
        return RunResult(Outcome.SKIPPED, 0, tick=tick, skip=SkipReason.PAUSED)
    if found.came is Outcome.BLACKOUT:  # a window of the spec held the tick: not run
        words = f"in blackout window {found.detail or 'unknown'}: not run"
        events.emit("skipped", tick=tick_name(tick), reason=words)
        return RunResult(Outcome.SKIPPED, 0, tick=tick, skip=SkipReason.BLACKOUT)
    if found.came is Outcome.SKIPPED:
        fields = skip_fields(made.store, ask.job, tick, found.skip)
        events.emit("skipped", tick=tick_name(tick), **fields)
        return RunResult(Outcome.SKIPPED, 0, tick=tick, skip=found.skip)
    if found.came is Outcome.MISSED:
        events.emit("missed", tick=tick_name(tick), **_missed_fields(made, ask))
        return RunResult(Outcome.MISSED, 0, tick=tick)
    if found.came is Outcome.ERROR:
        raise _failure(found, made.store.error)
    signum = stop.signum or signal.SIGTERM
    events.emit("interrupted", signal=signal.Signals(signum).name)
    return RunResult(Outcome.INTERRUPTED, 128 + signum, tick=tick)


def ran_result(record: TickRecord, signum: int | None = None) -> RunResult:
    """The result of a tick run here, from its record as completed (pure): the job's own exit
    status, 76 lost (fenced), 124 past its timeout, 143 aborted (`lockctl abort`: an operator's
    stop, as a SIGTERM to the runner), 128 + the stop's signal when stopped before the job
    started (`signum`: the stop's)."""
    outcome = _RAN.get(record.outcome, Outcome.LOST)
    status = record.exit_status
    if outcome is Outcome.LOST:
        code = EXIT_LOCK_LOST
    elif outcome is Outcome.TIMED_OUT:
        code = EXIT_JOB_TIMEOUT
    elif outcome is Outcome.ABORTED:
        code = EXIT_ABORTED
    elif outcome is Outcome.INTERRUPTED and status is None:  # stopped before its job started
        code = 128 + (signum or signal.SIGTERM)
    else:
        code = status if status is not None else 1
    attempts = len(record.attempts) if record.attempts else 1
    return RunResult(
        outcome,
        code,
        record.lock_index,
        tick=record.tick,
        duration=record.duration,
        start_lag=record.start_lag,
        attempts=attempts,
        retries_cut=record.retries_cut,
    )


def skip_fields(
    store: ConsulTickStore, job: JobConfig, tick: datetime, skip: SkipReason | None
) -> dict[str, object]:
    """Why the claim of `tick` was refused (`skip`), as the old engine says it: the tick's
    record (taken since the turn's read), or the lock's holder (held, in lock-delay)."""
    if skip is SkipReason.TAKEN:
        try:
            record, _ = store.read_tick(JobKeys(job.name, job.lock_key, job.key), tick)
        except ConsulError:
            record = None
        if record is not None:
            return taken_fields(record)
        return {"reason": f"tick {tick_name(tick)} already taken"}
    said = "lock delay" if skip is SkipReason.LOCK_DELAY else None
    return lock_refusal(store.consul, job.lock_key, tick, said).fields


def _missed_fields(made: _Core, ask: TickAsk) -> dict[str, object]:
    """Too late for its window: recorded missed at once when it is missed for every clock
    within MISSED_GRACE of ours (core.py record_missed: only where no record exists)."""
    job, tick = core_job(ask), ask.tick
    plan = made.core.plan(job, tick)
    now = made.clock.wall()
    lag = (now - tick).total_seconds()
    recorded = False
    recent = job.schedule.next_ticks(tick, 2)[1] > now  # its record would still be kept
    if lag > plan.window + MISSED_GRACE and recent:
        try:
            recorded = bool(record_missed(made.store, job, [tick], ask.worker, now))
        except ConsulError:
            recorded = False
    return missed_fields(tick, lag, plan.window, recorded)


def _failure(found: Verdict, error: ConsulError | None) -> ConsulError:
    """The error the old engine would have raised (its exit status: 3 unavailable, 4 refused)."""
    if error is not None:
        return error
    if found.failure == "refused":
        return PermissionDenied(found.detail, status=403, body="")
    return ConsulUnavailable(found.detail or "Consul did not answer")
