"""`lockctl abort JOB`: which run an abort note stops (pure), the note as a worker decodes it
(untrusted text), and the command's errors: one line, exit 2 before Consul for a bad job or
--reason, exit 1 when nothing runs."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import responses
from typer.testing import CliRunner

from provision.cli.app import app
from provision.errors import EXIT_FAILED, EXIT_INPUT
from provision.ledger.aborts import AbortNote, decode_abort, stops
from provision.ledger.control import ControlNote
from provision.outcomes import FINISHED, OPERATOR_STOPS, SCHEDULER_METRIC_OUTCOMES, Outcome
from provision.scheduler.report import note_events, record_outcome_label
from provision.scheduler.triggers import abort_notes
from provision.system.control_keys import abort_key
from provision.tick.edge import Note

TICK = datetime(2026, 12, 7, 3, 0, tzinfo=timezone.utc)
NOTE = AbortNote(ControlNote("alice@ops", TICK, "stuck on a lock", id="a-1"), TICK, "s-1")


@pytest.mark.parametrize(
    ("tick", "session", "stopped"),
    [
        (TICK, "s-1", True),  # the run it names
        (TICK + timedelta(minutes=1), "s-1", False),  # a later run under the same session
        (TICK, "s-2", False),  # the same tick claimed again after a lost lock: a new holder
        (TICK - timedelta(minutes=1), "s-1", False),  # an earlier run
    ],
)
def test_an_abort_stops_only_the_run_it_names(tick: datetime, session: str, stopped: bool) -> None:
    assert stops(NOTE, tick, session) is stopped


def test_an_abort_note_round_trips_and_says_who_when_why_and_which_tick() -> None:
    assert decode_abort(NOTE.encode()) == NOTE
    assert NOTE.said() == (
        "by alice@ops at 2026-12-07T03:00:00.000Z: stuck on a lock (tick 2026-12-07T03:00:00Z)"
    )


@pytest.mark.parametrize(
    "value",
    [
        None,
        b"not json",
        b"[]",
        b'{"format": 2, "by": "x"}',
        # lockctl's note without what names the run: stops nothing
        b'{"format": 1, "by": "x", "at": "2026-12-07T03:00:00Z", "id": "a"}',
        b'{"format": 1, "by": "x", "at": "2026-12-07T03:00:00Z", "id": "a", "tick": "soon",'
        b' "session": "s"}',
        b'{"format": 1, "by": "x", "id": "a", "tick": "2026-12-07T03:00:00Z", "session": "s"}',
        b'{"format": 1, "by": "x", "at": "2026-12-07T03:00:00Z", "id": "a",'
        b' "tick": "2026-12-07T03:00:00Z", "session": 7}',
        b"{" * 5000,
    ],
)
def test_a_value_that_is_not_lockctls_abort_note_stops_nothing(value: bytes | None) -> None:
    assert decode_abort(value) is None


def test_a_forged_by_is_made_printable() -> None:
    value = NOTE.encode().replace(b"alice@ops", b"alice\\u001b[2J")
    decoded = decode_abort(value)
    assert decoded is not None and "\x1b" not in decoded.note.by


def test_the_watch_hands_on_each_of_its_jobs_abort_note_and_nothing_else() -> None:
    entries = [
        (abort_key("report"), NOTE.encode()),
        (abort_key("other"), NOTE.encode()),  # not this scheduler's job
        (abort_key("broken"), b"{}"),
        ("lockctl/control/report/trigger", NOTE.encode()),
    ]
    assert abort_notes(entries, ["report", "broken"]) == {"report": NOTE}


def _spec(tmp_path: Path) -> list[str]:
    path = tmp_path / "locks.hcl"
    path.write_text(
        'worker "w1" {\n  address = "http://127.0.0.1:8500"\n}\n'
        'job "report" {\n  prefix = "jobs/report/"\n  workers = ["w1"]\n'
        '  schedule = "@every 1h"\n  command = ["/bin/true"]\n}\n'
    )
    return ["--spec", str(path), "--address", "127.0.0.1:1"]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["abort", "nightly"], "lockctl: error: job 'nightly' is not in "),
        (["abort", "report", "--reason", ""], "lockctl: error: --reason is empty"),
        (["abort", "report", "--reason", "x" * 201], "lockctl: error: --reason is longer than"),
        (["abort", "report", "--reason", "a\x1b[2Jb"], "lockctl: error: --reason has a control"),
        (["abort", "report", "--datacenter", "dc1"], "lockctl: error: --datacenter dc1: "),
    ],
)
def test_a_bad_job_or_flag_is_one_line_and_exit_2_before_consul(
    tmp_path: Path, argv: list[str], said: str
) -> None:
    result = CliRunner().invoke(app, [*argv, *_spec(tmp_path)])
    lines = result.output.strip().splitlines()
    assert result.exit_code == EXIT_INPUT, result.output
    assert len(lines) == 1 and lines[0].startswith(said), lines


@responses.activate
def test_a_job_nobody_runs_is_not_running_exit_1(tmp_path: Path) -> None:
    lock = re.compile(r"http://127\.0\.0\.1:1/v1/kv/jobs/report/\.lock.*")
    responses.get(lock, status=404, headers={"X-Consul-Index": "7"})
    result = CliRunner().invoke(app, ["abort", "report", *_spec(tmp_path)])
    lines = result.output.strip().splitlines()
    assert result.exit_code == EXIT_FAILED, result.output
    assert lines == ["lockctl: error: job report is not running: nothing aborted"]
    assert not any(call.request.method == "PUT" for call in responses.calls)  # nothing written


def test_an_aborted_run_is_counted_aborted_and_said_as_an_event_not_a_failure() -> None:
    assert record_outcome_label(Outcome.ABORTED) == "aborted"
    assert "aborted" in SCHEDULER_METRIC_OUTCOMES
    assert Outcome.ABORTED in OPERATOR_STOPS and Outcome.ABORTED in FINISHED
    said = note_events(Note("aborted", "report", TICK, NOTE.said()))
    assert said == [
        ("aborted", {"tick": "2026-12-07T03:00:00Z", "session": None, "asked": NOTE.said()})
    ]
    ignored = note_events(Note("abort", "report", TICK, "names no run of this replica"))
    assert [name for name, _ in ignored] == ["abort-ignored"]
