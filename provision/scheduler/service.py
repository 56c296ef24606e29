"""`lockctl schedule`: every scheduled job of one worker's config, in one long-lived process.

Each replica (a VM, a container, a pod) runs one: one timer for all its jobs (scheduler/timer.py)
fires each job's run of its next tick (scheduler/loop.py) at this replica's turn; every lock is
held under the replica's session for the job's (TTL, LockDelay), one per distinct pair
(scheduler/sessions.py). The process's owner (the CLI) turns signals into calls:

    SIGTERM, SIGINT  stop: no new claim; a running job gets the signal and its kill grace, its
                     record is completed, the lock released, every session destroyed; exit 0
    SIGHUP           reload the worker config, checked whole (its files too) before anything
                     changes: a bad one is refused and the old one kept; a good one changes only
                     the loops it changed, each as its own run ends (scheduler/reload.py)

One scheduler per worker config and host: the config file is locked (flock) while it runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

from provision.consul import (
    NO_RETRY,
    AgentClock,
    Consul,
    ConsulError,
    ConsulSettings,
    check_tls_files,
    resolve_settings,
)
from provision.consul.clock import WallSteps
from provision.consul.login import Login, read_bearer_token
from provision.errors import InputError, LocalEnvironmentError, LockctlError
from provision.ledger.control import ControlNote
from provision.runner.events import EventLog, ms
from provision.runner.forkserver import ForkServer
from provision.runner.stop import StopRequest
from provision.scheduler.counts import CountsSnapshot, LoopCounts
from provision.scheduler.loop import CountingEventLog, JobTicks, unexpected
from provision.scheduler.reload import ReloadPlan, plan_reload
from provision.scheduler.sessions import SessionPool
from provision.scheduler.timer import TickTimer
from provision.scheduler.triggers import TriggerWatch
from provision.sessions import agentless_node, deregister_node
from provision.workers.config import JobConfig, WorkerConfig, load_worker_config
from provision.workers.login import open_login

JOIN_POLL = 0.5
# Connections kept to the agent, and calls at once (watches of running jobs aside): hundreds of
# jobs ticking at :00 queue for a turn instead of opening a connection each.
POOL_SIZE, IN_FLIGHT = 64, 32
SCHEDULER = "lockctl-schedule"  # the `job` field of the scheduler's own events
CLOCK_PROBE_TIMEOUT = 2.0  # seconds for the first answer at start, for the agent's clock


def scheduled_jobs(config: WorkerConfig) -> list[JobConfig]:
    """The jobs this scheduler runs: those with a schedule and a command (or an http call)."""
    return [job for job in config.jobs if job.schedule is not None and (job.command or job.http)]


def checked_connection(config: WorkerConfig) -> ConsulSettings:
    """How `config` reaches Consul, with every file it names read and checked (the token file
    holds a token; the CA, the client certificate and its key are readable and load): what
    the start fails on, and what a reload must know works before it changes anything."""
    if not scheduled_jobs(config):
        raise InputError(
            f"{config.path}: no job with a schedule and a command for {config.worker}: "
            "nothing to schedule"
        )
    settings = resolve_settings(**config.connection())
    check_tls_files(settings)
    if config.login is not None:  # the JWT is there now (it is read again for each login)
        read_bearer_token(config.login.bearer_token_file)
    return settings


@contextlib.contextmanager
def single_instance(config_path: Path) -> Iterator[int]:
    """Hold an exclusive lock on the config file while the scheduler runs; a second
    `lockctl schedule` of the same config on this host is refused (exit 6)."""
    fd = os.open(config_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LocalEnvironmentError(
                f"{config_path}: another `lockctl schedule` runs with this config on this host"
            ) from None
        yield fd
    finally:
        os.close(fd)


def connection_key(settings: ConsulSettings) -> ConsulSettings:
    """What makes two connections the same for a reload: everything but the token's value (a
    token re-read from the same file goes to the same client: Consul.use_token)."""
    return dataclasses.replace(settings, token=None)


class Scheduler:
    def __init__(
        self,
        config: WorkerConfig,
        stop: StopRequest,
        stream: TextIO,
        *,
        allow_unsafe: bool = False,
        loader: Callable[[Path], WorkerConfig] | None = None,
    ) -> None:
        self.config, self.stop, self.stream = config, stop, stream
        self.events = EventLog(SCHEDULER, config.worker, stream)
        self.loader = loader or (lambda path: load_worker_config(path, allow_unsafe=allow_unsafe))
        self.loops: dict[str, JobTicks] = {}  # the current config's, by job name
        self.consul: Consul | None = None  # the current connection's client and sessions
        self.sessions: SessionPool | None = None
        self._connection: ConsulSettings | None = None
        # every pool still open, and how many loops (running or current) still use it: a pool of
        # an older connection is closed when its last loop retires
        self._pools: dict[SessionPool, int] = {}
        self._pools_lock = threading.Lock()  # the timer thread retires loops, the main reloads
        self._closing: list[threading.Thread] = []
        self.forks = ForkServer()  # one namespace helper for every run of this process
        self.timer: TickTimer | None = None
        self._timer_thread: threading.Thread | None = None
        self.counts: dict[str, LoopCounts] = {}  # by job name: a reload keeps the counters
        # Consul's clock, which every tick decision is judged by (consul/clock.py); kept across
        # reloads, as the agent's clock does not change with the config
        self.agent_clock = AgentClock()
        self.wall_steps = WallSteps()
        self._clock_known = False  # at the last look: turns worked out before used this host's
        self._reload = False  # set by a signal handler: a plain flag, never a lock
        # one per connection made, when the config logs in (workers/login.py); logged out at
        # the very end, after the sessions are destroyed
        self._logins: list[Login] = []
        self._watch_stop = threading.Event()
        self._watch: TriggerWatch | None = None
        # no local agent: the catalog node its TTL-only sessions live on (kept across reloads)
        self.node = agentless_node(config.worker, config.agentless, os.environ)

    def request_reload(self) -> None:
        """From a signal handler: only a flag, read by the main loop (a lock could deadlock)."""
        self._reload = True

    def run(self) -> int:
        settings = checked_connection(self.config)
        self.forks.start()
        try:
            self._start(self.config, settings)
            while not self.stop.requested:
                self.stop.sleep(JOIN_POLL)
                self._watch_clocks()
                if self._reload:
                    self._reload = False
                    self._reload_config()
            self._end_loops()
        finally:
            self.forks.close()  # after the last run: no job of ours is left to fork or keep
            for login in self._logins:  # the tokens go with the process
                login.close()
        self.events.emit("stopped", signal=self.stop.signum)
        return 0

    def _end_loops(self) -> None:
        """Wait for every job's current run to end, then destroy the replica's sessions."""
        self._watch_stop.set()  # its thread ends with its query (a daemon: never waited for)
        if self.timer is not None and self._timer_thread is not None:
            self.timer.retire()  # after a stop it has ended already, or ends with its runs
            self._timer_thread.join()
            self.timer = self._timer_thread = None
        with self._pools_lock:
            pools, self._pools = list(self._pools), {}
        for pool in pools:
            pool.close()
        for closing in self._closing:
            closing.join()
        self.sessions = None
        self._deregister()

    def _deregister(self) -> None:
        """An agentless worker's node leaves the catalog at a clean stop, after its sessions
        (none is left to end with it); best effort: a node left behind holds nothing."""
        if self.node is None or self.consul is None:
            return
        error = deregister_node(self.consul, self.node)
        self.events.emit("node-deregistered", node=self.node.name, error=error)

    def _start(self, config: WorkerConfig, settings: ConsulSettings) -> None:
        self._connect(settings, config)
        assert self.consul is not None
        self._learn_clock(self.consul)  # before any turn is worked out
        self.loops = {job.name: self._loop(job) for job in scheduled_jobs(config)}
        self.timer = TickTimer(
            list(self.loops.values()),
            self.stop,
            wall=self.agent_clock,
            on_error=self._job_failed,
            on_retired=self._loop_retired,
        )
        self._timer_thread = threading.Thread(target=self.timer.run, name="lockctl-timer")
        self._timer_thread.daemon = True
        self._timer_thread.start()
        # one blocking query for every job's trigger (scheduler/triggers.py), not one per job
        self._watch_stop = threading.Event()
        self._watch = TriggerWatch(
            lambda: self.consul,
            lambda: list(self.loops),
            self._trigger,
            self.events,
            self._watch_stop,
            paused=self._paused,
        )
        for loop in self.loops.values():
            loop.trigger_failed = self._watch.forget
        self._watch.start()
        self.events.emit("started", config=str(config.path), jobs=list(self.loops))

    def _trigger(self, name: str, note: ControlNote) -> None:
        """From the trigger watch: run job `name` once now (the timer says when)."""
        loop, timer = self.loops.get(name), self.timer
        if loop is not None and timer is not None:
            timer.trigger(loop, note)

    def _paused(self, paused: set[str]) -> None:
        """From the trigger watch: which jobs are paused now (lockctl_job_paused)."""
        for name, loop in list(self.loops.items()):
            loop.counts.pause_known(name in paused)

    def _connect(
        self, settings: ConsulSettings, config: WorkerConfig, *, reload: bool = False
    ) -> None:
        """A client and a session pool for this connection; the loops made from now on use it.
        A config that logs in logs in first: at start it waits out Consul being unavailable; on
        a reload a refusal (or Consul unavailable) is raised before anything changed."""
        consul = Consul(
            settings,
            pool_size=POOL_SIZE,
            max_in_flight=IN_FLIGHT,
            batch_txns=True,
            agent_clock=self.agent_clock,  # kept across reloads: another agent's answers correct it
        )
        # before the first call: every client sharing this one's token source sends its token
        wait = None if reload else self.stop.sleep
        login = open_login(consul, config, self.events.emit, wait=wait)
        if login is not None:
            self._logins.append(login)
        self.consul, self._connection = consul, connection_key(settings)
        self.sessions = SessionPool(consul, config.worker, self.events, node=self.node)
        with self._pools_lock:
            self._pools[self.sessions] = 0
        self.sessions.start()

    def _loop(self, job: JobConfig) -> JobTicks:
        """A loop for `job` on the current connection, counting into the job's counters."""
        assert self.consul is not None and self.sessions is not None
        counts = self.counts.setdefault(job.name, LoopCounts())
        events = CountingEventLog(job.name, self.config.worker, self.stream, counts)
        with self._pools_lock:
            self._pools[self.sessions] += 1
        loop = JobTicks(
            self.consul,
            job,
            self.config.worker,
            events,
            self.stop,
            wall=self.agent_clock,
            counts=counts,
            sessions=self.sessions,
            forks=self.forks,
        )
        if self._watch is not None:  # a loop a reload made: its failed triggers too
            loop.trigger_failed = self._watch.forget
        return loop

    def _learn_clock(self, consul: Consul) -> None:
        """Before any turn is worked out: one answer of the agent, for its clock (any answer
        carries it). Unreachable, the turns start on this host's clock and are worked out again
        when the first answer comes (_watch_clocks)."""
        if self.agent_clock.known:
            return
        with contextlib.suppress(ConsulError):
            consul.status.leader(retry=NO_RETRY, timeout=CLOCK_PROBE_TIMEOUT)
        self._clock_known = self.agent_clock.known

    def _watch_clocks(self) -> None:
        """A step of this host's wall clock, or of the agent's (seen in its answers), is said
        at once, and every job reads the agent's clock again before its next claim. Neither
        moves a decision (they follow the agent's clock on the monotonic one), but an operator
        wants to know, and a host step often means the agent's clock steps too."""
        host = self.wall_steps.step()
        agent = self.agent_clock.take_steps()
        if host is not None:
            self.events.emit(
                "clock-step",
                clock="host",
                step_ms=ms(host),
                detail="this host's wall clock stepped; ticks are judged by the Consul agent's",
            )
        for jump in agent:
            self.events.emit(
                "clock-step",
                clock="consul-agent",
                step_ms=ms(jump),
                detail="the Consul agent's clock stepped; ticks follow it",
            )
        if host is not None or agent:
            for loop in list(self.loops.values()):
                loop.recheck_clocks()
        learnt = self.agent_clock.known and not self._clock_known
        self._clock_known = self.agent_clock.known
        if (agent or learnt) and self.timer is not None:
            self.timer.replan()  # the turns were worked out on a clock that has moved

    def _loop_retired(self, loop: JobTicks) -> None:
        """From the timer: `loop` has no run left. The last loop of an older connection's pool
        takes the pool with it (its sessions destroyed: they hold no lock any more)."""
        loop.leave()
        with self._pools_lock:
            left = self._pools.get(loop.sessions, 0) - 1
            done = left <= 0 and loop.sessions is not self.sessions
            if done:
                self._pools.pop(loop.sessions, None)
            elif loop.sessions in self._pools:
                self._pools[loop.sessions] = left
        if done:  # HTTP calls: not on the timer's thread
            closing = threading.Thread(target=loop.sessions.close, name="lockctl-sessions-end")
            closing.daemon = True
            self._closing.append(closing)
            closing.start()

    def _job_failed(self, job: JobTicks, exc: BaseException) -> None:
        """An unexpected error in one job's run (a bug): said, counted; its next tick comes."""
        job.tick_failed(unexpected(exc))

    def snapshots(self) -> list[tuple[str, CountsSnapshot]]:
        """Each current job's counts, for the listener's thread (a reload may swap the loops:
        the dict is read once)."""
        return [(name, loop.counts.snapshot()) for name, loop in list(self.loops.items())]

    def _reload_config(self) -> None:
        """Load and check the whole new config, its files included, before anything changes:
        a config that could not work is refused and the running loops go on untouched. Then
        only the loops that changed are changed, each on its own (scheduler/reload.py)."""
        try:
            fresh = self.loader(self.config.path)
            if fresh.agentless != self.config.agentless:
                raise InputError(f"{self.config.path}: agentless changed: restart to change it")
            if fresh.worker != self.config.worker:
                raise InputError(
                    f"{self.config.path}: now for worker {fresh.worker}, not {self.config.worker}"
                )
            settings = checked_connection(fresh)
        except LockctlError as exc:
            self.events.emit("reload-refused", error=str(exc), kept=str(self.config.path))
            return
        assert self.timer is not None and self.consul is not None
        # another auth method or bearer-token file: a new client, which logs in with them
        moved = connection_key(settings) != self._connection or fresh.login != self.config.login
        running = {name: loop.job for name, loop in self.loops.items()}
        jobs = {job.name: job for job in scheduled_jobs(fresh)}
        plan = plan_reload(running, jobs, connection_changed=moved)
        if moved:  # new runs use it; runs under way finish on theirs
            try:
                self._connect(settings, fresh, reload=True)
            except LockctlError as exc:  # a refused login: nothing changed yet
                self.events.emit("reload-refused", error=str(exc), kept=str(self.config.path))
                return
        self.config = fresh
        if not moved and fresh.login is None:  # (a login keeps its own token: consul/login.py)
            self.consul.use_token(settings.token)  # the token just read: the same file's
        self._apply(plan, jobs)
        self.events.emit("reloaded", jobs=sorted(jobs), **plan.event_fields())

    def _apply(self, plan: ReloadPlan, jobs: dict[str, JobConfig]) -> None:
        """Hand the plan's changes to the timer, each loop on its own; `self.loops` is swapped
        whole (the listener's thread reads it meanwhile)."""
        assert self.timer is not None
        loops = dict(self.loops)
        for name in plan.remove:
            self.timer.retire_job(loops.pop(name))
        for name in plan.replace:
            old, loops[name] = loops[name], self._loop(jobs[name])
            loops[name].continue_from(old)
            self.timer.retire_job(old, successor=loops[name])
        for name in plan.add:
            loops[name] = self._loop(jobs[name])
            self.timer.add(loops[name])
        self.loops = loops
