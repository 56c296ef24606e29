"""`lockctl schedule`: every scheduled job of one worker's config, in one long-lived process.

Each replica (a VM, a container, a pod) runs one: one timer for all its jobs (scheduler/timer.py)
fires each job's run of its next tick (scheduler/loop.py) at this replica's turn; every lock is
held under the replica's session for the job's (TTL, LockDelay), one per distinct pair
(scheduler/sessions.py). The process's owner (the CLI) turns signals into calls:

    SIGTERM, SIGINT  stop: no new claim; a running job gets the signal and its kill grace, its
                     record is completed, the lock released, every session destroyed; exit 0
    SIGHUP           reload the worker config: a bad one is refused and the old one kept; a good
                     one replaces the loops once their current runs end

One scheduler per worker config and host: the config file is locked (flock) while it runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

from provision.consul import NO_RETRY, AgentClock, Consul, ConsulError, resolve_settings
from provision.consul.clock import WallSteps
from provision.errors import InputError, LocalEnvironmentError, LockctlError
from provision.runner.events import EventLog, ms
from provision.runner.forkserver import ForkServer
from provision.runner.stop import StopRequest
from provision.scheduler.counts import CountsSnapshot, LoopCounts
from provision.scheduler.loop import CountingEventLog, JobTicks, unexpected
from provision.scheduler.sessions import SessionPool
from provision.scheduler.timer import TickTimer
from provision.workers.config import JobConfig, WorkerConfig, load_worker_config

JOIN_POLL = 0.5
# Connections kept to the agent, and calls at once (watches of running jobs aside): hundreds of
# jobs ticking at :00 queue for a turn instead of opening a connection each.
POOL_SIZE, IN_FLIGHT = 64, 32
SCHEDULER = "lockctl-schedule"  # the `job` field of the scheduler's own events
CLOCK_PROBE_TIMEOUT = 2.0  # seconds for the first answer at start, for the agent's clock


def scheduled_jobs(config: WorkerConfig) -> list[JobConfig]:
    """The jobs this scheduler runs: those with a schedule and a command."""
    return [job for job in config.jobs if job.schedule is not None and job.command]


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
        self.loops: list[JobTicks] = []
        self.sessions: SessionPool | None = None
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

    def request_reload(self) -> None:
        """From a signal handler: only a flag, read by the main loop (a lock could deadlock)."""
        self._reload = True

    def run(self) -> int:
        jobs = scheduled_jobs(self.config)
        if not jobs:
            raise InputError(
                f"{self.config.path}: no job with a schedule and a command for "
                f"{self.config.worker}: nothing to schedule"
            )
        self.forks.start()
        try:
            self._start(self.config)
            while not self.stop.requested:
                self.stop.sleep(JOIN_POLL)
                self._watch_clocks()
                if self._reload:
                    self._reload = False
                    self._reload_config()
            self._end_loops()
        finally:
            self.forks.close()  # after the last run: no job of ours is left to fork or keep
        self.events.emit("stopped", signal=self.stop.signum)
        return 0

    def _end_loops(self) -> None:
        """Wait for every job's current run to end, then destroy the replica's sessions."""
        if self.timer is not None and self._timer_thread is not None:
            self.timer.retire()  # after a stop it has ended already, or ends with its runs
            self._timer_thread.join()
            self.timer = self._timer_thread = None
        if self.sessions is not None:
            self.sessions.close()
            self.sessions = None

    def _start(self, config: WorkerConfig) -> None:
        settings = resolve_settings(**config.connection())
        consul = Consul(
            settings,
            pool_size=POOL_SIZE,
            max_in_flight=IN_FLIGHT,
            batch_txns=True,
            agent_clock=self.agent_clock,
        )
        sessions = SessionPool(consul, config.worker, self.events)
        self.sessions = sessions
        self.loops = []
        for job in scheduled_jobs(config):
            counts = self.counts.setdefault(job.name, LoopCounts())
            events = CountingEventLog(job.name, config.worker, self.stream, counts)
            self.loops.append(
                JobTicks(
                    consul,
                    job,
                    config.worker,
                    events,
                    self.stop,
                    wall=self.agent_clock,
                    counts=counts,
                    sessions=sessions,
                    forks=self.forks,
                )
            )
        sessions.start()
        self._learn_clock(consul)
        self.timer = TickTimer(
            self.loops, self.stop, wall=self.agent_clock, on_error=self._job_failed
        )
        self._timer_thread = threading.Thread(target=self.timer.run, name="lockctl-timer")
        self._timer_thread.daemon = True
        self._timer_thread.start()
        self.events.emit(
            "started", config=str(config.path), jobs=[loop.job.name for loop in self.loops]
        )

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
            for loop in list(self.loops):
                loop.recheck_clocks()
        learnt = self.agent_clock.known and not self._clock_known
        self._clock_known = self.agent_clock.known
        if (agent or learnt) and self.timer is not None:
            self.timer.replan()  # the turns were worked out on a clock that has moved

    def _job_failed(self, job: JobTicks, exc: BaseException) -> None:
        """An unexpected error in one job's run (a bug): said, counted; its next tick comes."""
        job.tick_failed(unexpected(exc))

    def snapshots(self) -> list[tuple[str, CountsSnapshot]]:
        """Each current job's counts, for the listener's thread (a reload may swap the loops:
        the list is read once)."""
        return [(loop.job.name, loop.counts.snapshot()) for loop in list(self.loops)]

    def _reload_config(self) -> None:
        try:
            fresh = self.loader(self.config.path)
            if fresh.worker != self.config.worker:
                raise InputError(
                    f"{self.config.path}: now for worker {fresh.worker}, not {self.config.worker}"
                )
            if not scheduled_jobs(fresh):
                raise InputError(f"{self.config.path}: no job to schedule any more")
        except LockctlError as exc:
            self.events.emit("reload-refused", error=str(exc), kept=str(self.config.path))
            return
        self._end_loops()  # each job finishes its current run
        self.config = fresh
        self.events.emit("reloaded", jobs=[job.name for job in scheduled_jobs(fresh)])
        self._start(fresh)
