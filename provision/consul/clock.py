"""Consul's clock as this process knows it: the time every tick decision is judged against.

Every answer of the agent carries its clock in the HTTP Date header (whole seconds, rounded
down), written at some moment between the request's send and its receipt. On this process's
monotonic clock that bounds the agent's offset (agent time = monotonic + offset):

    offset in [date - received, date + 1 s - sent]

The bounds of every answer are intersected, so a few answers at different moments of a second
pin the offset within a round trip; the time is then the monotonic clock plus the offset, which
a step of this host's wall clock (an operator's `date -s`, a VM resumed, a bad NTP server) does
not move. An answer outside the bounds means the agent's own clock stepped (or drifted more than
the bounds allow): the estimate starts again from that answer, and the step is reported.

`AgentClock()` is a WallClock (a callable returning an aware datetime): the EARLIEST moment the
agent's clock may show now, so "the tick has come" is never said early; while no answer is known
it is this host's clock. Pure arithmetic over given instants (table-tested in tests/unit/
test_consul_clock.py); the transport feeds it (consul/transport.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

DATE_RESOLUTION = 1.0  # seconds: an HTTP Date is whole seconds, rounded down
REPORTED_STEP = 1.0  # seconds: a jump of the agent's clock worth a `clock-step` event


@dataclass(frozen=True)
class OffsetBounds:
    """The agent's clock minus this process's monotonic clock lies in [low, high] (seconds)."""

    low: float
    high: float

    @property
    def width(self) -> float:
        return self.high - self.low

    def meet(self, other: OffsetBounds) -> OffsetBounds | None:
        """Both at once, or None when they contradict each other."""
        low, high = max(self.low, other.low), min(self.high, other.high)
        return OffsetBounds(low, high) if low <= high else None


def answer_bounds(sent: float, received: float, date: float) -> OffsetBounds:
    """What one answer says: its Date `date` (epoch seconds) was written between `sent` and
    `received` (monotonic), when the agent's clock read between date and date + 1 s."""
    return OffsetBounds(date - received, date + DATE_RESOLUTION - sent)


def learn(known: OffsetBounds | None, answer: OffsetBounds) -> tuple[OffsetBounds, float | None]:
    """The bounds after one more answer, and how far the agent's clock stepped when the answer
    contradicts what was known (None when it agrees, or the jump is under REPORTED_STEP)."""
    if known is None:
        return answer, None
    both = known.meet(answer)
    if both is not None:
        return both, None
    # the agent's clock moved against ours: follow it (it is Consul's clock), from this answer
    jump = answer.low - known.high if answer.low > known.high else answer.high - known.low
    return answer, jump if abs(jump) >= REPORTED_STEP else None


class AgentClock:
    """The answering agent's clock, learnt from its answers; safe across threads."""

    def __init__(
        self,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._monotonic, self._wall = monotonic, wall
        self._bounds: OffsetBounds | None = None
        self._steps: list[float] = []  # jumps of the agent's clock, not yet taken
        self._lock = threading.Lock()

    def observe(self, sent: float, received: float, date: datetime | None) -> None:
        """One answer: sent and received on this clock's monotonic clock, its Date (or None)."""
        if date is None:
            return
        answer = answer_bounds(sent, received, date.timestamp())
        with self._lock:
            self._bounds, jump = learn(self._bounds, answer)
            if jump is not None:
                self._steps.append(jump)

    def __call__(self) -> datetime:
        """The earliest moment the agent's clock may show now (this host's clock until the
        first answer): what has come on it, has come on Consul's clock."""
        bounds = self._bounds
        if bounds is None:
            return datetime.fromtimestamp(self._wall(), timezone.utc)
        return datetime.fromtimestamp(self._monotonic() + bounds.low, timezone.utc)

    @property
    def known(self) -> bool:
        return self._bounds is not None

    @property
    def uncertainty(self) -> timedelta | None:
        """How much later than `self()` the agent's clock may be (None: no answer yet)."""
        bounds = self._bounds
        return None if bounds is None else timedelta(seconds=bounds.width)

    def host_ahead(self) -> float | None:
        """This host's wall clock minus the agent's (the middle of the bounds), in seconds."""
        bounds = self._bounds
        if bounds is None:
            return None
        return self._wall() - (self._monotonic() + (bounds.low + bounds.high) / 2)

    def take_steps(self) -> list[float]:
        """The jumps of the agent's clock seen since the last call (seconds, + forward)."""
        with self._lock:
            steps, self._steps = self._steps, []
        return steps


class WallSteps:
    """Notices a step of this host's wall clock: the wall clock against the monotonic one,
    which NTP only slews (at most 0.5 ms a second), so a change of their difference by more
    than STEP between two looks seconds apart is a step."""

    STEP = 0.5  # seconds

    def __init__(
        self,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._monotonic, self._wall = monotonic, wall
        self._difference = wall() - monotonic()

    def step(self) -> float | None:
        """How far the wall clock stepped since the last look (seconds, + forward), or None."""
        difference = self._wall() - self._monotonic()
        moved, self._difference = difference - self._difference, difference
        return moved if abs(moved) > self.STEP else None
