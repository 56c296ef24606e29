"""The operators' control keys: their names, what their notes hold (untrusted text), --reason."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from provision.ledger.control import (
    ControlNote,
    decode_note,
    manual_tick,
    reason_problem,
    taken_key,
)
from provision.ledger.operator import is_pending, trigger_refusal
from provision.ledger.records import TickOutcome, TickRecord, decode, parse_tick_name, tick_name
from provision.scheduler.triggers import pending_triggers
from provision.system.control_keys import CONTROL_ROOT, control_prefix, paused_key, trigger_key

AT = datetime(2026, 12, 4, 22, 0, tzinfo=timezone.utc)


def test_the_control_keys_sit_under_one_root_outside_every_job_prefix() -> None:
    assert CONTROL_ROOT == "lockctl/control/"
    assert control_prefix("nightly") == "lockctl/control/nightly/"
    assert paused_key("nightly") == "lockctl/control/nightly/paused"
    assert trigger_key("nightly") == "lockctl/control/nightly/trigger"
    # a job whose name starts another's does not reach into its folder
    assert not paused_key("ab").startswith(control_prefix("a"))


def test_a_note_reads_back_as_written() -> None:
    note = ControlNote("alice (ops)", AT, "disk swap on db-1")
    assert decode_note(note.encode()) == note
    assert note.said() == "by alice (ops) at 2026-12-04T22:00:00.000Z: disk swap on db-1"
    assert ControlNote("bob", None).said() == "by bob"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, ControlNote("unknown", None)),  # a key with no value still pauses
        (b"", ControlNote("unknown", None)),
        (b"paused!", ControlNote("unknown", None)),
        (b"[1, 2]", ControlNote("unknown", None)),
        (b'{"format": 2, "by": "x"}', ControlNote("unknown", None)),  # a format not ours
        (b"x" * 5000, ControlNote("unknown", None)),  # over the cap: not parsed at all
        (b"[" * 100_000, ControlNote("unknown", None)),  # nested too deep: no RecursionError
        (
            b'{"format": 1, "by": 7, "at": "9999-12-31T23:59:59-01:00"}',
            ControlNote("unknown", None),
        ),
        (
            json.dumps({"format": 1, "by": "e\x1b[2J", "reason": "r\u202e" + "y" * 300}).encode(),
            ControlNote("e\\x1b[2J", None, "r\\u202e" + "y" * 178 + "...(+122 chars)"),
        ),
    ],
)
def test_a_note_is_untrusted_text(value: bytes | None, expected: ControlNote) -> None:
    assert decode_note(value) == expected


@pytest.mark.parametrize(
    ("reason", "problem"),
    [
        (None, None),
        ("disk swap", None),
        ("x" * 200, None),
        ("", "is empty"),
        ("   ", "is empty"),
        ("x" * 201, "is longer than 200 characters"),
        ("a\nb", "has a control character or a character that is not printable"),
        ("a\x1b[2Jb", "has a control character or a character that is not printable"),
        ("\u202eevil", "has a control character or a character that is not printable"),
    ],
)
def test_reason_is_one_printable_bounded_line(reason: str | None, problem: str | None) -> None:
    assert reason_problem(reason) == problem


def test_a_paused_record_keeps_who_when_and_why() -> None:
    tick = datetime(2026, 12, 4, 22, 1, tzinfo=timezone.utc)
    record = TickRecord(tick, TickOutcome.PAUSED, worker="worker-1", by="alice", asked_at=AT)
    record = TickRecord(**{**record.__dict__, "reason": "disk swap"})
    assert decode(tick, record.encode()) == record
    assert decode(tick, record.encode()).outcome is TickOutcome.PAUSED


def test_a_manual_run_has_an_instant_of_its_own_never_a_whole_second() -> None:
    assert manual_tick(AT.replace(microsecond=123456)) == AT.replace(microsecond=123000)
    assert manual_tick(AT) == AT.replace(microsecond=1000)  # never a scheduled tick's key
    assert manual_tick(AT.replace(microsecond=999)) == AT.replace(microsecond=1000)
    tick = manual_tick(AT.replace(microsecond=250000))
    assert tick_name(tick) == "2026-12-04T22:00:00.250Z"
    assert parse_tick_name(tick_name(tick)) == tick
    assert tick_name(AT) == "2026-12-04T22:00:00Z"  # a scheduled tick's name, as ever
    assert parse_tick_name("2026-12-04T22:00:00.000Z") is None  # never written
    assert parse_tick_name("2026-12-04T22:00:00.25Z") is None
    assert taken_key("locks/a/.lock") == "locks/a/trigger-taken"


def _note(**fields: object) -> bytes:
    return json.dumps(
        {"format": 1, "by": "ops", "at": "2026-12-04T22:00:00.500Z", **fields}
    ).encode()


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        ([], {}),
        ([("lockctl/control/a/trigger", _note(id="t1"))], {"a": "t1"}),
        ([("lockctl/control/a/paused", _note(id="t1"))], {}),  # a pause, not a trigger
        ([("lockctl/control/z/trigger", _note(id="t1"))], {}),  # not one of this worker's jobs
        ([("lockctl/control/a/trigger", _note())], {}),  # no id: not a trigger lockctl wrote
        ([("lockctl/control/a/trigger", b"run it!")], {}),
        ([("lockctl/control/a/x/trigger", _note(id="t1"))], {}),  # deeper: not the job's key
        (
            [
                ("lockctl/control/a/trigger", _note(id="t1")),
                ("lockctl/control/b/trigger", _note(id="t2")),
            ],
            {"a": "t1", "b": "t2"},
        ),
    ],
)
def test_the_watch_finds_each_of_its_jobs_trigger(
    entries: list[tuple[str, bytes]], expected: dict[str, str]
) -> None:
    found = pending_triggers(entries, ["a", "b"])
    assert {job: note.id for job, note in found.items()} == expected


PAUSE = ControlNote("alice", AT, "disk swap")
PENDING = ControlNote("bob", AT, None, "t1")


@pytest.mark.parametrize(
    ("paused", "pending", "taken", "refused"),
    [
        (None, None, None, None),  # nothing pending: triggered
        (None, PENDING, b"t1", None),  # the last one was taken: replaced
        (None, PENDING, None, "has a trigger pending, asked by bob at"),  # nobody took it
        (None, PENDING, b"t0", "has a trigger pending"),  # an older one was taken, not this
        (None, ControlNote("unknown", None), b"t1", "has a trigger pending"),  # not lockctl's
        (PAUSE, None, None, "is paused by alice at 2026-12-04T22:00:00.000Z: disk swap"),
        (PAUSE, PENDING, b"t1", "is paused"),  # paused first, whatever is pending
    ],
)
def test_a_trigger_is_refused_while_paused_or_while_one_is_pending(
    paused: ControlNote | None,
    pending: ControlNote | None,
    taken: bytes | None,
    refused: str | None,
) -> None:
    said = trigger_refusal("nightly", paused, pending, taken)
    if refused is None:
        assert said is None
    else:
        assert said is not None and said.startswith(f"job nightly {refused}"), said


@pytest.mark.parametrize(
    ("note", "taken", "pending"),
    [
        (PENDING, None, True),  # no replica took any trigger yet
        (PENDING, b"t0", True),  # an older one was taken, not this one
        (PENDING, b"t1", False),  # taken: `status` no longer shows it
        (ControlNote("unknown", None), b"t1", True),  # no id: not lockctl's, pending for good
    ],
)
def test_a_trigger_is_pending_until_the_taken_key_names_it(
    note: ControlNote, taken: bytes | None, pending: bool
) -> None:
    assert is_pending(note, taken) is pending
