"""How often a job loop does the ledger work beyond a tick's claim and completion: pure rules
(table-tested in tests/unit/test_scheduler_cadence.py, no Consul, no clock of its own).

A per-tick `lockctl run` knows nothing of the ledger, so at every tick it reads the tick's
record before claiming (the cheap skip, and the agent's clock in the answer's Date) and, after
running it, every record's name (ticks nobody ran are recorded missed; retention). A job loop
ran its previous ticks itself, so it does both less often, and no promise changes:

  the read before the claim   whether the tick is taken, the claim's own transaction says
                              (check-not-exists); the read is kept for the clocks: at the
                              loop's first tick, at every tick while they disagreed at the last
                              read (the agent's clock not at the tick yet), after a step of
                              either clock (scheduler/service.py), and
                              otherwise once every CLOCK_CHECK_EVERY
  housekeeping                only by the replica that ran the tick (the engine's rule), once
                              every HOUSEKEEP_EVERY, the first time at a point of the loop's
                              first HOUSEKEEP_EVERY its job's name places (`starting`: 300 jobs
                              started together do not all housekeep at their first tick); and,
                              whatever the cadence, after a run whose claim found the
                              schedule's previous tick without a record (the engine's rule
                              again: the claim's transaction reads that record, at no cost):
                              nobody ran it (Consul was unreachable, an overlap, a takeover), so
                              a missed tick is recorded at once; and at the next run again when
                              that housekeeping failed or found a tick unrecorded whose window
                              was still open. A tick another replica ran costs no housekeeping
                              here: when ticks spread over the replicas, that is most of them.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace

CLOCK_CHECK_EVERY = 300.0  # seconds between two comparisons of the clocks while they agree
HOUSEKEEP_EVERY = 60.0  # seconds between two housekeepings while this loop runs every tick
SLACK = 1.0  # a minute schedule's runs are 60 s apart give or take a claim: still due


@dataclass(frozen=True)
class TickWork:
    """What a tick's run does besides the claim and the completion."""

    read_first: bool  # read the tick's record and the agent's clock before claiming
    housekeep: bool  # after a run that claimed the tick: missed ticks, retention


@dataclass(frozen=True)
class Cadence:
    """What a job loop knows of its own ledger work (monotonic seconds)."""

    clocks_read_at: float | None = None  # the last read that compared the two clocks
    clocks_agree: bool = False  # that read found no skew and no wait for the agent's clock
    housekept_at: float | None = None


def starting(now: float, job_name: str) -> Cadence:
    """A new loop's cadence: as if it had housekept up to HOUSEKEEP_EVERY ago, by a fraction
    of it that the job's name fixes (the same on every replica and at every start)."""
    phase = zlib.crc32(job_name.encode()) / 2**32  # in [0, 1)
    return Cadence(housekept_at=now - phase * HOUSEKEEP_EVERY)


def tick_work(cadence: Cadence, now: float) -> TickWork:
    """The work of the run of a tick at `now`."""
    read = (
        cadence.clocks_read_at is None
        or not cadence.clocks_agree
        or now - cadence.clocks_read_at >= CLOCK_CHECK_EVERY - SLACK
    )
    housekeep = (
        cadence.housekept_at is None or now - cadence.housekept_at >= HOUSEKEEP_EVERY - SLACK
    )
    return TickWork(read, housekeep)


def distrust_clocks(cadence: Cadence) -> Cadence:
    """A clock stepped: the next run reads the agent's clock before its claim."""
    return replace(cadence, clocks_agree=False)


def after_read(cadence: Cadence, now: float, *, clocks_agree: bool) -> Cadence:
    return replace(cadence, clocks_read_at=now, clocks_agree=clocks_agree)


def after_run(
    cadence: Cadence, now: float, work: TickWork, *, claimed: bool, again: bool = False
) -> Cadence:
    """A run that claimed its tick ran it here (and housekept, when asked); else nothing.
    `again`: its housekeeping said the next run should housekeep too (it failed, or a tick it
    could not call missed yet has no record)."""
    if not claimed:
        return cadence
    if again:
        return replace(cadence, housekept_at=None)
    return replace(cadence, housekept_at=now) if work.housekeep else cadence
