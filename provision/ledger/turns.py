"""Whose turn it is to claim a tick, and when: pure functions of (job, tick, workers), which every
replica computes alike without talking to the others (table-tested in tests/unit/test_turns.py).

    jitter     the tick's planned start: tick + an offset in [0, jitter) drawn from a hash of
               (job, tick), the same on every replica, so jobs on `* * * * *` do not all reach
               Consul at :00; at most half the tick's claim window, so a late turn still fits
    order      the job's workers ranked by a rendezvous hash of (job, tick, worker): the ticks
               spread over the replicas, and a worker's rank changes from tick to tick
    turn       the worker of rank r claims at the planned start + r x CLAIM_STAGGER, after a
               read of the tick's record (no Raft write): only while it is still unclaimed

A claim that loses costs Consul one Raft entry (the transaction is refused after its commit), a
read none: so the first-ranked worker claims, and the others read first and find it taken. A
dead first choice costs the next one CLAIM_STAGGER of start lag, never the tick. None of this is
what keeps a tick to one run: the claim's transaction is the arbiter, whatever the clocks and
the ranks say (provision/ledger/store.py).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

# Seconds between two ranks' turns: timers on different hosts fire up to a second apart, so the
# first-ranked worker's claim is in before the second looks.
CLAIM_STAGGER = 1.0
_SCALE = float(1 << 64)


def _fraction(*parts: str) -> float:
    """A number in [0, 1) from a hash of `parts`: the same on every host and Python."""
    digest = hashlib.sha256("\0".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / _SCALE


def _instant(tick: datetime) -> str:
    return f"{tick.timestamp():.0f}"  # whole seconds since the epoch: the tick, zone-free


def jitter_offset(job: str, tick: datetime, jitter: float, window: float) -> float:
    """Seconds after `tick` its run is planned to start: in [0, min(jitter, window / 2))."""
    spread = min(jitter, window / 2)
    if spread <= 0:
        return 0.0
    return round(_fraction("jitter", job, _instant(tick)) * spread, 3)


def claim_order(job: str, tick: datetime, workers: Iterable[str]) -> tuple[str, ...]:
    """The job's workers in the order they may claim `tick` (rendezvous hashing: removing a
    worker moves only the ticks it was first for)."""
    return _order(job, _instant(tick), tuple(sorted(set(workers))))


@functools.lru_cache(maxsize=4096)  # a scheduler asks twice per tick: when to wait, and the run
def _order(job: str, instant: str, workers: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(sorted(workers, key=lambda w: _fraction("turn", job, instant, w)))


@dataclass(frozen=True)
class Turn:
    """When one worker may claim one tick, and whether it reads the record first."""

    rank: int  # 0: the first choice
    delay: float  # seconds after the tick: the planned start plus the rank's stagger
    planned: float  # seconds after the tick: the planned start (jitter), the same for all

    @property
    def reads_first(self) -> bool:
        """Every worker after the first looks before it claims: a claim that loses is a
        Raft write, a read is not."""
        return self.rank > 0


def turn(
    job: str, tick: datetime, worker: str, workers: Iterable[str], jitter: float, window: float
) -> Turn:
    """`worker`'s turn at `tick`. A worker the job does not list (an older worker config that
    names no workers) goes first: it cannot know the order, and the claim still arbitrates."""
    order = claim_order(job, tick, workers)
    rank = order.index(worker) if worker in order else 0
    planned = jitter_offset(job, tick, jitter, window)
    return Turn(rank, planned + rank * CLAIM_STAGGER, planned)
