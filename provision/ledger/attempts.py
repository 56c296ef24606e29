"""A tick's attempts as its record keeps them (tick/retries.py decides them): the exit status
of each, and why retries the job still had were cut, in words history shows."""

from __future__ import annotations

from typing import Any

CUT_BY_NEXT_TICK = "next-tick"  # the next attempt would have started at or after the next tick
CUT_BY_STOP = "stop-requested"  # the runner was asked to stop during the retry delay
CUT_BY_ABORT = "aborted"  # an operator's `lockctl abort` during the retry delay
CUT_REASONS = {
    CUT_BY_NEXT_TICK: "the next tick",
    CUT_BY_STOP: "a stop request",
    CUT_BY_ABORT: "lockctl abort",
}
MAX_ATTEMPTS = 11  # retries are 0..10 (provision.timings): a record keeps no more statuses
_ORDINALS = {1: "1st", 2: "2nd", 3: "3rd"}


def attempts_text(
    outcome: str,
    attempts: tuple[int | None, ...] | None,
    cut: str | None,
    catchup: bool | None = None,
) -> str:
    """How history shows a tick's outcome with its attempts: `succeeded (2nd attempt)`,
    `failed (3 attempts)`, `failed (1 attempt, retries cut by the next tick)`; the outcome alone
    for a single attempt with nothing cut. A catch-up (ledger/catchup.py) says so first:
    `succeeded (catch-up)`, `succeeded (catch-up, 2nd attempt)`."""
    count = len(attempts or ()) or 1
    if count == 1 and cut is None:
        return f"{outcome} (catch-up)" if catchup else outcome
    if catchup:
        return attempts_text(outcome, attempts, cut).replace(" (", " (catch-up, ", 1)
    if outcome == "succeeded":
        said = f"{_ORDINALS.get(count, f'{count}th')} attempt"
    else:
        said = f"{count} attempt{'' if count == 1 else 's'}"
    if cut in CUT_REASONS:
        said += f", retries cut by {CUT_REASONS[cut]}"
    return f"{outcome} ({said})"


def decode_attempts(value: Any) -> tuple[int | None, ...] | None:
    """A record's `attempts`: a list of exit statuses (null: no status), the writer's word, so
    bounded; None when absent or not such a list."""
    if not isinstance(value, list) or not 0 < len(value) <= MAX_ATTEMPTS:
        return None
    if not all(v is None or (type(v) is int and -(2**31) <= v < 2**31) for v in value):
        return None
    return tuple(value)


def decode_cut(value: Any) -> str | None:
    """A record's `retries_cut`: one of lockctl's own words, or None."""
    return value if isinstance(value, str) and value in CUT_REASONS else None
