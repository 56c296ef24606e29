"""Where lockctl keeps the operators' control keys of each job in Consul (pause, trigger,
abort): one naming rule for every layer (the spec refuses prefixes over it, the renderer grants
read on it, the runner checks it in each claim, the operator's commands write it).

They live under one root outside every job's prefix: a job's workers may write all of their own
prefix, and may only read these (the rendered lock policy), so a worker cannot pause, resume or
trigger a job.
"""

from __future__ import annotations

CONTROL_ROOT = "lockctl/control/"
PAUSED = "paused"  # the key's name in the job's folder
TRIGGER = "trigger"
PAUSES = "pauses"  # the pauses resumed, newest first: which ticks they held
BACKFILL = "backfill"  # an operator's backfill: past ticks to run once each


def control_prefix(job: str) -> str:
    """The folder of job `job`'s control keys: `lockctl/control/<job>/` (its workers read it)."""
    return f"{CONTROL_ROOT}{job}/"


def paused_key(job: str) -> str:
    """The key whose existence pauses job `job`: every claim checks it is absent."""
    return f"{control_prefix(job)}{PAUSED}"


def trigger_key(job: str) -> str:
    """The key an operator's pending `lockctl trigger` waits in, until a replica takes it."""
    return f"{control_prefix(job)}{TRIGGER}"


def pauses_key(job: str) -> str:
    """The key `lockctl resume` keeps the job's last pauses in (who, from when, until when), so
    that a tick nobody ran while the job was paused is recorded paused, even when it is noticed
    after the resume (every replica was down meanwhile)."""
    return f"{control_prefix(job)}{PAUSES}"


def backfill_key(job: str) -> str:
    """The key an operator's `lockctl backfill` writes its ticks to, for the schedulers to run
    (provision/ledger/backfill.py)."""
    return f"{control_prefix(job)}{BACKFILL}"


ABORT = "abort"  # `lockctl abort`: the run it names is stopped by the replica running it


def abort_key(job: str) -> str:
    """The key `lockctl abort` writes: which run of the job to stop (its tick), who, why."""
    return f"{control_prefix(job)}{ABORT}"
