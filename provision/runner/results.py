"""What a run was asked (RunOptions) and how it ended (RunResult): light, so the CLI's cheap
skip (runner/precheck.py) reports a result without loading the engine."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from provision.outcomes import Outcome
from provision.tick.edge import SkipReason

__all__ = ["RunOptions", "RunResult", "SkipReason"]


@dataclass(frozen=True)
class RunOptions:
    wait: bool = False
    timeout: float | None = None  # with --wait: give up after this many seconds
    min_hold: float | None = None  # overrides the job's configured min_hold


@dataclass(frozen=True)
class RunResult:
    outcome: Outcome
    exit_code: int
    lock_index: int | None = None
    tick: datetime | None = None  # the scheduled tick this run was for
    duration: float | None = None  # seconds the job ran (None: it did not start)
    skip: SkipReason | None = None  # why, when the outcome is SKIPPED (None: not said)
    # seconds from the tick's instant to its claim, as the tick's record says (None: no job
    # of a tick started)
    start_lag: float | None = None
    # the housekeeping after this run failed, or left a tick unrecorded that is not missed yet:
    # the next run should housekeep (a scheduler's cadence would otherwise wait a minute)
    housekeep_again: bool = False
    attempts: int = 1  # how many times the job was started for this run (tick/retries.py)
    retries_cut: str | None = None  # why retries it still had were not made (ledger/attempts)
