"""The helpers of one held lock: the renewer, the watcher, and what tells of the job's end.

They only record facts (the confirmation time lives in the LockSession; a loss here) and wake
the engine, which alone decides and acts. `stop_and_join` ends them, so a run leaves no thread
behind (an engine in a long-lived process runs thousands of them).

A thread is started only when its work is due: the renewer one renew interval after the
acquire, the watcher WATCH_AFTER after it. The job's end needs no thread where the job has a
descriptor that becomes readable when it exits (the helper's status socket, a pidfd): the
engine waits on it beside its wake-ups. So a job that ends within a second, most scheduled
jobs, costs no thread start at all: a scheduler starting 100 runs at one tick paid three
thread starts for each (each a turn of the interpreter lock, runner/pump.py says why).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable

from provision.consul import ConsulError, NotFound
from provision.runner.body import JobBody
from provision.runner.events import EventLog, ms
from provision.runner.forkserver import KeptProcess
from provision.runner.lock import LockSession
from provision.runner.stop import Wakeup

WATCH_WAIT = 60.0  # seconds per blocking watch; renewals confirm the lock in between anyway
# The watch starts this long after the acquire. A job that ends sooner (most scheduled jobs)
# costs Consul no watch and the process no connection held for it: hundreds of such jobs at
# one tick would otherwise overflow the connection pool (each overflow a new TLS handshake).
# The watch asks from the acquire's index on, so a change meanwhile is seen the moment it starts.
WATCH_AFTER = 1.0
WATCH_ERROR_PAUSE = 0.5
# How long the end of a run waits for a helper still inside an HTTP call. After a release the
# watcher returns at once (the key changed); a call to an unreachable Consul ends by its client
# timeout, after the run, and the thread with it.
JOIN_TIMEOUT = 2.0


class LockMonitors:
    """Renew the session, watch the key, wait for the job; report to the engine."""

    def __init__(
        self,
        lock: LockSession,
        child: JobBody,
        modify_index: int,
        events: EventLog,
        wakeup: Wakeup,
        clock: Callable[[], float],
    ) -> None:
        self.lock = lock
        self.events = events
        self.wakeup = wakeup
        self.clock = clock
        self.halt = threading.Event()
        # Set (a plain flag, it wakes nobody) when the engine starts releasing: our own release
        # changes the key, which the watcher must not report as a loss.
        self.releasing = False
        self.lost: str | None = None
        self._child = child
        self._modify_index = modify_index
        started = clock()
        # when each thread's work comes due (None: started); run_due starts it then
        self._due: dict[str, float | None] = {
            "renew": started + lock.job.timings.renew_interval,
            "watch": started + WATCH_AFTER,
        }
        self._threads: list[threading.Thread] = []
        self._exit_fd, self._own_exit_fd = _exit_descriptor(child)

    def start(self) -> None:
        """What is due at once: a waiter for the job's end, where it has no descriptor."""
        if self._exit_fd is None:
            self._start("lockctl-job-waiter", self._await, self._child)

    def run_due(self, now: float) -> float | None:
        """Start the threads whose work is due by `now`; when the next one is (None: all are
        started): the engine wakes by then."""
        for name, due in self._due.items():
            if due is not None and due <= now:
                self._due[name] = None
                if name == "renew":
                    self._start("lockctl-renew", self._renew)
                else:
                    self._start("lockctl-watch", self._watch, self._modify_index)
        pending = [due for due in self._due.values() if due is not None]
        return min(pending) if pending else None

    def exit_fds(self, job_exited: bool) -> list[int]:
        """What to wait on beside the engine's wake-ups: the job's exit descriptor while the
        job runs (after it, the helper's socket is closed and its number may be reused)."""
        return [] if job_exited or self._exit_fd is None else [self._exit_fd]

    def _start(self, name: str, target: Callable[..., None], *args: object) -> None:
        # Daemons: a thread still in a hung HTTP call must never keep the process alive.
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def await_child(self, child: JobBody) -> None:
        """Wait for a retry's job instead (tick/retries.py): the renewer and the watcher go
        on; the ended attempt's descriptor is let go."""
        self._close_exit_fd()
        self._child = child
        self._exit_fd, self._own_exit_fd = _exit_descriptor(child)
        self.start()

    def stop_and_join(self) -> None:
        self.halt.set()
        for thread in self._threads:
            thread.join(JOIN_TIMEOUT)
        self._close_exit_fd()

    def _close_exit_fd(self) -> None:
        if self._own_exit_fd and self._exit_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._exit_fd)
        self._exit_fd, self._own_exit_fd = None, False

    def _report_lost(self, reason: str) -> None:
        if not self.releasing and not self.halt.is_set() and self.lost is None:
            self.lost = reason
            self.wakeup.set()

    def _renew(self) -> None:
        interval = self.lock.job.timings.renew_interval
        delay = 0.0  # started when the first renewal is due
        while not self.halt.wait(delay):
            started = self.clock()
            try:
                self.lock.renew()
            except NotFound:
                self._report_lost("session invalidated (renew answered 404)")
                return
            except ConsulError as exc:
                self.events.emit("renew-failed", session=self.lock.session_id, error=str(exc))
                delay = min(interval / 4, 1.0)  # retry sooner: the fencing clock is running
                continue
            took = ms(self.clock() - started)
            self.events.emit("renewed", session=self.lock.session_id, took_ms=took)
            delay = interval

    def _watch(self, index: int) -> None:
        while not self.halt.is_set():
            try:
                held, index = self.lock.watch(index, WATCH_WAIT)
            except ConsulError:
                if self.halt.wait(WATCH_ERROR_PAUSE):
                    return
                continue
            if not held:
                self._report_lost("the lock key no longer names our session")
                return

    def _await(self, child: JobBody) -> None:
        child.wait()
        self.wakeup.set()


def _exit_descriptor(child: JobBody) -> tuple[int | None, bool]:
    """A descriptor readable once the job's first process has ended, and whether it is ours
    to close: the namespace helper's status socket (the helper says the exit on it), else a
    pidfd of the process; (None, False) where there is neither."""
    process = child.process
    if isinstance(process, KeptProcess):
        return process.status_fd(), False
    if process is None:
        return None, False
    try:
        return os.pidfd_open(process.pid), True
    except (AttributeError, OSError):
        return None, False
