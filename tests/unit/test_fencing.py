"""The fencing decision, table-tested with a fake clock over every path: no Consul, no processes.

Default timings unless a row says otherwise: TTL 15 s, LockDelay D = 15 s, renew R = 5 s, kill
grace G = 5 s, renew timeout 2.5 s. So SIGTERM at D - G - 1 = 9 s and SIGKILL at D - 1 = 14 s,
both counted from the SEND time of the last confirmation.
"""

from __future__ import annotations

import dataclasses
import signal

import pytest

from provision.fencing import (
    Action,
    Decision,
    Facts,
    FenceBounds,
    Outcome,
    Reason,
    decide,
    fence_bounds,
)
from provision.timings import JobTimings

TIMINGS = JobTimings(ttl=15.0, lock_delay=15.0, renew_interval=5.0, kill_grace=5.0, min_hold=0.0)
BOUNDS = fence_bounds(TIMINGS, renew_timeout=2.5)
T0 = 1000.0  # the send time of the last confirmation in most rows
RUNNING = Facts(
    now=T0,
    confirmed_at=T0,
    lost=False,
    job_exited=False,
    tree_alive=True,
    stop_signal=None,
    verdict=None,
    terminated_at=None,
    hold_until=T0,
)


def facts(**changes: object) -> Facts:
    return dataclasses.replace(RUNNING, **changes)  # type: ignore[arg-type]


def ended(**changes: object) -> Facts:
    """The job and everything it started are gone."""
    return facts(job_exited=True, tree_alive=False, **changes)


def test_default_bounds_are_d_minus_g_minus_1_and_d_minus_1() -> None:
    assert FenceBounds(fence_after=9.0, kill_after=14.0, kill_grace=5.0) == BOUNDS


def test_sigterm_is_never_before_a_slow_healthy_renewal_could_confirm() -> None:
    # R 8 s, timeout 4 s: a renewal sent at 8 s may confirm as late as 12 s, after D - G - 1 = 9 s
    slow = dataclasses.replace(TIMINGS, ttl=30.0, renew_interval=8.0)
    bounds = fence_bounds(slow, renew_timeout=4.0)
    assert bounds.fence_after == 12.5 and bounds.kill_after == 14.0


SIGTERM, SIGKILL, SIGINT = signal.SIGTERM, signal.SIGKILL, signal.SIGINT


@pytest.mark.parametrize(
    ("row", "given", "expected"),
    [
        # --- running, lock healthy -------------------------------------------------------
        ("fresh confirmation", facts(), Decision(Action.KEEP_GOING, None, wake_at=T0 + 9)),
        ("just before SIGTERM", facts(now=T0 + 8.999), Decision(Action.KEEP_GOING, None, T0 + 9)),
        # --- a renewal hangs: nothing confirms after T0 ----------------------------------
        (
            "SIGTERM at D-G-1 from the send time",
            facts(now=T0 + 9),
            Decision(Action.TERMINATE, Outcome.LOST, signum=SIGTERM, reason=Reason.UNCONFIRMED),
        ),
        (
            "after SIGTERM, wait for the grace",
            facts(now=T0 + 10, verdict=Outcome.LOST, terminated_at=T0 + 9),
            Decision(Action.KEEP_GOING, Outcome.LOST, wake_at=T0 + 14),
        ),
        (
            "SIGKILL at D-1 from the send time",
            facts(now=T0 + 14, verdict=Outcome.LOST, terminated_at=T0 + 9),
            Decision(Action.KILL, Outcome.LOST, signum=SIGKILL, reason=Reason.DEADLINE),
        ),
        (
            "the tree is dead: report lost, no release",
            facts(now=T0 + 11, verdict=Outcome.LOST, terminated_at=T0 + 9, tree_alive=False),
            Decision(Action.REPORT_LOST, Outcome.LOST),
        ),
        # --- Consul says the lock is gone --------------------------------------------------
        (
            "a lost key fences at once",
            facts(now=T0 + 0.1, lost=True),
            Decision(Action.TERMINATE, Outcome.LOST, signum=SIGTERM, reason=Reason.LOST),
        ),
        (
            "lost beats a stop request",
            facts(now=T0 + 0.1, lost=True, stop_signal=SIGTERM),
            Decision(Action.TERMINATE, Outcome.LOST, signum=SIGTERM, reason=Reason.LOST),
        ),
        (
            "a TERM-ignoring job gets SIGKILL after the grace",
            facts(now=T0 + 5.1, lost=True, verdict=Outcome.LOST, terminated_at=T0 + 0.1),
            Decision(Action.KILL, Outcome.LOST, signum=SIGKILL, reason=Reason.GRACE_OVER),
        ),
        # --- the runner was paused (SIGSTOP, a VM frozen) ----------------------------------
        (
            "wakes past the kill bound, job alive: SIGKILL at once, no grace",
            facts(now=T0 + 40),
            Decision(Action.KILL, Outcome.LOST, signum=SIGKILL, reason=Reason.DEADLINE),
        ),
        (
            "wakes past the bound, job already ended: its result is not trusted",
            ended(now=T0 + 40),
            Decision(Action.REPORT_LOST, Outcome.LOST),
        ),
        # --- the job ends -------------------------------------------------------------------
        (
            "ended in time: release",
            ended(now=T0 + 3),
            Decision(Action.RELEASE, Outcome.RAN),
        ),
        (
            "ended after the lock was lost: lost",
            ended(now=T0 + 3, lost=True),
            Decision(Action.REPORT_LOST, Outcome.LOST),
        ),
        (
            "ended, leftovers alive: SIGTERM them, the verdict is RAN",
            facts(now=T0 + 3, job_exited=True),
            Decision(Action.TERMINATE, Outcome.RAN, signum=SIGTERM, reason=Reason.LEFTOVERS),
        ),
        (
            "leftovers ignore SIGTERM: SIGKILL after the grace",
            facts(now=T0 + 8, job_exited=True, verdict=Outcome.RAN, terminated_at=T0 + 3),
            Decision(Action.KILL, Outcome.RAN, signum=SIGKILL, reason=Reason.GRACE_OVER),
        ),
        (
            "leftovers never outlive the kill bound, even within their grace",
            facts(now=T0 + 14, job_exited=True, verdict=Outcome.RAN, terminated_at=T0 + 12),
            Decision(Action.KILL, Outcome.RAN, signum=SIGKILL, reason=Reason.DEADLINE),
        ),
        # --- min-hold --------------------------------------------------------------------------
        (
            "ended before min-hold: keep holding",
            ended(now=T0 + 3, hold_until=T0 + 30),
            Decision(Action.KEEP_GOING, Outcome.RAN, wake_at=T0 + 30, reason=Reason.HOLDING),
        ),
        (
            "holding, renewals keep confirming: still holding",
            ended(now=T0 + 20, confirmed_at=T0 + 18, verdict=Outcome.RAN, hold_until=T0 + 30),
            Decision(Action.KEEP_GOING, Outcome.RAN, wake_at=T0 + 30, reason=Reason.HOLDING),
        ),
        (
            "a stop ends min-hold early",
            ended(now=T0 + 5, verdict=Outcome.RAN, hold_until=T0 + 30, stop_signal=SIGTERM),
            Decision(Action.RELEASE, Outcome.RAN),
        ),
        (
            "a lost lock ends min-hold",
            ended(now=T0 + 5, verdict=Outcome.RAN, hold_until=T0 + 30, lost=True),
            Decision(Action.RELEASE, Outcome.RAN),
        ),
        # --- a stop request while the job runs -------------------------------------------------
        (
            "SIGTERM to the runner is forwarded",
            facts(now=T0 + 1, stop_signal=SIGTERM),
            Decision(Action.TERMINATE, Outcome.INTERRUPTED, signum=SIGTERM, reason=Reason.STOP),
        ),
        (
            "SIGINT to the runner is forwarded as SIGINT",
            facts(now=T0 + 1, stop_signal=SIGINT),
            Decision(Action.TERMINATE, Outcome.INTERRUPTED, signum=SIGINT, reason=Reason.STOP),
        ),
        (
            "stopped job that ignores it: SIGKILL after the grace",
            facts(
                now=T0 + 6,
                confirmed_at=T0 + 5,
                stop_signal=SIGTERM,
                verdict=Outcome.INTERRUPTED,
                terminated_at=T0 + 1,
            ),
            Decision(Action.KILL, Outcome.INTERRUPTED, signum=SIGKILL, reason=Reason.GRACE_OVER),
        ),
        (
            "stopped job ended: release, the verdict stays interrupted",
            ended(
                now=T0 + 2, stop_signal=SIGTERM, verdict=Outcome.INTERRUPTED, terminated_at=T0 + 1
            ),
            Decision(Action.RELEASE, Outcome.INTERRUPTED),
        ),
        (
            "a stop that arrives once the job has ended changes no verdict (cleanup)",
            ended(now=T0 + 2, stop_signal=SIGTERM),
            Decision(Action.RELEASE, Outcome.RAN),
        ),
        (
            "a stop during the leftovers' grace changes no verdict",
            facts(
                now=T0 + 4,
                job_exited=True,
                verdict=Outcome.RAN,
                terminated_at=T0 + 3,
                stop_signal=SIGTERM,
            ),
            Decision(Action.KEEP_GOING, Outcome.RAN, wake_at=T0 + 8),
        ),
        # --- the job's timeout (T0 + 3 in these rows), the lock healthy ------------------
        (
            "a timeout before the fence bound: wake at the timeout",
            facts(timeout_at=T0 + 3),
            Decision(Action.KEEP_GOING, None, wake_at=T0 + 3),
        ),
        (
            "a timeout after the fence bound: wake at the bound",
            facts(timeout_at=T0 + 20),
            Decision(Action.KEEP_GOING, None, wake_at=T0 + 9),
        ),
        (
            "the timeout passes: SIGTERM the tree, verdict timed-out",
            facts(now=T0 + 3, timeout_at=T0 + 3),
            Decision(Action.TERMINATE, Outcome.TIMED_OUT, signum=SIGTERM, reason=Reason.TIMEOUT),
        ),
        (
            "timed out, in the kill grace: wake when it is over",
            facts(now=T0 + 4, verdict=Outcome.TIMED_OUT, terminated_at=T0 + 3, timeout_at=T0 + 3),
            Decision(Action.KEEP_GOING, Outcome.TIMED_OUT, wake_at=T0 + 8),
        ),
        (
            "timed out, the job ignores SIGTERM: SIGKILL after the kill grace",
            facts(
                now=T0 + 8,
                confirmed_at=T0 + 5,
                verdict=Outcome.TIMED_OUT,
                terminated_at=T0 + 3,
                timeout_at=T0 + 3,
            ),
            Decision(Action.KILL, Outcome.TIMED_OUT, signum=SIGKILL, reason=Reason.GRACE_OVER),
        ),
        (
            "timed out, the tree is gone: release at once (min-hold is for a run that ran)",
            ended(
                now=T0 + 4,
                verdict=Outcome.TIMED_OUT,
                terminated_at=T0 + 3,
                timeout_at=T0 + 3,
                hold_until=T0 + 60,
            ),
            Decision(Action.RELEASE, Outcome.TIMED_OUT),
        ),
        (
            "a lost lock beats the timeout",
            facts(now=T0 + 3, timeout_at=T0 + 3, lost=True),
            Decision(Action.TERMINATE, Outcome.LOST, signum=SIGTERM, reason=Reason.LOST),
        ),
        (
            "a stop beats the timeout (its signal is forwarded)",
            facts(now=T0 + 3, timeout_at=T0 + 3, stop_signal=SIGINT),
            Decision(Action.TERMINATE, Outcome.INTERRUPTED, signum=SIGINT, reason=Reason.STOP),
        ),
        (
            "the job ended before the timeout was seen: it ran",
            ended(now=T0 + 3, timeout_at=T0 + 3),
            Decision(Action.RELEASE, Outcome.RAN),
        ),
        (
            "the main process ended, its leftovers run past the timeout: it ran, stop them",
            facts(now=T0 + 3, timeout_at=T0 + 2, job_exited=True),
            Decision(Action.TERMINATE, Outcome.RAN, signum=SIGTERM, reason=Reason.LEFTOVERS),
        ),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_decide(row: str, given: Facts, expected: Decision) -> None:
    assert decide(given, BOUNDS) == expected


def _run_with_renewals(
    confirmations: list[float], until: float, step: float = 0.05, timeout_at: float | None = None
) -> list[tuple[float, Decision]]:
    """Step a fake clock; the job runs throughout; returns every non-keep-going decision."""
    acted = []
    verdict, terminated_at = None, None
    now = T0
    while now < until:
        confirmed = max(c for c in confirmations if c <= now)
        decision = decide(
            facts(
                now=now,
                confirmed_at=confirmed,
                verdict=verdict,
                terminated_at=terminated_at,
                timeout_at=timeout_at,
            ),
            BOUNDS,
        )
        verdict = decision.verdict
        if decision.action is Action.TERMINATE:
            terminated_at = now
        if decision.action is not Action.KEEP_GOING:
            acted.append((now, decision))
        now = round(now + step, 6)
    return acted


def test_healthy_renewals_never_fence_a_long_job() -> None:
    # a renewal every R = 5 s, each sent at its time (the answer may come late: it counts from
    # the send time); one hour of job
    renewals = [T0 + 5 * n for n in range(0, 721)]
    assert _run_with_renewals(renewals, until=T0 + 3600, step=0.25) == []


def test_renewals_that_stop_fence_then_kill_counted_from_the_last_send() -> None:
    renewals = [T0, T0 + 5, T0 + 10]  # then the renew call hangs
    acted = _run_with_renewals(renewals, until=T0 + 30)
    assert [(round(t - T0, 2), d.action, d.reason) for t, d in acted[:2]] == [
        (19.0, Action.TERMINATE, Reason.UNCONFIRMED),  # 10 + 9
        (24.0, Action.KILL, Reason.DEADLINE),  # 10 + 14
    ]


def test_a_timeout_under_healthy_renewals_terms_then_kills_after_the_grace() -> None:
    renewals = [T0 + 5 * n for n in range(0, 13)]  # healthy throughout
    acted = _run_with_renewals(renewals, until=T0 + 60, timeout_at=T0 + 30)
    assert [(round(t - T0, 2), d.action, d.verdict, d.reason) for t, d in acted[:2]] == [
        (30.0, Action.TERMINATE, Outcome.TIMED_OUT, Reason.TIMEOUT),
        (35.0, Action.KILL, Outcome.TIMED_OUT, Reason.GRACE_OVER),  # 30 + G
    ]
