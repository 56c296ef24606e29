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

from provision.consul import Consul, ConsulSettings, check_tls_files, resolve_settings
from provision.errors import InputError, LocalEnvironmentError, LockctlError
from provision.runner.events import EventLog
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


def scheduled_jobs(config: WorkerConfig) -> list[JobConfig]:
    """The jobs this scheduler runs: those with a schedule and a command."""
    return [job for job in config.jobs if job.schedule is not None and job.command]


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
        self._reload = False  # set by a signal handler: a plain flag, never a lock

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

    def _start(self, config: WorkerConfig, settings: ConsulSettings) -> None:
        consul = Consul(settings, pool_size=POOL_SIZE, max_in_flight=IN_FLIGHT, batch_txns=True)
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
                    counts=counts,
                    sessions=sessions,
                    forks=self.forks,
                )
            )
        sessions.start()
        self.timer = TickTimer(self.loops, self.stop, on_error=self._job_failed)
        self._timer_thread = threading.Thread(target=self.timer.run, name="lockctl-timer")
        self._timer_thread.daemon = True
        self._timer_thread.start()
        self.events.emit(
            "started", config=str(config.path), jobs=[loop.job.name for loop in self.loops]
        )

    def _job_failed(self, job: JobTicks, exc: BaseException) -> None:
        """An unexpected error in one job's run (a bug): said, counted; its next tick comes."""
        job.tick_failed(unexpected(exc))

    def snapshots(self) -> list[tuple[str, CountsSnapshot]]:
        """Each current job's counts, for the listener's thread (a reload may swap the loops:
        the list is read once)."""
        return [(loop.job.name, loop.counts.snapshot()) for loop in list(self.loops)]

    def _reload_config(self) -> None:
        """Load and check the whole new config, its files included, before anything changes:
        a config that could not work is refused and the running loops go on untouched."""
        try:
            fresh = self.loader(self.config.path)
            if fresh.worker != self.config.worker:
                raise InputError(
                    f"{self.config.path}: now for worker {fresh.worker}, not {self.config.worker}"
                )
            settings = checked_connection(fresh)
        except LockctlError as exc:
            self.events.emit("reload-refused", error=str(exc), kept=str(self.config.path))
            return
        self._end_loops()  # each job finishes its current run
        self.config = fresh
        self.events.emit("reloaded", jobs=[job.name for job in scheduled_jobs(fresh)])
        self._start(fresh, settings)
