"""The helper threads of one held lock: the renewer, the watcher and the job's waiter.

They only record facts (the confirmation time lives in the LockSession; a loss here) and wake
the engine, which alone decides and acts. `stop_and_join` ends all three, so a run leaves no
thread behind (an engine in a long-lived process runs thousands of them).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from provision.consul import ConsulError, NotFound
from provision.runner.child import Child
from provision.runner.events import EventLog, ms
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
        child: Child,
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
        # Daemons: a thread still in a hung HTTP call must never keep the process alive.
        self._threads = [
            threading.Thread(target=self._renew, name="lockctl-renew", daemon=True),
            threading.Thread(
                target=self._watch, args=(modify_index,), name="lockctl-watch", daemon=True
            ),
            threading.Thread(
                target=self._await, args=(child,), name="lockctl-job-waiter", daemon=True
            ),
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def await_child(self, child: Child) -> None:
        """Wait for a retry's job too (runner/retries.py): the renewer and the watcher go on."""
        waiter = threading.Thread(
            target=self._await, args=(child,), name="lockctl-job-waiter", daemon=True
        )
        self._threads.append(waiter)
        waiter.start()

    def stop_and_join(self) -> None:
        self.halt.set()
        for thread in self._threads:
            thread.join(JOIN_TIMEOUT)

    def _report_lost(self, reason: str) -> None:
        if not self.releasing and not self.halt.is_set() and self.lost is None:
            self.lost = reason
            self.wakeup.set()

    def _renew(self) -> None:
        interval = self.lock.job.timings.renew_interval
        delay = interval
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
        if self.halt.wait(WATCH_AFTER):
            return
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

    def _await(self, child: Child) -> None:
        child.wait()
        self.wakeup.set()
