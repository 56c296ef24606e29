"""A tick record's times are data from anyone who may write the job's prefix
(provision/ledger/records.py): decoded within bounds, never an exception for a reader."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from provision.ledger.records import (
    RECORD_MAX_BYTES,
    TickOutcome,
    TickRecord,
    decode,
    parse_tick_name,
)

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


@pytest.mark.parametrize(
    ("value", "outcome"),
    [
        (stored(pad="A" * (RECORD_MAX_BYTES - 100)), TickOutcome.SUCCEEDED),  # under the cap
        (stored(pad="A" * RECORD_MAX_BYTES), TickOutcome.UNREADABLE),  # over it, valid JSON
        (b"[" * 500_000, TickOutcome.UNREADABLE),  # not even parsed: no RecursionError cost
    ],
)
def test_a_value_over_the_record_cap_is_never_decoded(value: bytes, outcome: TickOutcome) -> None:
    """A real record is under 1 KB; one of 500 KB saying `succeeded` was a run for every reader
    that read it whole (the quick skip of `lockctl run` reads up to 1 MB)."""
    assert decode(TICK, value).outcome is outcome


def test_a_record_the_runner_writes_is_far_under_the_cap() -> None:
    longest = TickRecord(
        TICK,
        TickOutcome.SUCCEEDED,
        worker="w" * 64,
        session="2c1e5f44-3a1b-4c7e-9d9f-0b3b1f6e7a21",
        host="h" * 64,  # HOST_NAME_MAX
        pid=4_194_303,
        claimed_at=TICK,
        start_lag=1.5,
        planned_start=17.25,
        lock_index=2**62,
        finished_at=TICK,
        exit_status=255,
        duration=86400.125,
    )
    assert len(longest.encode()) < RECORD_MAX_BYTES // 4
