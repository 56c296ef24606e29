"""`lockctl run` of a plain lock (a job without a schedule) on the tick core's pieces
(tick/plain.py PlainLock: the session pool, HeldRun under the fencing decision, the release):
the process around them. No tick, no ledger record.

    the clock thread   one ThreadTimerClock on the Consul agent's clock: the acquire, the
                       session's renewals, the lock's watch, the fencing bounds, the body's
                       end, the release (the store's calls wait aside, tick/aside.py)
    the main thread    asks for the lock, waits for the run to be over (a stop asked by a signal
                       stops it: the job interrupted, the lock released); with --wait, a refused
                       acquire is asked again once the lock's key changes (a blocking read:
                       the hand-over starts the moment the holder lets go), until --timeout
                       (75); then the session destroyed, the clock closed
    the events         as `lockctl run` of a scheduled job says them (runner/on_core.py Said),
                       without a tick: acquired, renewed, fenced, timed-out, retrying, released
                       / lost; skipped (who holds the lock, or lock-delay), waiting, timed-out,
                       interrupted

The job's command is checked, and its init started in its PID namespace, before the lock is
asked for: the hand-over then only says go.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime

from provision.consul import AgentClock, Consul, ConsulError, RetryPolicy
from provision.errors import EXIT_WAIT_TIMEOUT
from provision.ledger.holder import Holder, claimed_worker
from provision.outcomes import Outcome
from provision.runner.core_body import RunnerBody, Unfenced, idempotency_key
from provision.runner.events import EventLog, ms
from provision.runner.on_core import (
    SETTLE_WITHIN,
    Said,
    on_clock,
    prepare_body,
    ran_result,
    shut_clock,
    until_quiet,
)
from provision.runner.results import RunOptions, RunResult, SkipReason
from provision.runner.stop import StopRequest
from provision.sessions import AgentlessNode
from provision.tick.aside import aside_store
from provision.tick.clock import Clock, ThreadTimerClock
from provision.tick.consul_store import ConsulTickStore
from provision.tick.core import Identity
from provision.tick.edge import Body, Note, Run
from provision.tick.plain import PlainJob, PlainLock, await_turn
from provision.tick.store import JobKeys, lock_delayed
from provision.workers.config import JobConfig

# The store's calls retry briefly (as a scheduled run's: runner/on_core.py): the acquire is the
# hand-over's critical path, and a release not answered is sent again by HeldRun itself.
PLAIN_RETRY = RetryPolicy(deadline=2.0, first_backoff=0.05, max_backoff=0.25)


@dataclass(frozen=True)
class PlainAsk:
    """What `lockctl run` of a plain lock asks: the job, this worker (and its agentless
    node), the command and the flags."""

    job: JobConfig
    worker: str
    command: tuple[str, ...]
    options: RunOptions
    node: AgentlessNode | None = None
    tick: None = None  # a plain lock runs no tick (Said reads it)


def plain_job(ask: PlainAsk) -> PlainJob:
    """The job as its plain lock runs it; --min-hold overrides the config's min_hold."""
    timings = ask.job.timings
    if ask.options.min_hold is not None:
        timings = replace(timings, min_hold=ask.options.min_hold)
    return PlainJob(JobKeys(ask.job.name, ask.job.lock_key, ask.job.key), timings)


def plain_env(lock_key: str, run: Run, modify_index: int) -> dict[str, str]:
    """What the job is told of its lock: key, session, indexes, job, worker, which attempt
    this is (1 for the first), and the run's key, the same for every attempt of it (an HTTP
    job sends it as the Idempotency-Key). No tick: a plain lock runs none."""
    told = {
        "LOCK_KEY": lock_key,
        "LOCK_SESSION": run.session,
        "LOCK_INDEX": str(run.lock_index),
        "LOCK_MODIFY_INDEX": str(modify_index),
        "LOCKCTL_JOB": run.job,
        "LOCKCTL_WORKER": run.worker,
        "LOCKCTL_ATTEMPT": str(run.attempt),
        "LOCKCTL_IDEMPOTENCY_KEY": idempotency_key(run.job, None, None, modify_index),
    }
    return told if run.key is None else {**told, "LOCKCTL_KEY": run.key}


class PlainBody(RunnerBody):
    """A runner's body (core_body.py) under a plain lock: told its lock (plain_env), and
    `acquired` or `retry-started` said once its job started."""

    def __init__(
        self,
        prepare: Callable[[], Unfenced],
        lock_key: str,
        clock: ThreadTimerClock,
        said: Said,
        modify_index: int,
    ) -> None:
        super().__init__(prepare, lock_key, clock)
        self.said, self.modify_index = said, modify_index
        self.reaper: threading.Thread | None = None  # joined at the end: nothing left behind

    def start(self, run: Run, ended: Callable[[], None]) -> None:
        body = self.prepare()
        body.start(plain_env(self.lock_key, run, self.modify_index))
        self._body = body
        self.said.attempt_started(run, body)
        self.reaper = threading.Thread(target=self._reap, args=(body, ended), daemon=True)
        self.reaper.start()


class PlainSaid(Said):
    """The notes of a plain lock's run as its event lines: `session`, never a tick."""

    def __init__(self, events: EventLog, clock: Clock, ask: PlainAsk) -> None:
        super().__init__(events, clock, ask)
        self.claimed_at: dict[datetime, float] = {}

    def __call__(self, note: Note) -> None:
        if note.kind == "renewed" and not self.started:
            return  # while waiting for the lock the session's renewals go unsaid, as always
        if note.kind == "claimed" and note.tick is not None:
            self.claimed_at[note.tick] = self.clock.monotonic()
        super().__call__(note)

    def body_started(self, run: Run, pid: int | None, containment: str) -> None:
        super().body_started(run, pid, containment)
        # `held_ms` counts from the acquire, as min-hold does (HeldRun), not from the job's start
        self.started[run.tick] = self.claimed_at.get(run.tick, self.started[run.tick])

    def event(self, name: str, tick: datetime | None, **fields: object) -> None:
        session = None if tick is None else self.sessions.get(tick)
        self.events.emit(name, session=session, **fields)


@dataclass
class _Plain:
    """The plain lock, its clock and thread, its store, and its first job made ready."""

    lock: PlainLock
    clock: ThreadTimerClock
    store: ConsulTickStore
    thread: threading.Thread
    ready: list[Unfenced]
    bodies: list[PlainBody]


def _made(consul: Consul, agent_clock: AgentClock, ask: PlainAsk, events: EventLog) -> _Plain:
    prepare = prepare_body(consul, ask)  # checked now: a command that cannot start is exit 2
    ready = [] if ask.job.http is not None else [prepare()]  # its init starts meanwhile

    def next_job() -> Unfenced:
        return ready.pop() if ready else prepare()

    clock = ThreadTimerClock(agent_clock)
    said = PlainSaid(events, clock, ask)
    store = ConsulTickStore(consul.with_retry(PLAIN_RETRY))
    identity = Identity(ask.worker, socket.gethostname(), os.getpid(), ask.node)
    bodies: list[PlainBody] = []

    def body() -> Body:
        held = lock.held
        index = 0 if held is None else held.claimed.record.modify_index or 0
        made = PlainBody(next_job, ask.job.lock_key, clock, said, index)
        bodies.append(made)
        return made

    lock = PlainLock(aside_store(store, clock), clock, identity, plain_job(ask), body, said)
    thread = threading.Thread(target=clock.run, name="lockctl-plain", daemon=True)
    return _Plain(lock, clock, store, thread, ready, bodies)


def run_plain_on_core(
    consul: Consul, agent_clock: AgentClock, ask: PlainAsk, events: EventLog, stop: StopRequest
) -> RunResult:
    """`lockctl run` of a plain lock: its result (the exit status, the events said meanwhile).
    An agentless worker's session lives on its catalog node (`ask.node`)."""
    made = _made(consul, agent_clock, ask, events)
    made.lock.stop_asked = lambda: stop.requested
    made.thread.start()
    try:
        return _acquired(made, ask, events, stop)
    finally:
        _shut(made)


def _acquired(made: _Plain, ask: PlainAsk, events: EventLog, stop: StopRequest) -> RunResult:
    """Acquire once, or with --wait until the lock is ours (or --timeout, or a stop); then the
    run to its end."""
    lock, clock = made.lock, made.clock
    give_up = None
    if ask.options.wait and ask.options.timeout is not None:
        give_up = clock.monotonic() + ask.options.timeout
    announced = False
    while True:
        if stop.requested:  # before each acquire: a stop while --wait waited starts no job
            return _interrupted(stop, lock.session, events)
        on_clock(clock, lock.quiet, lock.acquire)
        until_quiet(clock, lock.quiet, lock.stop, stop)
        if lock.held is not None:
            return _ran(lock, stop)
        if lock.failure is not None:
            raise lock.failure  # Consul's refusal (exit 4), or that it did not answer (3)
        if stop.requested:
            return _interrupted(stop, lock.session, events)
        refusal = lock.refusal
        assert refusal is not None
        if not ask.options.wait:
            return _skipped(made, ask, events, lock_delayed(refusal))
        if give_up is not None and clock.monotonic() >= give_up:
            timeout = ask.options.timeout or 0.0
            events.emit("gave-up", session=lock.session, waited_ms=ms(timeout))
            return RunResult(Outcome.GAVE_UP, EXIT_WAIT_TIMEOUT)
        if not announced:
            events.emit("waiting", session=lock.session)
            announced = True
        remaining = None if give_up is None else give_up - clock.monotonic()
        await_turn(made.store, clock, lock.job, remaining, lock_delayed(refusal))


def _ran(lock: PlainLock, stop: StopRequest) -> RunResult:
    """The run's end as its result: the job's exit status, 76 lost, 124 past its timeout,
    128 + the signal when stopped before its job started."""
    record = lock.completed
    if record is None:  # its release never answered after a stop: the TTL frees the lock
        signum = stop.signum or signal.SIGTERM
        return RunResult(Outcome.INTERRUPTED, 128 + signum)
    return replace(ran_result(record, stop.signum), tick=None)


def _skipped(made: _Plain, ask: PlainAsk, events: EventLog, delayed: bool) -> RunResult:
    """Not acquired, and not waiting: who holds the lock, or that it is in lock-delay."""
    holder = Holder(None, None, None, in_lock_delay=True)
    if not delayed:
        holder = _holder(made.store.consul, ask.job.lock_key)
    skip = SkipReason.LOCK_DELAY if holder.in_lock_delay else SkipReason.TAKEN
    events.emit("skipped", session=made.lock.session, **holder.event_fields())
    return RunResult(Outcome.SKIPPED, 0, skip=skip)


def _holder(consul: Consul, key: str) -> Holder:
    """Who holds the key, as far as Consul vouches for it: the key's Session and that
    session's node are Consul's word (the node when this token may read it); the worker in
    the key's value is only what the holder wrote. Freed meanwhile: in lock-delay, or let go."""
    try:
        entry, _ = consul.kv.get(key)
    except ConsulError:
        return Holder(None, None, None)
    if entry is None or not entry.session:
        return Holder(None, None, None, in_lock_delay=True)
    try:
        session = consul.session.info(entry.session)
    except ConsulError:
        session = None
    node = None if session is None else session.node
    return Holder(entry.session, node, claimed_worker(entry.value))


def _interrupted(stop: StopRequest, session: str | None, events: EventLog) -> RunResult:
    """Stopped before the job started: said, and the exit a shell gives (128 + the signal)."""
    signum = stop.signum or signal.SIGTERM
    events.emit("interrupted", session=session, signal=signal.Signals(signum).name)
    return RunResult(Outcome.INTERRUPTED, 128 + signum)


def _shut(made: _Plain) -> None:
    """The run stopped if it still goes on (an error above), the session destroyed, the clock
    closed, the job made ready and never started let go."""
    shut_clock(made.clock, made.lock.quiet, made.lock.stop, made.thread)
    made.clock.join_workers(SETTLE_WITHIN)
    for body in made.bodies:
        if body.reaper is not None:
            body.reaper.join(SETTLE_WITHIN)
    for job in made.ready:
        job.abort()
        job.close()
