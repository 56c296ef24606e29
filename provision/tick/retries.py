"""Whether a job's attempt is tried again, as pure functions of its result and the clock.

A job with `retries = N` gets up to N more attempts after a failed one, on the same replica,
under the same lock (held and renewed through `retry_delay`, so no other replica can take the
tick or overlap it) and for the same tick. The held run (tick/held.py HeldRun) asks
`next_attempt` after each attempt and `delay_verdict` while it waits; the table tests are in
tests/unit/test_retries.py.

An attempt is retried when it ran to its end under the lock and exited non-zero, or when it
was stopped at its timeout and `retry_on_timeout` is set, but never an HTTP call stopped at its
timeout: its handler cannot be stopped and may still run (the spec and the worker config refuse
the setting; this holds even if one got through). A lost (fenced) or interrupted run is never
retried. A retry never starts at or past the next tick's instant: there the retries are
cut, and the tick's record says so (`retries_cut`), so a tick's attempts never overlap the next
tick's run.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from provision.ledger.attempts import CUT_BY_NEXT_TICK, CUT_BY_STOP
from provision.outcomes import Outcome
from provision.timings import JobTimings


class StopReason(str, enum.Enum):
    """Why no further attempt is made; the values are the record's `retries_cut` and events'."""

    SUCCEEDED = "succeeded"
    NOT_RETRIED = "not-retried"  # lost, interrupted, or timed out without retry_on_timeout
    EXHAUSTED = "exhausted"  # retries + 1 attempts made
    NEXT_TICK = CUT_BY_NEXT_TICK  # the next attempt would start at or after the next tick
    STOPPED = CUT_BY_STOP  # the runner was asked to stop during the delay


# The reasons that cut retries the job still had: the tick's record keeps them.
CUT = frozenset({StopReason.NEXT_TICK, StopReason.STOPPED})


@dataclass(frozen=True)
class Retry:
    """Start the next attempt (number `attempt`) at `at` (the supervisor's monotonic clock)."""

    attempt: int
    at: float


@dataclass(frozen=True)
class Stop:
    reason: StopReason


def next_attempt(
    verdict: Outcome | None,
    exit_status: int | None,
    attempt: int,
    timings: JobTimings,
    now: float,
    next_tick_at: float | None,
    *,
    http: bool = False,
) -> Retry | Stop:
    """After attempt number `attempt` (1 for the first) ended with `verdict` and `exit_status`
    at `now`: the next attempt, or why there is none. `next_tick_at`: the next tick's instant on
    the same clock (None: no schedule, only the count bounds the retries). `http`: the body is
    an HTTP call, whose timed-out handler may still run."""
    if verdict is Outcome.RAN and exit_status == 0:
        return Stop(StopReason.SUCCEEDED)
    retryable = verdict is Outcome.RAN or (
        verdict is Outcome.TIMED_OUT and timings.retry_on_timeout and not http
    )
    if not retryable or timings.retries == 0:
        return Stop(StopReason.NOT_RETRIED)
    if attempt > timings.retries:
        return Stop(StopReason.EXHAUSTED)
    at = now + timings.retry_delay
    if next_tick_at is not None and at >= next_tick_at:
        return Stop(StopReason.NEXT_TICK)
    return Retry(attempt + 1, at)


def delay_verdict(
    now: float,
    confirmed_at: float,
    fence_after: float,
    lost: bool,
    stop_signal: int | None,
) -> Outcome | None:
    """While waiting for the next attempt (no job runs): LOST when Consul said the lock is gone
    or it was not confirmed within the fencing bound (the next attempt would run unvouched),
    INTERRUPTED on a stop request, None to go on waiting."""
    if lost or now >= confirmed_at + fence_after:
        return Outcome.LOST
    if stop_signal is not None:
        return Outcome.INTERRUPTED
    return None
