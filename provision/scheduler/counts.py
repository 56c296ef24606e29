"""What one job loop of the scheduler saw, for `/metrics` and `/healthz` (scheduler/listen.py).

Writers are the loop's thread and the engine's helper threads (through the events they emit);
the reader is the listener's thread. The state is one immutable CountsSnapshot, replaced whole
under a lock at each change: a reader takes it as it is, never half-updated.

Most of it follows from the events alone (`observe`: a table of event -> change, pure and
tested as such); what no event says, the loop tells directly (the tick's outcome, a run's
duration, a success).
"""

from __future__ import annotations

import enum
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from provision.system.text import printable

# Skips by reason: a small fixed set, never the reason's text (it can quote Consul's data).
TAKEN, OVERLAP, LOCK_DELAY, OTHER = "taken", "overlap", "lock-delay", "other"
SKIP_REASONS = (TAKEN, OVERLAP, LOCK_DELAY, OTHER)
# The tick outcomes as the loop counts them (RunResult's, plus its own two).
OUTCOMES = ("ran", "skipped", "missed", "lost", "interrupted", "error", "consul-unavailable")

# Cron jobs run from under a second to hours; a tick starts within ms, or seconds when late.
DURATION_BUCKETS = (0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0)
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ERROR_LIMIT = 160  # characters of a Consul error kept for /healthz (printable, bounded)

# The reasons lockctl itself writes (runner/tick_lock.py, scheduler/loop.py), matched at their
# start: what follows the prefix may quote a lock holder's record, which anyone can write.
_OVERLAP = re.compile(r"(overlap: |tick \S+: overlap, )")
_LOCK_DELAY = re.compile(r"tick \S+: the lock is in lock-delay")


def skip_reason(fields: Mapping[str, Any]) -> str:
    """The `skipped` event's fields classified into one of SKIP_REASONS."""
    if "taken_outcome" in fields:  # the tick has a record: another runner has (or had) it
        return TAKEN
    reason = fields.get("reason")
    if not isinstance(reason, str):
        return OTHER
    if _OVERLAP.match(reason):
        return OVERLAP
    if _LOCK_DELAY.match(reason):
        return LOCK_DELAY
    return OTHER


class SessionState(str, enum.Enum):
    NOT_YET = "not-yet"  # no tick has needed one yet (or it was destroyed at the end)
    VALID = "valid"
    LOST = "lost"  # Consul no longer knows it; the next tick makes a new one


@dataclass(frozen=True)
class Observations:
    """A histogram's state: a count per bucket (the last one above every bound) and the sum."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...] = ()
    total: float = 0.0

    def added(self, value: float) -> Observations:
        counts = list(self.counts or (0,) * (len(self.bounds) + 1))
        index = next((i for i, bound in enumerate(self.bounds) if value <= bound), -1)
        counts[index] += 1
        return replace(self, counts=tuple(counts), total=self.total + value)

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, count of values <= le) per bound and +Inf, as Prometheus exposes them."""
        counts = self.counts or (0,) * (len(self.bounds) + 1)
        pairs, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), counts, strict=True):
            running += count
            pairs.append(("+Inf" if bound == float("inf") else repr(bound), running))
        return pairs


@dataclass(frozen=True)
class CountsSnapshot:
    ticks_due: int = 0
    outcomes: Mapping[str, int] = field(default_factory=dict)
    skips: Mapping[str, int] = field(default_factory=dict)
    consul_unavailable: int = 0
    renew_failures: int = 0
    running: bool = False
    consul_up: bool = True  # until a request of this loop goes unanswered
    consul_error: str | None = None  # why not (printable, bounded)
    session: SessionState = SessionState.NOT_YET
    last_success: float | None = None  # Unix time
    durations: Observations = Observations(DURATION_BUCKETS)
    lags: Observations = Observations(LAG_BUCKETS)


# Events that show Consul answered this loop's last request, and those that show it did not.
# A `skipped` event answers too, unless it is the loop's own overlap skip (no request made).
ANSWERED = ("acquired", "released", "renewed", "missed", "housekeeping")
UNANSWERED = ("renew-failed", "housekeeping-failed")
SESSION_EVENTS = {
    "session-created": SessionState.VALID,
    "session-lost": SessionState.LOST,
    "session-destroyed": SessionState.NOT_YET,
}


def observed(
    state: CountsSnapshot, event: str, fields: Mapping[str, Any], now: float
) -> CountsSnapshot:
    """`state` after the loop or the engine emitted `event` with `fields` at `now` (Unix time)."""
    if event in SESSION_EVENTS:
        state = replace(state, session=SESSION_EVENTS[event])
        if event == "session-created":
            state = answered(state)
    if event in ANSWERED or (event == "skipped" and not _loop_overlap(fields)):
        state = answered(state)
    if event in UNANSWERED:
        state = unanswered(state, fields.get("warning") or fields.get("error"))
    if event == "renew-failed":
        state = replace(state, renew_failures=state.renew_failures + 1)
    if event == "skipped":
        state = skipped(state, skip_reason(fields), _count_field(fields.get("ticks")))
    if event == "acquired":
        state = replace(state, running=True)
        lag = _lag(fields.get("tick"), now)
        if lag is not None:
            state = replace(state, lags=state.lags.added(lag))
    if event in ("released", "lost"):
        state = replace(state, running=False)
    return state


def answered(state: CountsSnapshot) -> CountsSnapshot:
    return replace(state, consul_up=True, consul_error=None)


def unanswered(state: CountsSnapshot, error: object) -> CountsSnapshot:
    why = printable(str(error), ERROR_LIMIT) if error is not None else "no answer"
    return replace(state, consul_up=False, consul_error=why)


def skipped(state: CountsSnapshot, reason: str, n: int) -> CountsSnapshot:
    return replace(state, skips={**state.skips, reason: state.skips.get(reason, 0) + n})


def _loop_overlap(fields: Mapping[str, Any]) -> bool:
    reason = fields.get("reason")
    return isinstance(reason, str) and reason.startswith("overlap: ")


def _count_field(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def _lag(tick: object, now: float) -> float | None:
    """Seconds from the tick's instant to `now`; None without a tick lockctl named."""
    if not isinstance(tick, str) or not tick.endswith("Z"):
        return None
    try:
        instant = datetime.fromisoformat(tick[:-1] + "+00:00").timestamp()
    except ValueError:
        return None
    return max(0.0, now - instant)


class LoopCounts:
    """One loop's counts, safe to change from several threads and to read from another."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = CountsSnapshot()

    def snapshot(self) -> CountsSnapshot:
        with self._lock:
            return self._state

    def observe(self, event: str, fields: Mapping[str, Any], now: float) -> None:
        with self._lock:
            self._state = observed(self._state, event, fields, now)

    def tick_due(self) -> None:
        with self._lock:
            self._state = replace(self._state, ticks_due=self._state.ticks_due + 1)

    def counted(self, outcome: str, n: int = 1) -> None:
        with self._lock:
            outcomes = self._state.outcomes
            self._state = replace(
                self._state, outcomes={**outcomes, outcome: outcomes.get(outcome, 0) + n}
            )

    def ran(self, duration: float | None, succeeded_at: float | None) -> None:
        """A run ended: its duration (None: the job did not start), when it succeeded."""
        with self._lock:
            state = self._state
            if duration is not None:
                state = replace(state, durations=state.durations.added(duration))
            if succeeded_at is not None:
                state = replace(state, last_success=succeeded_at)
            self._state = replace(state, running=False)

    def not_running(self) -> None:
        with self._lock:
            self._state = replace(self._state, running=False)

    def consul_failed(self, error: str, *, renewing: bool) -> None:
        with self._lock:
            state = unanswered(self._state, error)
            self._state = replace(
                state,
                consul_unavailable=state.consul_unavailable + 1,
                renew_failures=state.renew_failures + (1 if renewing else 0),
            )

    def consul_answered(self) -> None:
        with self._lock:
            self._state = answered(self._state)
