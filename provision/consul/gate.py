"""The calls a pool of transports shares: a gate on how many go at once, and their count."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class RequestCount:
    """How many HTTP requests (retries included) went over one pool, from any thread."""

    def __init__(self) -> None:
        self._value = 0
        self._lock = threading.Lock()

    def add_one(self) -> None:
        with self._lock:
            self._value += 1

    @property
    def value(self) -> int:
        return self._value


class CallGate:
    """At most `limit` calls at once; an urgent call (a claim, a renewal) takes the next free
    turn before any other waiting call. When 300 jobs tick at once, the claims then start their
    jobs while the completions and reads wait, and a renewal (the fencing clock of every lock
    under the session) never queues behind either."""

    def __init__(self, limit: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = max(limit, 1)
        self._clock = clock
        self._busy = 0
        self._urgent_waiting = 0
        self._lock = threading.Lock()
        # One condition per class of caller, so a freed turn wakes one waiter, not all of them
        self._urgent = threading.Condition(self._lock)
        self._others = threading.Condition(self._lock)

    def enter(self, timeout: float, *, urgent: bool = False) -> bool:
        """Take a turn within `timeout` seconds; False when none came."""
        ends_at = self._clock() + timeout
        with self._lock:
            if urgent:
                self._urgent_waiting += 1
            try:
                while self._busy >= self.limit or (not urgent and self._urgent_waiting):
                    left = ends_at - self._clock()
                    if left <= 0:
                        return False
                    (self._urgent if urgent else self._others).wait(left)
                self._busy += 1
                return True
            finally:
                if urgent:
                    self._urgent_waiting -= 1

    def leave(self) -> None:
        with self._lock:
            self._busy -= 1
            (self._urgent if self._urgent_waiting else self._others).notify()
