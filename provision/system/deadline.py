"""Retry until a deadline: the one loop behind every "wait until Consul is ready" in lockctl.

Two shapes, one rule (try, then give up only if the deadline has passed, else pause and again):

    for _ in attempts(deadline, pause):          # poll, and keep what was seen
        leader = find_leader()
        if leader:
            return leader
    raise SomeError("no leader in time")

    if not wait_until(deadline, ready, pause):  # poll a condition
        raise SomeError("not ready in time")

    retry_until(deadline, call, retry_on=(ConsulUnavailable,), pause=0.1)   # ride out errors

The clock lives in the `Deadline` and the pause is an injectable `sleep`, so tests run these
loops on a fake clock. The HTTP transport's own retries (capped backoff with jitter, per call)
are a different policy and stay in provision/consul/transport.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")
Clock = Callable[[], float]
Sleep = Callable[[float], None]


class Deadline:
    """A moment on a monotonic clock, `seconds` from when it was made."""

    def __init__(self, seconds: float, clock: Clock = time.monotonic) -> None:
        self.clock = clock
        self.at = clock() + seconds

    def remaining(self) -> float:
        """Seconds left, never negative."""
        return max(0.0, self.at - self.clock())

    def expired(self) -> bool:
        return self.clock() >= self.at


def attempts(deadline: Deadline, pause: float, sleep: Sleep = time.sleep) -> Iterator[int]:
    """Yield 1, 2, 3...: one per attempt. After an attempt the loop ends if the deadline has
    passed, else it pauses `pause` seconds first. There is always at least one attempt."""
    number = 1
    while True:
        yield number
        if deadline.expired():
            return
        sleep(pause)
        number += 1


def wait_until(
    deadline: Deadline, done: Callable[[], bool], pause: float, sleep: Sleep = time.sleep
) -> bool:
    """Whether `done()` came true before the deadline passed (it is asked at least once)."""
    return any(done() for _ in attempts(deadline, pause, sleep))


def retry_until(
    deadline: Deadline,
    attempt: Callable[[], T],
    *,
    retry_on: tuple[type[BaseException], ...],
    pause: float,
    sleep: Sleep = time.sleep,
) -> T:
    """What `attempt()` returns; an exception in `retry_on` is retried until the deadline has
    passed, then the last one is raised. Any other exception is raised at once."""
    while True:
        try:
            return attempt()
        except retry_on:
            if deadline.expired():
                raise
        sleep(pause)
