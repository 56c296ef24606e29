"""Schedules: lockctl's own ticks, DST, and the systemd timer checked with systemd-analyze."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pytest
from typer.testing import CliRunner

from provision.cli import app
from provision.schedule import ScheduleError, parse_schedule

UTC = timezone.utc
ITERATIONS = 50
# "    Next elapse: Sun 2026-03-29 00:00:00 UTC" and "       Iter. #2: Mon 2026-03-30 ..."
ELAPSE = re.compile(r"^\s*(?:Next elapse|Iter\. #\d+): \w{3} (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC$")


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def _systemd_ticks(lines: list[str], base: datetime) -> list[datetime]:
    """The first ITERATIONS instants the union of `lines` fires at, per systemd itself."""
    out = subprocess.run(
        [
            "systemd-analyze",
            "calendar",
            f"--iterations={ITERATIONS}",
            f"--base-time={base:%Y-%m-%d %H:%M:%S} UTC",
            *lines,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "TZ": "UTC", "LC_ALL": "C"},
        check=True,
        timeout=30,
    ).stdout
    found = {_utc(m.group(1)) for m in map(ELAPSE.match, out.splitlines()) if m}
    return sorted(found)[:ITERATIONS]


TABLE = [
    ("30 2 * * *", "Europe/Berlin", "2026-03-27 00:00"),  # 02:30 skipped on 29 March
    ("30 2 * * *", "Europe/Berlin", "2026-10-23 00:00"),  # 02:30 twice on 25 October
    ("*/15 * * * *", "Europe/Berlin", "2026-10-25 00:00"),  # wildcards in the repeated hour
    ("*/15 * * * *", "Europe/Berlin", "2026-03-29 00:00"),
    ("0 * * * *", "America/New_York", "2026-11-01 03:00"),
    ("30 1 * * *", "America/New_York", "2026-10-30 00:00"),
    ("0 2 * * *", "America/New_York", "2026-03-06 00:00"),
    ("0 12 13 * 5", "UTC", "2026-01-01 00:00"),  # day-of-month OR day-of-week
    ("0 3 1-7 * 1", "Europe/Berlin", "2026-01-01 00:00"),
    ("5 4 * * sun", "UTC", "2026-01-01 00:00"),
    ("0 0 31 * *", "UTC", "2026-01-01 00:00"),
    ("@hourly", "UTC", "2026-01-01 00:00"),
    ("@weekly", "America/New_York", "2026-01-01 00:00"),
    ("@monthly", "Europe/Berlin", "2026-01-01 00:00"),
    ("@every 5s", "UTC", "2026-01-01 00:00:03"),
    ("@every 90s", "UTC", "2026-01-01 00:00"),
    ("@every 40m", "Europe/Berlin", "2026-03-28 20:00"),
    ("@every 8h", "UTC", "2026-01-01 00:00"),
]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
@pytest.mark.parametrize(("text", "zone", "base"), TABLE)
def test_the_timer_fires_at_exactly_lockctls_next_50_ticks(text: str, zone: str, base: str) -> None:
    schedule = parse_schedule(text, zone)
    start = _utc(base)
    assert _systemd_ticks(schedule.on_calendar(), start) == schedule.next_ticks(start, ITERATIONS)


def test_a_fixed_time_in_the_skipped_hour_is_no_tick_that_day() -> None:
    ticks = parse_schedule("30 2 * * *", "Europe/Berlin").next_ticks(_utc("2026-03-28 00:00"), 2)
    assert ticks == [_utc("2026-03-28 01:30"), _utc("2026-03-30 00:30")]


def test_a_repeated_hour_fires_once_at_its_first_occurrence() -> None:
    ticks = parse_schedule("30 2 * * *", "Europe/Berlin").next_ticks(_utc("2026-10-24 12:00"), 2)
    assert ticks == [_utc("2026-10-25 00:30"), _utc("2026-10-26 01:30")]  # 02:30 CEST, then CET


def test_every_is_anchored_to_the_epoch() -> None:
    schedule = parse_schedule("@every 7m30s")
    (tick,) = schedule.next_ticks(_utc("2026-01-01 00:01"), 1)
    assert tick.timestamp() % 450 == 0 and tick == _utc("2026-01-01 00:07:30")


@pytest.mark.parametrize(
    ("text", "now", "latest"),
    [
        ("0 2 * * *", "2026-05-01 02:00:00", "2026-05-01 02:00:00"),
        ("0 2 * * *", "2026-05-01 01:59:59", "2026-04-30 02:00:00"),
        ("@every 5m", "2026-05-01 02:04:59", "2026-05-01 02:00:00"),
        ("@every 5m", "2026-05-01 02:05:00", "2026-05-01 02:05:00"),
    ],
)
def test_latest_tick_at_or_before(text: str, now: str, latest: str) -> None:
    assert parse_schedule(text).latest_tick_at_or_before(_utc(now)) == _utc(latest)


def test_latest_tick_in_a_zone_is_the_tick_just_passed() -> None:
    schedule = parse_schedule("30 2 * * *", "Europe/Berlin")
    now = _utc("2026-10-25 02:00")  # after 02:30 CEST (00:30Z), inside the repeated hour
    assert schedule.latest_tick_at_or_before(now) == _utc("2026-10-25 00:30")


@pytest.mark.parametrize(
    ("text", "zone", "message"),
    [
        ("@every 7s", "UTC", "must divide a day evenly"),
        ("@every 25h", "UTC", "from 1s to 24h"),
        ("0 0 L * *", "UTC", "not a plain cron field"),
        ("0 2 * * *", "Nowhere/Town", "unknown timezone"),
    ],
)
def test_refused(text: str, zone: str, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        parse_schedule(text, zone)


def test_lockctl_next_prints_the_coming_ticks_in_utc_and_the_jobs_zone(tmp_path: Path) -> None:
    spec = tmp_path / "s.hcl"
    spec.write_text(
        'worker "w" {}\njob "a" {\n  prefix = "locks/a/"\n  workers = ["w"]\n'
        '  schedule = "30 2 * * *"\n  timezone = "Europe/Berlin"\n}\n'
    )
    result = CliRunner().invoke(app, ["next", "a", "--spec", str(spec), "--count", "3", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["timezone"] == "Europe/Berlin" and len(data["ticks"]) == 3
    assert all(tick["local"].startswith(tick["local"][:10]) for tick in data["ticks"])
    assert all("T02:30:00+0" in tick["local"] for tick in data["ticks"])
    text = CliRunner().invoke(app, ["next", "a", "--spec", str(spec)])
    assert text.exit_code == 0 and text.output.count("02:30:00") == 5
    missing = CliRunner().invoke(app, ["next", "b", "--spec", str(spec)])
    assert missing.exit_code == 2 and "no job 'b' (jobs: a)" in missing.output
