"""`history --timeline`'s strips (provision/ledger/timeline.py): tables of ledgers, no Consul."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from provision.ledger.history import LedgerJob, LedgerSnapshot, Wanted, build_history, wanted_ticks
from provision.ledger.records import TickOutcome, TickRecord
from provision.ledger.timeline import timeline
from provision.schedule import parse_schedule

HOURLY = parse_schedule("@hourly")
NOW = datetime(2026, 12, 1, 10, 30, tzinfo=timezone.utc)
JOB = LedgerJob("nightly", "locks/nightly/.lock", HOURLY, 300.0, 200)
OUTCOMES = {
    "S": TickOutcome.SUCCEEDED,
    "F": TickOutcome.FAILED,
    "T": TickOutcome.TIMED_OUT,
    "L": TickOutcome.LOST,
    "M": TickOutcome.MISSED,
    "R": TickOutcome.RUNNING,
    "U": TickOutcome.UNREADABLE,
    "P": TickOutcome.PAUSED,
}


def at(hour: int) -> datetime:
    return datetime(2026, 12, 1, hour, tzinfo=timezone.utc)


def strips(records: list[tuple[int, str, str | None]], width: int = 80) -> dict[str, str]:
    """(hour, outcome letter, worker) records -> {worker: strip}; running ones hold the lock."""
    made = tuple(
        TickRecord(at(hour), OUTCOMES[letter], worker=worker, session="s-now")
        for hour, letter, worker in records
    )
    found = timeline(build_history(JOB, LedgerSnapshot(made, "s-now", NOW), NOW), width)
    return {strip.worker: strip.ticks for strip in found.strips}


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        # two workers taking turns, one failure: each strip has dots where the other ran
        (
            [(6, "S", "w1"), (7, "S", "w2"), (8, "F", "w1"), (9, "S", "w2"), (10, "S", "w1")],
            {"w1": "#.F.#", "w2": ".#.#."},
        ),
        # 7 and 8 unrecorded and their windows closed: missed, a gap in every strip
        ([(6, "S", "w1"), (9, "T", "w2"), (10, "R", "w1")], {"w1": "#  .>", "w2": ".  T."}),
        # a missed record `lockctl check` wrote is a gap, and check has no strip of its own
        ([(8, "S", "w1"), (9, "M", "lockctl check"), (10, "L", "w1")], {"w1": "# L"}),
        # an unreadable record: `?` in every strip
        ([(8, "S", "w1"), (9, "U", None), (10, "S", "w1")], {"w1": "#?#"}),
        # paused by an operator: `-` in every strip (the replica that recorded it ran nothing)
        (
            [(7, "S", "w1"), (8, "P", "w2"), (9, "P", "w1"), (10, "S", "w2")],
            {"w1": "#--.", "w2": ".--#"},
        ),
        # nobody ran anything yet: one strip, of the gaps
        ([(9, "M", "lockctl check")], {"(nobody ran)": "  "}),
    ],
)
def test_strips(records: list[tuple[int, str, str | None]], expected: dict[str, str]) -> None:
    assert strips(records) == expected


def test_the_strip_keeps_the_newest_ticks_that_fit_the_width() -> None:
    records = [(hour, "S" if hour % 2 else "F", "w1") for hour in range(0, 11)]
    shown = strips(records, width=2 + 4 + 8)  # a name of 2, its margins, 8 ticks (the least)
    assert shown == {"w1": "#F#F#F#F"}  # hours 3 to 10
    assert strips(records, width=200) == {"w1": "F#F#F#F#F#F"}


def test_a_hostile_worker_name_is_escaped_and_bounded() -> None:
    name = "\x1b[2J" + "x" * 100
    (worker,) = strips([(10, "S", name)])
    assert "\x1b" not in worker and len(worker) <= 24


def test_wanted_until_reads_one_tick() -> None:
    ticks = frozenset(at(hour) for hour in range(0, 11))
    real, _ = wanted_ticks(ticks, NOW, Wanted(1, since=at(4), until=at(4)))
    assert real == [at(4)]
