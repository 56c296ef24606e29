"""Whose turn it is to claim a tick (provision/ledger/turns.py): pure, no Consul, no clock."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest

from provision.ledger.turns import CLAIM_STAGGER, claim_order, jitter_offset, turn

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
WORKERS = ("worker-1", "worker-2", "worker-3")


def ticks(n: int, every: float = 10.0) -> list[datetime]:
    return [T0 + timedelta(seconds=every * i) for i in range(n)]


def test_every_replica_computes_the_same_order_whatever_order_it_lists_the_workers_in() -> None:
    for tick in ticks(50):
        orders = {
            claim_order("job", tick, WORKERS),
            claim_order("job", tick, reversed(WORKERS)),
            claim_order("job", tick, [*WORKERS, "worker-1"]),  # a duplicate changes nothing
        }
        assert len(orders) == 1
        assert sorted(orders.pop()) == list(WORKERS)


def test_the_same_instant_in_another_zone_is_the_same_tick() -> None:
    berlin = timezone(timedelta(hours=1))
    assert claim_order("job", T0, WORKERS) == claim_order("job", T0.astimezone(berlin), WORKERS)
    assert jitter_offset("job", T0, 30, 60) == jitter_offset("job", T0.astimezone(berlin), 30, 60)


def test_ticks_spread_over_the_workers_instead_of_going_to_one() -> None:
    firsts = Counter(claim_order("job", tick, WORKERS)[0] for tick in ticks(3000))
    assert set(firsts) == set(WORKERS)
    assert all(800 < count < 1200 for count in firsts.values()), firsts


def test_jobs_at_the_same_tick_spread_too() -> None:
    firsts = Counter(claim_order(f"job-{n}", T0, WORKERS)[0] for n in range(3000))
    assert all(800 < count < 1200 for count in firsts.values()), firsts


def test_removing_a_worker_moves_only_the_ticks_it_was_first_for() -> None:
    """Rendezvous hashing: the others keep their relative order."""
    for tick in ticks(200):
        full = claim_order("job", tick, WORKERS)
        without = claim_order("job", tick, [w for w in WORKERS if w != "worker-2"])
        assert without == tuple(w for w in full if w != "worker-2")


@pytest.mark.parametrize(
    ("jitter", "window", "high"),
    [
        (0.0, 60.0, 0.0),  # no jitter: the tick's instant
        (30.0, 60.0, 30.0),
        (30.0, 10.0, 5.0),  # at most half the claim window: a late turn still fits
        (3600.0, 300.0, 150.0),
    ],
)
def test_the_jitter_offset_lies_in_its_range_and_fills_it(
    jitter: float, window: float, high: float
) -> None:
    offsets = [jitter_offset(f"job-{n}", T0, jitter, window) for n in range(500)]
    assert all(0 <= offset <= high for offset in offsets)
    if high:
        assert max(offsets) > 0.9 * high and min(offsets) < 0.1 * high
        assert len(set(offsets)) > 400  # not all jobs at one moment
    else:
        assert set(offsets) == {0.0}


def test_the_jitter_differs_from_tick_to_tick_and_is_the_same_on_every_replica() -> None:
    offsets = [jitter_offset("job", tick, 30, 60) for tick in ticks(20, 60)]
    assert len(set(offsets)) == 20
    assert offsets == [jitter_offset("job", tick, 30, 60) for tick in ticks(20, 60)]


@pytest.mark.parametrize("tick", ticks(20))
def test_each_rank_claims_one_stagger_after_the_one_before_it_and_only_the_first_blindly(
    tick: datetime,
) -> None:
    order = claim_order("job", tick, WORKERS)
    turns = [turn("job", tick, worker, WORKERS, 20.0, 60.0) for worker in order]
    assert [t.rank for t in turns] == [0, 1, 2]
    assert [t.reads_first for t in turns] == [False, True, True]
    planned = turns[0].planned
    assert all(t.planned == planned for t in turns)  # one planned start for the tick
    assert [t.delay for t in turns] == [planned + rank * CLAIM_STAGGER for rank in range(3)]


def test_a_worker_that_knows_no_order_goes_first() -> None:
    """An older worker config lists no workers: claim at once; the transaction arbitrates."""
    alone = turn("job", T0, "worker-9", (), 0.0, 60.0)
    unlisted = turn("job", T0, "worker-9", WORKERS, 0.0, 60.0)
    assert (alone.rank, alone.delay, alone.reads_first) == (0, 0.0, False)
    assert unlisted.rank == 0
