"""How a run ended (`Outcome`), in a word: the fencing decision's verdicts (fencing.py), and what
`lockctl run`'s cheap skip reports without loading the decision's rules."""

from __future__ import annotations

import enum


class Outcome(str, enum.Enum):
    """How a run ended."""

    RAN = "ran"  # the job ran and ended while the lock was ours
    SKIPPED = "skipped"  # another session held the lock: this tick is not ours
    TIMED_OUT = "timed-out"  # --wait gave up
    LOST = "lost"  # the lock was lost (or could not be confirmed) while the job ran: fenced
    INTERRUPTED = "interrupted"  # a stop was requested (a signal to the runner)
    MISSED = "missed"  # a scheduled tick this run came too late for (its start deadline passed)
    # the job ran past its `timeout` and was stopped (not `timed-out`: that is --wait's)
    JOB_TIMED_OUT = "job-timed-out"
