"""Blackout windows: the pure decision (which window holds a tick), the spec's blocks and their
checks at load, and the worker config's copy of them."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest
from typer.testing import CliRunner

from provision.blackouts import Blackout, holding_window
from provision.cli import app
from provision.durations import parse_duration
from provision.ledger.records import TickRecord
from provision.outcomes import SCHEDULER_METRIC_OUTCOMES, Outcome
from provision.schedule import parse_schedule
from provision.scheduler.report import held_by_a_pause, record_outcome_label, tick_outcome
from provision.spec.problems import SpecError
from provision.spec.validate import load_spec
from provision.tick.edge import Note
from provision.workers.job_config import job_record, read_job


def window(name: str, cron: str, duration: str, zone: str = "UTC") -> Blackout:
    return Blackout(name, parse_schedule(cron, zone), parse_duration(duration).seconds)


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc)


FREEZE = window("freeze", "0 22 * * 5", "60h", "Europe/Berlin")  # Fri 22:00 local, to Mon
NIGHT = window("night", "0 23 * * *", "2h")  # crosses midnight
# Europe/Berlin: 2026-03-29 02:00 CET -> 03:00 CEST (02:30 does not happen that day);
# 2026-10-25 03:00 CEST -> 02:00 CET (02:30 happens twice: the window opens at the first)
HALF_PAST_TWO = window("h", "30 2 * * *", "1800s", "Europe/Berlin")
SATURDAY_NIGHT = window("sat", "0 22 * * 6", "6h", "Europe/Berlin")

CASES = [
    # (windows, tick in UTC, the window that holds it, or None)
    ((FREEZE,), "2026-12-04T20:59:59", None),  # Fri 21:59:59 CET: not yet
    ((FREEZE,), "2026-12-04T21:00:00", "freeze"),  # its opening holds
    ((FREEZE,), "2026-12-06T23:30:00", "freeze"),  # across the week's end (Sunday -> Monday)
    ((FREEZE,), "2026-12-07T08:59:59", "freeze"),  # 60 h after Fri 21:00 UTC: Mon 09:00 UTC
    ((FREEZE,), "2026-12-07T09:00:00", None),  # its end does not
    ((FREEZE,), "2026-12-09T12:00:00", None),  # a weekday
    ((NIGHT,), "2026-12-07T22:59:00", None),
    ((NIGHT,), "2026-12-08T00:30:00", "night"),  # past midnight, opened the day before
    ((NIGHT,), "2026-12-08T01:00:00", None),
    ((HALF_PAST_TWO,), "2026-03-28T01:45:00", "h"),  # 02:45 CET on the day before
    ((HALF_PAST_TWO,), "2026-03-29T00:45:00", None),  # spring forward: no 02:30, no window
    ((HALF_PAST_TWO,), "2026-03-29T01:15:00", None),  # 03:15 CEST
    ((HALF_PAST_TWO,), "2026-03-30T00:45:00", "h"),  # 02:45 CEST the day after
    ((HALF_PAST_TWO,), "2026-10-25T00:45:00", "h"),  # fall back: 02:45 CEST, the first copy
    ((HALF_PAST_TWO,), "2026-10-25T01:35:00", None),  # 02:35 CET: the second copy opens none
    # Sat 22:00 CET = 21:00 UTC, 6 h of real time across the spring-forward night: to 03:00 UTC
    ((SATURDAY_NIGHT,), "2026-03-29T02:59:59", "sat"),
    ((SATURDAY_NIGHT,), "2026-03-29T03:00:00", None),
    ((), "2026-12-05T12:00:00", None),
    ((NIGHT, FREEZE), "2026-12-05T23:30:00", "night"),  # both hold it: the first listed
    ((FREEZE, NIGHT), "2026-12-05T23:30:00", "freeze"),
    ((NIGHT, FREEZE), "2026-12-05T12:00:00", "freeze"),
]


@pytest.mark.parametrize(("windows", "tick", "expected"), CASES)
def test_the_window_holding_a_tick(
    windows: tuple[Blackout, ...], tick: str, expected: str | None
) -> None:
    held = holding_window(windows, utc(tick))
    assert (None if held is None else held.name) == expected


def test_an_every_window_opens_on_the_epoch_grid() -> None:
    every = Blackout("grid", parse_schedule("@every 1h"), 600.0)
    assert holding_window([every], utc("2026-12-05T13:09:59")) is every
    assert holding_window([every], utc("2026-12-05T13:10:00")) is None


# -- the spec -----------------------------------------------------------------------------------
SPEC = """defaults {
  blackout "freeze" {
    schedule = "0 22 * * 5"
    duration = "60h"
    timezone = "Europe/Berlin"
  }
}
worker "w1" { address = "http://127.0.0.1:8500" }
job "backup" {
  prefix   = "jobs/backup/"
  workers  = ["w1"]
  schedule = "*/15 * * * *"
  command  = ["/bin/true"]
  %s
}
"""
NIGHTLY = 'blackout "nightly" {\n    schedule = "0 1 * * *"\n    duration = "30m"\n  }'


def load(tmp_path: Path, inner: str) -> tuple[Blackout, ...]:
    path = tmp_path / "lockctl.hcl"
    path.write_text(SPEC % inner)
    return load_spec(path).jobs[0].blackouts


def test_a_job_has_the_defaults_windows_then_its_own(tmp_path: Path) -> None:
    windows = load(tmp_path, NIGHTLY)
    assert [(w.name, w.schedule.zone, w.duration) for w in windows] == [
        ("freeze", "Europe/Berlin", 60 * 3600.0),
        ("nightly", "UTC", 1800.0),
    ]
    assert [w.line for w in windows] == [2, 14]


BAD = [
    ('"0s"', "duration: must be above zero"),
    ('"-1h"', "duration: must be above zero"),
    ('"8785h"', "duration: must be at most a year (8784h)"),
    ('"1 day"', "is not a duration"),
]


@pytest.mark.parametrize(("duration", "said"), BAD)
def test_a_bad_duration_is_refused_at_load(tmp_path: Path, duration: str, said: str) -> None:
    inner = NIGHTLY.replace('"30m"', duration)
    with pytest.raises(SpecError) as refused:
        load(tmp_path, inner)
    (problem,) = refused.value.problems
    assert problem.line == 16 and said in str(problem)


@pytest.mark.parametrize(
    ("attribute", "said"),
    [
        ('schedule = "0 25 * * *"', 'job "backup".blackout "nightly".schedule: \'0 25 * * *\''),
        ('timezone = "Mars/Base"', "'Mars/Base': unknown timezone"),
        ('duration = "1h"', "set twice"),
        ('every = "1h"', "unknown attribute"),
    ],
)
def test_a_bad_window_is_one_line_naming_its_line(
    tmp_path: Path, attribute: str, said: str
) -> None:
    inner = NIGHTLY.replace('duration = "30m"', f'duration = "30m"\n    {attribute}')
    if attribute.startswith("schedule"):
        inner = NIGHTLY.replace('"0 1 * * *"', '"0 25 * * *"')
    with pytest.raises(SpecError) as refused:
        load(tmp_path, inner)
    (problem,) = refused.value.problems
    assert said in str(problem) and problem.line in (15, 16, 17)


def test_a_window_name_twice_in_one_job_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as refused:
        load(tmp_path, NIGHTLY + "\n  " + NIGHTLY)
    (problem,) = refused.value.problems
    assert "duplicate blackout window; the first is on line 14" in str(problem)
    with pytest.raises(SpecError) as refused:
        load(tmp_path, NIGHTLY.replace("nightly", "freeze"))
    (problem,) = refused.value.problems  # the job's and the one it has from defaults
    assert problem.line == 14 and "the first is on line 2" in str(problem)


def test_a_window_without_its_schedule_or_duration_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as refused:
        load(tmp_path, 'blackout "x" { duration = "1h" }')
    assert "schedule: is required" in str(refused.value.problems[0])
    with pytest.raises(SpecError) as refused:
        load(tmp_path, 'blackout { schedule = "@daily"\n duration = "1h" }')
    assert "needs one quoted name" in str(refused.value.problems[0])


# -- the worker config ---------------------------------------------------------------------------
def test_the_worker_config_carries_the_windows_and_reads_them_back(tmp_path: Path) -> None:
    path = tmp_path / "lockctl.hcl"
    path.write_text(SPEC % NIGHTLY)
    job = load_spec(path).jobs[0]
    raw = job_record(job)
    assert raw["blackout"] == {
        "freeze": {"schedule": "0 22 * * 5", "duration": "60h", "timezone": "Europe/Berlin"},
        "nightly": {"schedule": "0 1 * * *", "duration": "30m", "timezone": "UTC"},
    }
    problems: list[str] = []
    read = read_job("backup", raw, False, problems)
    assert problems == [] and read is not None
    assert [(w.name, w.schedule, w.duration) for w in read.blackouts] == [
        (w.name, w.schedule, w.duration) for w in job.blackouts
    ]


def test_a_bad_window_in_the_worker_config_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "lockctl.hcl"
    path.write_text(SPEC % NIGHTLY)
    raw = job_record(load_spec(path).jobs[0])
    raw["blackout"]["nightly"]["duration"] = "0s"
    raw["blackout"]["freeze"] = {"schedule": "@daily"}
    problems: list[str] = []
    assert read_job("backup", raw, False, problems) is None
    assert problems == [
        'jobs.backup.blackout.freeze: must be {"schedule": "...", "duration": "...", '
        '"timezone": "..."}',
        "jobs.backup.blackout.nightly.duration: must be above zero",
    ]


# -- where outcomes become metric labels ---------------------------------------------------------
def test_a_blackout_tick_is_counted_under_its_own_label_never_missed() -> None:
    tick = utc("2026-12-05T12:00:00")
    record = TickRecord(tick, Outcome.BLACKOUT, worker="w1", window="freeze")
    assert tick_outcome(Note("blackout", "backup", tick, "freeze", record=record)) == "blackout"
    assert record_outcome_label(Outcome.BLACKOUT) == "blackout"
    assert "blackout" in SCHEDULER_METRIC_OUTCOMES
    written = Note("missed", "backup", tick, "blackout", record=record)  # a fate look's record
    assert tick_outcome(written) is None and held_by_a_pause(written)  # no MISSED_RECORDED


# -- lockctl next ---------------------------------------------------------------------------------
NEXT_SPEC = (
    'worker "w" {}\njob "a" {\n  prefix = "locks/a/"\n  workers = ["w"]\n'
    '  schedule = "*/15 * * * *"\n'
    '  blackout "half" {\n    schedule = "*/30 * * * *"\n    duration = "%s"\n  }\n}\n'
)


def test_lockctl_next_marks_the_ticks_a_window_removes(tmp_path: Path) -> None:
    spec = tmp_path / "s.hcl"
    spec.write_text(NEXT_SPEC % "1s")  # holds the ticks at :00 and :30, whatever the hour
    result = CliRunner().invoke(app, ["next", "a", "--spec", str(spec), "-n", "4", "--json"])
    assert result.exit_code == 0, result.output
    ticks = json.loads(result.output)["ticks"]
    held = [tick["utc"][14:16] in ("00", "30") for tick in ticks]
    assert [tick["blackout"] for tick in ticks] == ["half" if h else None for h in held]
    assert sum(held) == 2
    text = CliRunner().invoke(app, ["next", "a", "--spec", str(spec), "-n", "4"])
    assert text.exit_code == 0 and "blackout half: */30 * * * * (UTC) for 1s" in text.output
    assert text.output.count("blackout: half (not run)") == 2


def test_a_bad_window_stops_the_cli_with_one_line_and_exit_2(tmp_path: Path) -> None:
    spec = tmp_path / "s.hcl"
    spec.write_text(NEXT_SPEC % "0s")
    result = CliRunner().invoke(app, ["next", "a", "--spec", str(spec)])
    assert result.exit_code == 2
    assert f'{spec}:8: job "a".blackout "half".duration: must be above zero' in result.output
    assert "Traceback" not in result.output
