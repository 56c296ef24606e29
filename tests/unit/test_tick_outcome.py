"""A tick record's outcome from how its held run ended (tick/held.py record_outcome), by table."""

from __future__ import annotations

import pytest

from provision.ledger.records import TickOutcome
from provision.outcomes import Outcome
from provision.tick.held import record_outcome


@pytest.mark.parametrize(
    ("verdict", "status", "kept", "expected"),
    [
        (Outcome.RAN, 0, True, TickOutcome.SUCCEEDED),
        (Outcome.RAN, 3, True, TickOutcome.FAILED),
        (Outcome.RAN, 143, True, TickOutcome.FAILED),  # ended by a signal of its own
        (Outcome.LOST, 137, False, TickOutcome.LOST),
        (Outcome.LOST, 0, True, TickOutcome.LOST),  # fenced, though the job ended well
        (Outcome.RAN, 0, False, TickOutcome.LOST),  # not released: the lock was not ours
        (None, None, True, TickOutcome.LOST),  # no verdict: nothing says the lock was kept
        (Outcome.INTERRUPTED, 143, True, TickOutcome.INTERRUPTED),
        (Outcome.TIMED_OUT, 143, True, TickOutcome.TIMED_OUT),  # it obeyed SIGTERM
        (Outcome.TIMED_OUT, 137, True, TickOutcome.TIMED_OUT),  # SIGKILL after the grace
        (Outcome.TIMED_OUT, 0, True, TickOutcome.TIMED_OUT),  # exit 0 on SIGTERM: still cut
        (Outcome.TIMED_OUT, 137, False, TickOutcome.LOST),  # lost while being stopped
    ],
)
def test_record_outcome(
    verdict: Outcome | None, status: int | None, kept: bool, expected: TickOutcome
) -> None:
    assert record_outcome(verdict, status, kept) is expected
