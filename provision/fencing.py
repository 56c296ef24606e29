"""The fencing decision, the runner's safety promise, as pure functions of facts and the clock.

While the job runs, the engine gathers facts (the time now, the send time of the last request that
confirmed the lock, whether Consul said the lock is gone, whether the job and its leftovers are
alive, whether a stop was requested, when the job got SIGTERM) and asks `decide` what to do next:
keep going until a given time, SIGTERM or SIGKILL the job's whole tree, release the lock, or
report it lost. A job past its `timeout` is stopped the same way (SIGTERM, the kill grace,
SIGKILL), but its lock was never lost: it is released. The engine only carries the decision
out, so every path can be table-tested with a fake clock and no Consul (tests/unit/test_fencing.py).

The bounds, counted from the send time of the last confirmation (see provision.timings): SIGTERM
at `fence_after` (normally D - G - margin), SIGKILL at `kill_after` (D - margin). Nothing of the
job is alive after that moment, whatever the job does with SIGTERM.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Callable
from dataclasses import dataclass

# `fencing.Outcome`: the old name of the one vocabulary, kept for one release
from provision.outcomes import Outcome as Outcome
from provision.timings import SAFETY_MARGIN, JobTimings

UNSAFE_FENCE_SLACK = 0.5  # --allow-unsafe only: how late a healthy renewal may confirm the lock


class Action(str, enum.Enum):
    KEEP_GOING = "keep-going"  # nothing to do until `wake_at` (or until a fact changes)
    TERMINATE = "terminate"  # signal the job's whole tree (SIGTERM, or the stop signal)
    KILL = "kill"  # SIGKILL the job's whole tree
    RELEASE = "release"  # the job is over and its verdict stands: release the lock
    REPORT_LOST = "report-lost"  # the job is over, the lock was lost: do not release


class Reason(str, enum.Enum):
    LOST = "the lock key no longer names our session"
    UNCONFIRMED = "no confirmation of the lock in time"
    STOP = "stop requested"
    TIMEOUT = "the job's timeout passed"
    LEFTOVERS = "the job's main process exited; stopping what it left running"
    GRACE_OVER = "the kill grace is over"
    DEADLINE = "nothing of the job may live past LockDelay after the last confirmation"
    HOLDING = "holding the lock for min-hold"


@dataclass(frozen=True)
class FenceBounds:
    """Seconds after the last confirmation: SIGTERM at `fence_after`, SIGKILL at `kill_after`."""

    fence_after: float
    kill_after: float
    kill_grace: float


def past_fence(now: float, confirmed_at: float, fence_after: float) -> bool:
    """Whether the lock can no longer be vouched for: `fence_after` seconds have passed since
    the send time of the newest confirmation. Every reader of a lock's safety asks this itself,
    on its own clock, rather than trusting a flag another thread may not have set yet (after a
    pause, the reader's thread can run before the one that would set it)."""
    return now >= confirmed_at + fence_after


@dataclass(frozen=True)
class BodyFence:
    """What a body running under the lock may know of its safety: the bounds, the monotonic
    clock they count on, the newest confirmation's send time, and `follow`, which calls its
    argument with each newer confirmation and returns what stops that (a body whose fencing
    lives outside this process forwards them there)."""

    bounds: FenceBounds
    clock: Callable[[], float]
    confirmed_at: Callable[[], float]
    follow: Callable[[Callable[[float], None]], Callable[[], None]]

    def passed(self) -> bool:
        return past_fence(self.clock(), self.confirmed_at(), self.bounds.fence_after)


def fence_bounds(timings: JobTimings, renew_timeout: float) -> FenceBounds:
    """The bounds for these timings, with renewals answered within `renew_timeout`.

    SIGTERM normally comes at D - G - margin. It is never earlier than the moment the next
    renewal (sent one renew interval after the last, answered within its timeout) could have
    confirmed the lock, or a healthy but slow renewal would fence its own job; with
    --allow-unsafe timings (D <= G + margin) it would even fence at once. Moving SIGTERM later
    never weakens the promise: SIGKILL still comes at D - margin, only the job's grace shrinks.
    """
    safe = timings.lock_delay - timings.kill_grace - SAFETY_MARGIN
    fence_after = max(safe, timings.renew_interval + renew_timeout + UNSAFE_FENCE_SLACK)
    return FenceBounds(fence_after, timings.lock_delay - SAFETY_MARGIN, timings.kill_grace)


@dataclass(frozen=True)
class Facts:
    """What the engine knows at one moment (all times on the same monotonic clock)."""

    now: float
    confirmed_at: float  # send time of the newest request that proved the lock was ours
    lost: bool  # Consul said the lock is not ours any more (key changed, session gone)
    job_exited: bool  # the job's main process has ended
    tree_alive: bool  # some process of the job (main or leftovers) is still alive
    stop_signal: int | None  # the signal a stop was requested with, if one was
    verdict: Outcome | None  # settled by an earlier decision (RAN, LOST or INTERRUPTED)
    terminated_at: float | None  # when the tree was signalled to terminate, if it was
    hold_until: float  # min-hold: keep the (renewed) lock until then
    timeout_at: float | None = None  # the job's timeout passes then (None: it has none)


@dataclass(frozen=True)
class Decision:
    action: Action
    verdict: Outcome | None  # the run's outcome as far as it is settled
    wake_at: float | None = None  # KEEP_GOING: look again at this time at the latest
    signum: int | None = None  # TERMINATE / KILL: the signal to send
    reason: Reason | None = None


def decide(facts: Facts, bounds: FenceBounds) -> Decision:
    """What to do next, given the facts: the whole fencing policy."""
    verdict = facts.verdict or _judge(facts, bounds)
    if facts.tree_alive:
        return _contain(facts, bounds, verdict)
    if verdict is Outcome.LOST:
        return Decision(Action.REPORT_LOST, verdict)
    if verdict is Outcome.RAN and _still_holding(facts):
        return Decision(Action.KEEP_GOING, verdict, wake_at=facts.hold_until, reason=Reason.HOLDING)
    return Decision(Action.RELEASE, verdict)


def _judge(facts: Facts, bounds: FenceBounds) -> Outcome | None:
    """The verdict, once the facts settle it; None while the job runs unchallenged."""
    confirmed_in_time = facts.now < facts.confirmed_at + bounds.fence_after
    if facts.job_exited or not facts.tree_alive:
        # It ended; its work counts only if the lock was still ours when we saw it end (a
        # runner paused past the bound cannot vouch for the job's last moments).
        return Outcome.RAN if confirmed_in_time and not facts.lost else Outcome.LOST
    if facts.lost or not confirmed_in_time:
        return Outcome.LOST
    if facts.stop_signal is not None:
        return Outcome.INTERRUPTED
    if facts.timeout_at is not None and facts.now >= facts.timeout_at:
        return Outcome.TIMED_OUT  # the lock is still ours: stopped as fenced, then released
    return None


def _contain(facts: Facts, bounds: FenceBounds, verdict: Outcome | None) -> Decision:
    """Some process of the job is alive: let it run, or end it within the bounds."""
    kill_at = facts.confirmed_at + bounds.kill_after
    if facts.now >= kill_at:
        return Decision(Action.KILL, verdict, signum=signal.SIGKILL, reason=Reason.DEADLINE)
    if verdict is None:
        wake_at = facts.confirmed_at + bounds.fence_after
        if facts.timeout_at is not None:
            wake_at = min(wake_at, facts.timeout_at)
        return Decision(Action.KEEP_GOING, None, wake_at=wake_at)
    if facts.terminated_at is None:
        reason, signum = _why_terminate(facts, verdict)
        return Decision(Action.TERMINATE, verdict, signum=signum, reason=reason)
    grace_over_at = facts.terminated_at + bounds.kill_grace
    if facts.now >= grace_over_at:
        return Decision(Action.KILL, verdict, signum=signal.SIGKILL, reason=Reason.GRACE_OVER)
    return Decision(Action.KEEP_GOING, verdict, wake_at=min(grace_over_at, kill_at))


def _why_terminate(facts: Facts, verdict: Outcome) -> tuple[Reason, int]:
    if verdict is Outcome.LOST:
        return (Reason.LOST if facts.lost else Reason.UNCONFIRMED), signal.SIGTERM
    if verdict is Outcome.INTERRUPTED and not facts.job_exited:
        return Reason.STOP, facts.stop_signal or signal.SIGTERM  # forward what we were sent
    if verdict is Outcome.TIMED_OUT and not facts.job_exited:
        return Reason.TIMEOUT, signal.SIGTERM
    return Reason.LEFTOVERS, signal.SIGTERM


def _still_holding(facts: Facts) -> bool:
    """min-hold keeps the lock after the job until hold_until, unless told to stop or lost."""
    return facts.now < facts.hold_until and facts.stop_signal is None and not facts.lost
