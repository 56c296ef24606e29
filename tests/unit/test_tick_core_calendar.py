"""provision/tick/calendar.py: a Calendar gives the very ticks its Schedule gives (cron walks
kept and reused, DST included), whichever way and however far it is asked."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta, timezone

import pytest

from provision.schedule import parse_schedule
from provision.tick.calendar import SPAN, Calendar

# Europe/Berlin springs forward on 2026-03-29 at 02:00 and falls back on 2026-10-25 at 03:00
NIGHT = datetime(2026, 3, 28, 22, 0, tzinfo=timezone.utc)
AUTUMN = datetime(2026, 10, 24, 22, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("text", "zone"),
    [
        ("* * * * *", "UTC"),
        ("*/5 * * * *", "Europe/Berlin"),
        ("30 2 * * *", "Europe/Berlin"),
        ("@every 10s", "UTC"),
    ],
)
@pytest.mark.parametrize("start", [NIGHT, AUTUMN])
def test_a_calendar_answers_as_its_schedule(text: str, zone: str, start: datetime) -> None:
    schedule = parse_schedule(text, zone)
    calendar = Calendar.of(schedule)
    for step in range(0, 6000, 37):
        moment = start + timedelta(seconds=step * 7.3)
        assert calendar.next_ticks(moment, 3) == schedule.next_ticks(moment, 3)
        assert calendar.latest_tick_at_or_before(moment) == schedule.latest_tick_at_or_before(
            moment
        )
    later = start + timedelta(days=2)
    walked = itertools.islice(calendar.ticks_at_or_before(later), SPAN + 50)
    assert list(walked) == list(itertools.islice(schedule.ticks_at_or_before(later), SPAN + 50))


def test_a_question_far_off_starts_a_new_run_and_still_answers_right() -> None:
    schedule = parse_schedule("*/2 * * * *", "Europe/Berlin")
    calendar = Calendar.of(schedule)
    for moment in (NIGHT, NIGHT + timedelta(days=400), NIGHT - timedelta(days=30), NIGHT):
        assert calendar.next_ticks(moment, 2) == schedule.next_ticks(moment, 2)
        assert calendar.latest_tick_at_or_before(moment) == schedule.latest_tick_at_or_before(
            moment
        )
