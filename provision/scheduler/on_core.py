"""`lockctl schedule` on the tick core (provision/tick/): the process around the core's tick
decisions.

    the clock thread   one ThreadTimerClock on the Consul agent's clock (the clients' AgentClock,
                       learnt before the first turn): every call into a core, the store's calls,
                       the bodies' news and the report's notes (scheduler/report.py)
    a replica          one per connection (address, token file, TLS, login): its client, its
                       ConsulTickStore, its TickCore (with its session pool); one ForkServer for
                       every run of the process
    the main thread    SIGTERM, SIGINT: every core stopped, its runs completed, its sessions
                       destroyed, an agentless node deregistered, exit 0. SIGHUP: the config
                       checked whole first (refused: the old one kept), then `core.update(jobs)`;
                       a changed connection retires the old replica's jobs (runs under way end
                       as they would, under their session), stops it once they have, and starts
                       a new replica. Clock steps are said.
    the trigger watch  one blocking query (scheduler/triggers.py); each trigger is handed to the
                       core on the clock thread

What the core does not do (yet) is done here around it, each at a seam: a body that cannot start
fails the turn before its claim (`tick-failed`, the tick never claimed, as today), a token Consul
refuses is `tick-failed` (never `consul-unavailable`), a run's output tails go into its record, a
trigger's run has its own Idempotency-Key, a `completed` note carries its record, a core that
takes over from an older connection's does not take again a tick that one had its turn at, the
store's calls retry briefly (they block the one thread every fence runs on), and an error nobody
foresaw in a core callback is said instead of ending the clock thread.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, TextIO

from provision.consul import (
    NO_RETRY,
    AgentClock,
    Consul,
    ConsulError,
    ConsulSettings,
    RetryPolicy,
)
from provision.consul.clock import WallSteps
from provision.consul.login import Login
from provision.errors import InputError, LockctlError
from provision.ledger.aborts import AbortNote
from provision.ledger.backfill import BackfillNote
from provision.ledger.catchup import ALL, LATEST
from provision.ledger.control import ControlNote
from provision.ledger.records import TickRecord
from provision.ledger.ticks import skew_to_say
from provision.notify.notifier import JobNotify, Notifier, load_job
from provision.notify.sender import Lanes
from provision.runner.child import Child, check_program
from provision.runner.containment import first_telling
from provision.runner.core_body import RunnerBody, Unfenced, idempotency_key, run_env
from provision.runner.environment import credential_files, job_environment
from provision.runner.events import ms
from provision.runner.forkserver import ForkServer
from provision.runner.http_job import HttpJob
from provision.runner.output import runner_secrets
from provision.runner.stop import StopRequest
from provision.schedule import parse_schedule
from provision.scheduler.listen import Health, ListenAddress, Listener
from provision.scheduler.reload import plan_reload
from provision.scheduler.report import CoreReport, unexpected
from provision.scheduler.service import (
    CLOCK_PROBE_TIMEOUT,
    IN_FLIGHT,
    JOIN_POLL,
    POOL_SIZE,
    checked_connection,
    connection_key,
    scheduled_jobs,
)
from provision.scheduler.triggers import TriggerWatch
from provision.sessions import agentless_node, deregister_node
from provision.system.notify_rules import PING
from provision.tick.aside import aside_store
from provision.tick.clock import ThreadTimerClock, Timer
from provision.tick.consul_store import (
    ConsulTickStore,
    TailedStore,
    Tails,
    TailsOf,
    note_with_tails,
)
from provision.tick.core import CoreJob, Identity, TickCore, TickPlan
from provision.tick.edge import Body, Note, Run, TimerClock
from provision.tick.held import HeldRun
from provision.tick.store import JobKeys, Refused, TurnRead
from provision.workers.config import JobConfig, WorkerConfig, load_worker_config
from provision.workers.login import open_login

# The core's store calls wait aside (tick/aside.py): a retry holds back no fence, but a call
# retried for the client's whole deadline (10 s) keeps a claim's job busy that long. They retry
# briefly (a blip, not a leader election); a tick not claimed meanwhile fails closed and is
# looked at again (missed, caught up).
CORE_RETRY = RetryPolicy(deadline=1.0, first_backoff=0.05, max_backoff=0.25)
SETTLE_POLL = 0.1  # seconds between two looks at a stopping or retiring core's runs


class Started(Protocol):
    """What a body that started says of itself, for its `acquired` event."""

    @property
    def pid(self) -> int | None: ...

    @property
    def containment(self) -> str: ...

    @property
    def warning(self) -> str | None: ...


@dataclass(frozen=True)
class BodySaid:
    """Where a run's body tells its replica that it started (or could not), and why not."""

    started: Callable[[Started | None], None]
    failed: Callable[[str], None]


def core_job(job: JobConfig) -> CoreJob:
    """`job` as the tick core runs it (pure): its keys, its schedule in its timezone, its
    timings, its workers in the claim order job_turn hands ledger/turns.py, how many records
    its ledger keeps, and whether it catches up (catchup = "latest", or "all" with its
    catchup_window and catchup_limit)."""
    if job.schedule is None:
        raise ValueError(f"job {job.name}: no schedule (the core runs scheduled jobs only)")
    return CoreJob(
        JobKeys(job.name, job.lock_key, job.key),
        parse_schedule(job.schedule, job.timezone),
        job.timings,
        tuple(job.workers),
        job.history_limit,
        catchup=job.catchup in (LATEST, ALL),
        blackouts=job.blackouts,
        catchup_all=job.catchup_reach if job.catchup == ALL else None,
        overlap=job.overlap,
    )


class GuardedClock(ThreadTimerClock):
    """The core's clock, whose thread no callback ends: an error nobody foresaw (a bug) is
    handed to `failed` and the next callback runs (ThreadTimerClock.run would end with it,
    and every job with it)."""

    def __init__(self, agent_clock: AgentClock, failed: Callable[[Exception], None]) -> None:
        super().__init__(agent_clock)
        self.failed = failed

    def call_at(self, deadline: float, callback: Callable[[], object]) -> Timer:
        return super().call_at(deadline, functools.partial(self._guarded, callback))

    def prompt_at(self, deadline: float, callback: Callable[[], object]) -> Timer:
        return super().prompt_at(deadline, functools.partial(self._guarded, callback))

    def _guarded(self, callback: Callable[[], object]) -> None:
        try:
            callback()
        except Exception as exc:  # a bug: said, and the clock goes on
            self.failed(exc)


class ServiceBody(RunnerBody):
    """A runner's body (core_body.py) with what the scheduler adds: a trigger's run has an
    Idempotency-Key of its own, a body that cannot start after all is said (`failed`) and ends
    at once without an exit status, and the ends of its output are kept for the record."""

    def __init__(
        self,
        prepare: Callable[[], Unfenced],
        lock_key: str,
        clock: TimerClock,
        trigger: str | None,
        said: BodySaid,
    ) -> None:
        super().__init__(prepare, lock_key, clock)
        self.trigger, self.said = trigger, said

    def start(self, run: Run, ended: Callable[[], None]) -> None:
        environment = run_env(self.lock_key, run)
        if self.trigger is not None:
            key = idempotency_key(run.job, run.tick, self.trigger, 0, run.key)
            environment["LOCKCTL_IDEMPOTENCY_KEY"] = key
        body: Unfenced | None = None
        try:
            body = self.prepare()
            body.start(environment)
        except (LockctlError, OSError) as exc:  # gone since the turn's check, or cannot fork
            if body is not None:
                body.abort()
                body.close()
            self.said.started(None)
            self.said.failed(str(exc))
            self.clock.call_at(self.clock.monotonic(), functools.partial(self._said, None, ended))
            return
        self._body = body
        self.said.started(body)
        threading.Thread(target=self._reap, args=(body, ended), daemon=True).start()


class ContinuedCore(TickCore):
    """A TickCore that may take over from an older connection's core (a reload that changed
    the connection): a tick whose turn that core took is not taken again here (as a replaced
    loop of the old engine went on from its predecessor's last tick); an outage's ticks are
    then caught up after the next run, as on one core. `taken`: each job's last turn there."""

    taken: Mapping[str, datetime] = {}

    def _first_plan(self, state: Any) -> TickPlan:
        plan = super()._first_plan(state)
        last = self.taken.get(plan.job.unit)
        if last is not None and plan.tick <= last:
            return self.plan(plan.job, plan.job.schedule.next_ticks(last, 1)[0])
        return plan


class BodyCannotStart(Refused):
    """A turn's read refused by the store because the job's command cannot start: a refusal
    (the core says `refused`, the report `tick-failed`), so that the turn fails closed, never
    claimed, its fate looked at later."""


class ServiceStore(TailedStore):
    """The core's store on Consul, with the seams the service needs: the turn's read checks the
    job's command can start (`precheck`) before any claim; a completion carries the run's output
    tails; a destroyed session is said (`session-destroyed`)."""

    def __init__(
        self,
        consul: Consul,
        said: Callable[..., object],
        precheck: Callable[[str], None],
        tails: TailsOf,
    ) -> None:
        super().__init__(consul, tails)
        self.said, self.precheck = said, precheck

    def destroy_session(self, session_id: str) -> None:
        super().destroy_session(session_id)
        self.said("session-destroyed", session=session_id)

    def read_tick(
        self, job: JobKeys, tick: datetime, *, stale: bool = False
    ) -> tuple[TickRecord | None, datetime | None]:
        if stale:  # the turn's read (core.py _take), the last step before its claim
            try:
                self.precheck(job.unit)
            except LockctlError as exc:
                raise BodyCannotStart(str(exc)) from None
        return super().read_tick(job, tick, stale=stale)

    def read_turns(self, turns: Sequence[tuple[JobKeys, datetime]]) -> list[TurnRead]:
        """The turns' reads (core.py _read_turns), each job's command checked first: one that
        cannot start is refused in its place, the others read together."""
        refused: dict[int, TurnRead] = {}
        for n, (job, _) in enumerate(turns):
            try:
                self.precheck(job.unit)
            except LockctlError as exc:
                refused[n] = BodyCannotStart(str(exc))
        fine = [turn for n, turn in enumerate(turns) if n not in refused]
        read = iter(super().read_turns(fine))
        return [refused[n] if n in refused else next(read) for n in range(len(turns))]


@dataclass(frozen=True)
class Shared:
    """What every replica of the process shares: the clock (its thread runs every core), who
    it is, the report its notes go to, and the namespace helper of every run."""

    clock: GuardedClock
    identity: Identity
    report: CoreReport
    forks: ForkServer
    notifier: Callable[[Note], None] = lambda note: None  # notify/notifier.py


class Replica:
    """One connection's core: its client, its store, its TickCore, and the configs of the jobs
    it was given (a removed job's too: a retry of its run going on needs its body)."""

    def __init__(
        self,
        consul: Consul,
        jobs: Sequence[JobConfig],
        shared: Shared,
        taken: Mapping[str, datetime] | None = None,
    ) -> None:
        """`taken`: each job's last turn on the core this one takes over from."""
        self.consul, self.shared = consul, shared
        self.turns: dict[str, datetime] = {}  # each job's last turn here (a successor's taken)
        self._claims: dict[tuple[str, datetime | None], Note] = {}  # claims said at the start
        self.configs = {job.unit: job for job in jobs}
        self.environment = job_environment(os.environ)
        self.hidden = credential_files(consul.settings)
        report = shared.report
        core_consul = consul.with_retry(CORE_RETRY)
        self.store = ServiceStore(core_consul, report.events.emit, self._check_body, self._tails)
        cores = [core_job(job) for job in jobs]
        self.core = ContinuedCore(
            aside_store(self.store, shared.clock),
            shared.clock,
            shared.identity,
            cores,
            self._body,
            self._hear,
        )
        self.core.taken = dict(taken or {})

    @property
    def stopped(self) -> bool:
        """Stopped, its runs completed and its sessions destroyed."""
        return self.core.stopping and not self.core.runs and self.core.pool.closed

    def update(self, jobs: Sequence[JobConfig]) -> None:
        """A reload (on the clock thread): the core's update (core.py `update`)."""
        self.configs.update({job.unit: job for job in jobs})
        self.core.update([core_job(job) for job in jobs])

    # -- the bodies -----------------------------------------------------------------------
    def _held(self, name: str, tick: datetime | None) -> HeldRun | None:
        runs = self.core.runs
        return next((r for r in runs if r.claimed.keys.unit == name and r.tick == tick), None)

    def _body(self, name: str, tick: datetime) -> Body:
        job, held = self.configs[name], self._held(name, tick)
        trigger = None if held is None else held.record.trigger
        said = self._body_said(name, tick)
        return ServiceBody(self._prepare(job), job.lock_key, self.shared.clock, trigger, said)

    def _body_said(self, name: str, tick: datetime) -> BodySaid:
        return BodySaid(
            functools.partial(self._started, name, tick),
            functools.partial(self._failed, name, tick),
        )

    def _started(self, name: str, tick: datetime, body: Started | None) -> None:
        """The run's body started (None: it could not): its claim is said now, `acquired`
        naming its PID and containment (and, the first time this process is refused a PID
        namespace, why: the `containment` event)."""
        report = self.shared.report
        facts = {} if body is None else {"child_pid": body.pid, "containment": body.containment}
        report.body_started(name, facts)
        self._say_claim(name, tick)
        if body is not None and body.warning and first_telling(body.warning):
            report.containment(name, tick, body.containment, body.warning)

    def _say_claim(self, name: str, tick: datetime | None) -> None:
        claimed = self._claims.pop((name, tick), None)
        if claimed is not None:
            self.shared.report(claimed)

    def _prepare(self, job: JobConfig) -> Callable[[], Unfenced]:
        """What makes each attempt's body: the job's call, or its command in a namespace the
        process's ForkServer forks (checked again: gone since the turn, it says so)."""
        http, command = job.http, tuple(job.command or ())
        if http is not None:
            return lambda: HttpJob(http, self._secrets())
        forks, environment, hidden = self.shared.forks, self.environment, self.hidden
        return lambda: Child(command, environment, forks, hidden, self._secrets())

    def _secrets(self) -> list[str]:
        """What a record's output tails must not show, read at each run: the token sent now
        (a login's, or a rotated file's), the environment's, the TLS key's lines."""
        sent = self.consul.transport.tokens.current or self.consul.settings.token
        token = None if sent is None else sent.reveal()
        return runner_secrets(token, os.environ, self.consul.settings.client_key)

    def _check_body(self, name: str) -> None:
        """Before a turn's claim: the job's command can start (InputError if not)."""
        job = self.configs.get(name)
        if job is not None and job.http is None:
            check_program(job.command or (), self.environment)

    def _tails(self, name: str, tick: datetime) -> Tails | None:
        held = self._held(name, tick)
        body = None if held is None else held.body
        return body.tails if isinstance(body, ServiceBody) else None

    def _failed(self, name: str, tick: datetime, why: str) -> None:
        self.shared.report.tick_failed(name, why, tick)

    # -- the notes --------------------------------------------------------------------------
    def _hear(self, note: Note) -> None:
        """The core's note, to the report: a failure of lockctl's own (a refused token, a
        body that cannot start) as `tick-failed`, a completion with its record."""
        report = self.shared.report
        if note.kind == "claimed":  # said once its body started: its PID, its containment
            self._claims[(note.job, note.tick)] = note
            return
        self._say_claim(note.job, note.tick)  # its body never started (a loss, a stop first)
        if note.kind == "completed" and note.record is None:
            held = self._held(note.job, note.tick)  # done() comes after the note: still held
            if held is not None:
                note = replace(note, record=held.completed)
        if note.kind == "due" and note.tick is not None and note.job in self.configs:
            self.turns[note.job] = note.tick
            job = self.configs[note.job]
            following = parse_schedule(job.schedule or "", job.timezone).next_ticks(note.tick, 1)
            report.next_tick(note.job, following[0].timestamp())
        report(note)
        self.shared.notifier(note_with_tails(note, self._tails))


class CoreScheduler:
    """Every scheduled job of one worker's config on the tick core, until a stop (`run`)."""

    def __init__(
        self,
        config: WorkerConfig,
        stop: StopRequest,
        stream: TextIO,
        *,
        allow_unsafe: bool = False,
        loader: Callable[[Path], WorkerConfig] | None = None,
        capacity: int | None = None,
    ) -> None:
        self.config, self.stop = config, stop
        self.capacity_flag = capacity  # --max-concurrent-runs: over every config's own
        self.loader = loader or (lambda path: load_worker_config(path, allow_unsafe=allow_unsafe))
        self.report = CoreReport(config.worker, stream)
        self.events = self.report.events  # the scheduler's own (job "lockctl-schedule")
        self.forks = ForkServer()  # one namespace helper for every run of this process
        # Consul's clock, every tick decision's: kept across reloads (the agent's does not
        # change with the config); the core's wall
        self.agent_clock = AgentClock()
        self.wall_steps = WallSteps()
        self._skew_said: float | None = None  # the skew last said (clock-skew)
        self.clock = GuardedClock(self.agent_clock, self._unexpected)
        # no local agent: the catalog node its TTL-only sessions live on (kept across reloads)
        self.node = agentless_node(config.worker, config.agentless, os.environ)
        identity = Identity(config.worker, socket.gethostname(), os.getpid(), self.node)
        # notifications: queues and threads apart from the ticks, one per notify block's name
        self.sender = Lanes(self.report.notified)
        self.notifier = Notifier(self.sender, self._read_tick)
        self.shared = Shared(self.clock, identity, self.report, self.forks, self.notifier)
        self.current: Replica | None = None  # read by the trigger watch's thread
        self._retiring: list[Replica] = []  # an older connection's, until its runs end
        self._connection: ConsulSettings | None = None
        self._logins: list[Login] = []  # logged out at the very end, after the sessions
        self._names: tuple[str, ...] = ()  # the current jobs, for the trigger watch's thread
        self._reload = False  # set by a signal handler: a plain flag, never a lock
        self._watch_stop = threading.Event()
        self._watch: TriggerWatch | None = None
        self._thread: threading.Thread | None = None

    def request_reload(self) -> None:
        """From a signal handler: only a flag, read by the main loop (a lock could deadlock)."""
        self._reload = True

    def run(self) -> int:
        settings = checked_connection(self.config)
        self.notifier.update(notify_jobs(self.config))  # a URL file refused: nothing started
        self.sender.start()
        self.forks.start()
        try:
            self._start(settings)
            while not self.stop.requested:
                self.stop.sleep(JOIN_POLL)
                self._watch_clocks()
                if self._reload:
                    self._reload = False
                    self._reload_config()
            self._end()
        finally:
            self.clock.close()
            self.sender.close()  # what the last runs said, a few seconds at most
            self.forks.close()  # after the last run: no job of ours is left to fork or keep
            for login in self._logins:  # the tokens go with the process
                login.close()
        self.events.emit("stopped", signal=self.stop.signum)
        return 0

    # -- start and end ------------------------------------------------------------------------
    def _start(self, settings: ConsulSettings) -> None:
        consul = self._connect(settings, self.config, reload=False)
        self._learn_clock(consul)  # before any turn is worked out
        jobs = scheduled_jobs(self.config)
        self.current = Replica(consul, jobs, self.shared)
        self.current.core.capacity = self._capacity()
        self._know(jobs)
        self.clock.call_at(self.clock.monotonic(), self.current.core.start)
        self._thread = threading.Thread(target=self.clock.run, name="lockctl-core", daemon=True)
        self._thread.start()
        # one blocking query for every job's trigger (scheduler/triggers.py), not one per job
        self._watch = TriggerWatch(
            lambda: None if self.current is None else self.current.consul,
            lambda: self._names,
            self._fire,
            self.events,
            self._watch_stop,
            paused=self.report.paused,
            abort=self._abort,
        )
        self._watch.backfill = self._fire_backfill
        self._watch.start()
        cap = self._capacity()  # said only when set: an uncapped start's event is as before
        capped = {} if cap is None else {"max_concurrent_runs": cap}
        self.events.emit("started", config=str(self.config.path), jobs=list(self._names), **capped)

    def _connect(self, settings: ConsulSettings, config: WorkerConfig, *, reload: bool) -> Consul:
        """A client for this connection, logged in first when the config logs in: at start it
        waits out Consul being unavailable; on a reload a refusal is raised (nothing changed)."""
        consul = Consul(
            settings,
            pool_size=POOL_SIZE,
            max_in_flight=IN_FLIGHT,
            batch_txns=True,
            agent_clock=self.agent_clock,  # kept across reloads: another agent's answers correct it
        )
        wait = None if reload else self.stop.sleep
        login = open_login(consul, config, self.events.emit, wait=wait)
        if login is not None:
            self._logins.append(login)
        self._connection = connection_key(settings)
        return consul

    def _learn_clock(self, consul: Consul) -> None:
        """One answer of the agent before the first turn, for its clock; unreachable, the
        turns start on this host's clock (each judged on Consul's Date before its claim)."""
        with contextlib.suppress(ConsulError):
            consul.status.leader(retry=NO_RETRY, timeout=CLOCK_PROBE_TIMEOUT)

    def _end(self) -> None:
        """Stop every core (no claim; runs told, completed, released), wait until each has
        destroyed its sessions, then let the agentless node go."""
        self._watch_stop.set()  # its thread ends with its query (a daemon: never waited for)
        if self._thread is None:
            return
        done = threading.Event()
        # a prompt timer: ahead of a burst's backlog (hundreds of turns, claims, body starts
        # due before it), which once the cores stop is only callbacks that return at once
        self.clock.prompt_at(self.clock.monotonic(), functools.partial(self._stop_cores, done))
        while not done.wait(JOIN_POLL) and self._thread.is_alive():
            pass
        self.clock.close()
        self._thread.join()
        self._deregister()

    def _stop_cores(self, done: threading.Event) -> None:
        for replica in self._replicas():
            if not replica.core.stopping:
                replica.core.stop()
        self._until_stopped(done)

    def _until_stopped(self, done: threading.Event) -> None:
        if all(replica.stopped for replica in self._replicas()):
            done.set()
        else:
            again = functools.partial(self._until_stopped, done)
            self.clock.prompt_at(self.clock.monotonic() + SETTLE_POLL, again)

    def _replicas(self) -> list[Replica]:
        return [*self._retiring, *([] if self.current is None else [self.current])]

    def _deregister(self) -> None:
        """An agentless worker's node leaves the catalog at a clean stop, after its sessions;
        best effort: a node left behind holds nothing."""
        if self.node is None or self.current is None:
            return
        error = deregister_node(self.current.consul, self.node)
        self.events.emit("node-deregistered", node=self.node.name, error=error)

    def _read_tick(self, keys: JobKeys, tick: datetime) -> TickRecord | None:
        """A recovery's look at a tick's record, on the current connection (record_reader)."""
        replica = self.current
        return None if replica is None else record_reader(replica.consul)(keys, tick)

    def _unexpected(self, exc: Exception) -> None:
        """A bug in a callback of the clock thread: said; the clock goes on."""
        self.events.emit("tick-failed", error=unexpected(exc))

    # -- triggers, clocks ---------------------------------------------------------------------
    def _fire(self, name: str, note: ControlNote) -> None:
        """From the trigger watch's thread: the trigger goes to the core, on the core's thread."""
        self.clock.call_at(self.clock.monotonic(), functools.partial(self._trigger, name, note))

    def _trigger(self, name: str, note: ControlNote) -> None:
        if self.current is not None:
            self.current.core.trigger(name, note)

    def _fire_backfill(self, name: str, note: BackfillNote) -> None:
        """From the watch's thread: an operator's backfill goes to the core, on its thread."""
        self.clock.call_at(self.clock.monotonic(), functools.partial(self._backfill, name, note))

    def _backfill(self, name: str, note: BackfillNote) -> None:
        if self.current is not None:
            self.current.core.backfill(name, note)

    def _abort(self, name: str, note: AbortNote) -> None:
        """From the trigger watch's thread: `lockctl abort` goes to every core of this process
        (a retiring connection's runs too), on the core's thread."""
        self.clock.call_at(self.clock.monotonic(), functools.partial(self._aborted, name, note))

    def _aborted(self, name: str, note: AbortNote) -> None:
        for replica in self._replicas():
            replica.core.abort(name, note)

    def _watch_clocks(self) -> None:
        """A step of this host's wall clock, or of the agent's, is said at once. Neither moves
        a decision: the core judges each turn on Consul's clock as it reads it."""
        host = self.wall_steps.step()
        if host is not None:
            self.events.emit(
                "clock-step",
                clock="host",
                step_ms=ms(host),
                detail="this host's wall clock stepped; ticks are judged by the Consul agent's",
            )
        for jump in self.agent_clock.take_steps():
            self.events.emit(
                "clock-step",
                clock="consul-agent",
                step_ms=ms(jump),
                detail="the Consul agent's clock stepped; ticks follow it",
            )
        self._say_skew()

    def _say_skew(self) -> None:
        """This host's clock off the agent's by SKEW_REPORTED or more: said once, and again
        when it moves (it moves no decision: the core's clock is the agent's)."""
        width = self.agent_clock.uncertainty
        spread = 0.0 if width is None else width.total_seconds()
        skew = skew_to_say(self.agent_clock.host_ahead(), spread, self._skew_said)
        if skew is None:
            return
        self._skew_said = skew
        self.events.emit(
            "clock-skew",
            skew_ms=ms(skew),
            warning="this host's clock and the Consul agent's differ; lockctl judges ticks "
            "by the agent's, keep them in sync (NTP)",
        )

    # -- reload -------------------------------------------------------------------------------
    def _reload_config(self) -> None:
        """Load and check the whole new config, its files included, before anything changes:
        one that could not work is refused and the cores go on untouched. Then the core takes
        the jobs (`update`), or, for a new connection, a new core does."""
        try:
            fresh = self.loader(self.config.path)
            if fresh.agentless != self.config.agentless:
                raise InputError(f"{self.config.path}: agentless changed: restart to change it")
            if fresh.worker != self.config.worker:
                raise InputError(
                    f"{self.config.path}: now for worker {fresh.worker}, not {self.config.worker}"
                )
            settings = checked_connection(fresh)
            notify = notify_jobs(fresh)
        except LockctlError as exc:
            self.events.emit("reload-refused", error=str(exc), kept=str(self.config.path))
            return
        assert self.current is not None
        moved = connection_key(settings) != self._connection or fresh.login != self.config.login
        running = {job.unit: job for job in scheduled_jobs(self.config)}
        jobs = scheduled_jobs(fresh)
        plan = plan_reload(running, {job.unit: job for job in jobs}, connection_changed=moved)
        consul = None
        if moved:  # new runs use it; runs under way finish on theirs
            try:
                consul = self._connect(settings, fresh, reload=True)
            except LockctlError as exc:  # a refused login: nothing changed yet
                self.events.emit("reload-refused", error=str(exc), kept=str(self.config.path))
                return
        elif fresh.login is None:  # (a login keeps its own token: consul/login.py)
            self.current.consul.use_token(settings.token)  # the token just read: the same file's
        self.config = fresh
        self.notifier.update(notify)
        self._on_clock(functools.partial(self._swap, consul, jobs))
        for name in plan.remove:
            self.report.forget(name)
        self._know(jobs)
        if moved and self._watch is not None:
            self._watch.seen.clear()  # a trigger the old core had not run yet: the new one's
        self.events.emit("reloaded", jobs=sorted(self._names), **plan.event_fields())

    def _swap(self, consul: Consul | None, jobs: Sequence[JobConfig]) -> None:
        """On the clock thread: the jobs to the current core, or to a new core on `consul`
        while the old one's jobs retire (each run going on ends as it would, under its
        session) and it stops once they have."""
        assert self.current is not None
        if consul is None:
            self.current.core.capacity = self._capacity()
            self.current.update(jobs)
            return
        old = self.current
        self.current = Replica(consul, jobs, self.shared, old.turns)
        self.current.core.capacity = self._capacity()
        old.update([])
        self._retiring.append(old)
        self.current.core.start()
        self._retire(old)

    def _capacity(self) -> int | None:
        """The most runs this replica has at once: the flag's, else the config's (None: no cap)."""
        if self.capacity_flag is not None:
            return self.capacity_flag
        return self.config.max_concurrent_runs

    def _retire(self, replica: Replica) -> None:
        """Stop an older connection's core once its last run is over (its sessions then go)."""
        if replica.core.runs and not replica.core.stopping:
            self.clock.call_later(SETTLE_POLL, functools.partial(self._retire, replica))
            return
        if not replica.core.stopping:
            replica.core.stop()
        if replica.stopped:
            self._retiring.remove(replica)
        else:  # a stop's runs still end
            self.clock.call_later(SETTLE_POLL, functools.partial(self._retire, replica))

    def _on_clock(self, call: Callable[[], object]) -> None:
        """Run `call` on the clock thread and wait for it (the cores are that thread's only)."""
        done = threading.Event()

        def then() -> None:
            try:
                call()
            finally:
                done.set()

        self.clock.call_at(self.clock.monotonic(), then)
        while not done.wait(JOIN_POLL) and self._thread is not None and self._thread.is_alive():
            pass

    def _know(self, jobs: Sequence[JobConfig]) -> None:
        """What the report cannot learn from the core's notes: each job's schedule, timeout,
        and next tick (until its first turn says it)."""
        now = self.agent_clock()
        for job in jobs:
            schedule = parse_schedule(job.schedule or "", job.timezone)
            self.report.schedule_known(
                job.unit, job.schedule or "", job.timezone, timeout=job.timings.timeout
            )
            self.report.next_tick(job.unit, schedule.next_ticks(now, 1)[0].timestamp())
            told = job.notifications
            names = [t.name for t in told.targets] + ([PING] if told.ping_url_file else [])
            self.report.notify_known(job.unit, names)
        self._names = tuple(dict.fromkeys(job.name for job in jobs))  # a keyed job's once


def notify_jobs(config: WorkerConfig) -> list[JobNotify]:
    """The notifications of the config's scheduled jobs, their URL files read and checked
    (InputError naming the config, the field and the file; never the URL)."""
    return ready_notifications(scheduled_jobs(config), str(config.path))


def record_reader(consul: Consul) -> Callable[[JobKeys, datetime], TickRecord | None]:
    """A recovery's look at a tick's record (the notifications' thread): a consistent read,
    after this replica's own write, past the service store's seams (notify/notifier.py: so
    one of two replicas' looks sees the other's write)."""
    store = ConsulTickStore(consul)
    return lambda keys, tick: store.read_tick(keys, tick)[0]


def ready_notifications(jobs: Sequence[JobConfig], where: str) -> list[JobNotify]:
    """Each job's notifications with their URLs read (`where`: the config, for errors)."""
    ready = []
    for job in jobs:
        if not job.notifications or job.schedule is None:
            continue
        try:
            schedule = parse_schedule(job.schedule, job.timezone)
            keys = JobKeys(job.name, job.lock_key, job.key)
            ready.append(load_job(keys, schedule, job.notifications))
        except InputError as exc:
            raise InputError(f"{where}: jobs.{job.name}: {exc}") from None
    return ready


def _health(report: CoreReport) -> Health:
    verdict = report.verdict()
    return Health(verdict.status, verdict.text)


@contextlib.contextmanager
def serving_report(address: ListenAddress | None, report: CoreReport) -> Iterator[None]:
    """/metrics (the report's registry) and /healthz (its verdict) at `address` meanwhile;
    bound before any job starts, so a port in use is exit 6 with nothing run."""
    if address is None:
        yield
        return
    listener = Listener(address, report.registry, functools.partial(_health, report))
    report.events.emit("listening", address=str(address), loopback=address.loopback)
    listener.start()
    try:
        yield
    finally:
        listener.stop()


def run_on_core(
    config: WorkerConfig,
    stop: StopRequest,
    forward_reload: Callable[[Callable[[], object]], None],
    address: ListenAddress | None,
    allow_unsafe: bool = False,
    capacity: int | None = None,
) -> int:
    """`lockctl schedule` on the tick core, its signals already turned into `stop` and a
    reload request (`forward_reload`: where SIGHUP goes once the scheduler exists);
    `capacity`: --max-concurrent-runs, over the config's."""
    scheduler = CoreScheduler(
        config, stop, sys.stderr, allow_unsafe=allow_unsafe, capacity=capacity
    )
    forward_reload(scheduler.request_reload)  # a SIGHUP since the config was read: now
    with serving_report(address, scheduler.report):
        return scheduler.run()
