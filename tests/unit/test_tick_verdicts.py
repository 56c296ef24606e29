"""The `missed` event's fields: the words and the numbers agree."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from provision.runner.tick_verdicts import missed_fields

TICK = datetime(2026, 12, 7, 13, 6, 20, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("lag", "deadline", "recorded", "said", "lag_ms", "deadline_ms"),
    [
        (24.1, 20.0, True, "started 24.1s after it", 24100.0, 20000.0),
        (20.04, 20.0, False, "started 20.0s after it", 20040.0, 20000.0),
        (0.5, 0.25, False, "later than its start deadline (0s)", 500.0, 250.0),
    ],
)
def test_missed_fields_say_the_lag_and_the_deadline_in_words_and_numbers(
    lag: float, deadline: float, recorded: bool, said: str, lag_ms: float, deadline_ms: float
) -> None:
    fields = missed_fields(TICK, lag, deadline, recorded)
    assert said in str(fields["reason"])
    assert str(fields["reason"]).startswith("tick 2026-12-07T13:06:20Z: ")
    assert (fields["lag_ms"], fields["deadline_ms"], fields["recorded"]) == (
        lag_ms,
        deadline_ms,
        recorded,
    )
