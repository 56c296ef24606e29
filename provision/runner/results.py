"""What a run was asked (RunOptions) and how it ended (RunResult): light, so the CLI's cheap
skip (runner/precheck.py) reports a result without loading the engine."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from provision.runner.fencing import Outcome


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
