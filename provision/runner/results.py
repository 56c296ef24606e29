"""What a run was asked (RunOptions) and how it ended (RunResult): light, so the CLI's cheap
skip (runner/precheck.py) reports a result without loading the engine."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from provision.fencing import Outcome


@dataclass(frozen=True)
class RunOptions:
    wait: bool = False
    timeout: float | None = None  # with --wait: give up after this many seconds
    min_hold: float | None = None  # overrides the job's configured min_hold


class SkipReason(str, enum.Enum):
    """Why a run skipped its tick, in a word: decided where the skip is (runner/tick_lock.py,
    scheduler/loop.py), never read back from the reason's text (it can quote anyone's record).
    The values are the `reason` label of `lockctl_skips_total` (scheduler/exposition.py)."""

    TAKEN = "taken"  # the tick has a record: another runner has (or had) it
    OVERLAP = "overlap"  # the job's previous tick still runs (here, or holding the lock)
    LOCK_DELAY = "lock-delay"  # the lock's last holder's session ended: Consul's lock-delay
    PAUSED = "paused"  # the job is paused (lockctl pause): its tick is recorded paused
    OTHER = "other"  # held by something else, or the tick has not come on Consul's clock


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
