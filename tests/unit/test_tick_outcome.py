"""A tick record's outcome from how the engine ended the run (runner/tick_lock.py), by table."""

from __future__ import annotations

import pytest

from provision.fencing import Outcome
from provision.ledger.records import TickOutcome
from provision.runner.lock import Ending
from provision.runner.tick_verdicts import tick_outcome


@pytest.mark.parametrize(
    ("verdict", "status", "release", "expected"),
    [
        (Outcome.RAN, 0, True, TickOutcome.SUCCEEDED),
        (Outcome.RAN, 3, True, TickOutcome.FAILED),
        (Outcome.RAN, 143, True, TickOutcome.FAILED),  # ended by a signal of its own
        (Outcome.LOST, 137, False, TickOutcome.LOST),
        (Outcome.RAN, 0, False, TickOutcome.LOST),  # not released: the lock was not ours
        (Outcome.INTERRUPTED, 143, True, TickOutcome.INTERRUPTED),
        (Outcome.JOB_TIMED_OUT, 143, True, TickOutcome.TIMED_OUT),  # it obeyed SIGTERM
        (Outcome.JOB_TIMED_OUT, 137, True, TickOutcome.TIMED_OUT),  # SIGKILL after the grace
        (Outcome.JOB_TIMED_OUT, 0, True, TickOutcome.TIMED_OUT),  # exit 0 on SIGTERM: still cut
        (Outcome.JOB_TIMED_OUT, 137, False, TickOutcome.LOST),  # lost while being stopped
    ],
)
def test_tick_outcome(verdict: Outcome, status: int, release: bool, expected: TickOutcome) -> None:
    assert tick_outcome(Ending(verdict.value, status, 2.0), release) is expected
