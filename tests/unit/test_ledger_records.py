"""A tick record's times are data from anyone who may write the job's prefix
(provision/ledger/records.py): decoded within bounds, never an exception for a reader."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from provision.ledger.records import TickOutcome, decode, parse_tick_name

TICK = datetime(2026, 12, 2, 6, 0, tzinfo=timezone.utc)


def stored(**fields: object) -> bytes:
    return json.dumps({"format": 1, "outcome": "succeeded", "worker": "w", **fields}).encode()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-12-02T06:00:01.250Z", datetime(2026, 12, 2, 6, 0, 1, 250000, tzinfo=timezone.utc)),
        ("2026-12-02T07:00:01+01:00", datetime(2026, 12, 2, 6, 0, 1, tzinfo=timezone.utc)),
        ("9999-12-31T23:59:59-01:00", None),  # past datetime.max once in UTC: OverflowError
        ("9999-12-31T23:59:59Z", None),  # believable to no reader's arithmetic
        ("2200-01-01T00:00:00Z", None),
        ("1969-12-31T23:59:59Z", None),  # before the Unix epoch
        ("0001-01-01T00:00:00+01:00", None),  # before datetime.min in UTC
        ("2026-12-02T06:00:01", None),  # no zone: not a moment
        ("yesterday", None),
        ("2026-12-02T06:00:01Z" + " " * 40, None),  # longer than any time we write
        (17, None),
    ],
)
def test_a_records_times_are_believed_only_inside_the_bounds(
    value: object, expected: datetime | None
) -> None:
    record = decode(TICK, stored(finished_at=value, claimed_at=value))
    assert record.outcome is TickOutcome.SUCCEEDED and record.worker == "w"
    assert record.finished_at == expected and record.claimed_at == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("2026-12-02T06:00:00Z", TICK),
        ("9999-12-31T23:59:59Z", None),
        ("1970-01-01T00:00:00Z", datetime(1970, 1, 1, tzinfo=timezone.utc)),  # verify's
        ("1969-12-31T23:59:00Z", None),
        ("2026-13-02T06:00:00Z", None),
        ("2026-12-02T06:00:00", None),
    ],
)
def test_a_key_names_a_tick_only_inside_the_bounds(name: str, expected: datetime | None) -> None:
    assert parse_tick_name(name) == expected
