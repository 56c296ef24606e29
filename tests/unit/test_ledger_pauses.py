"""Ticks nobody ran while a pause held them are `paused`, not `missed` (provision/ledger/control.py
`holding_pause`, `unrun_record`; history and check): tables, no Consul."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from provision.ledger.control import (
    PAUSES_KEPT,
    ControlNote,
    Pauses,
    decode_pauses,
    encode_pauses,
    ended,
    holding_pause,
    unrun_record,
)
from provision.ledger.health import State, assess
from provision.ledger.history import LedgerJob, LedgerSnapshot, build_history
from provision.ledger.records import TickOutcome, TickRecord, decode
from provision.schedule import parse_schedule
from provision.system.control_keys import pauses_key


def at(hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 12, 1, hour, minute, tzinfo=timezone.utc)


def pause(start: datetime | None, until: datetime | None = None, by: str = "alice") -> ControlNote:
    return ControlNote(by, start, "disk swap", until=until)


NOW_PAUSED = pause(at(8, 30))  # paused since 08:30, still
RESUMED = (pause(at(5), at(6, 30), "bob"), pause(at(2), at(3), "carol"))  # newest first

# (the tick, the pause now, the resumed ones, who held it: None for nobody)
HOLDING = [
    ("a tick after the pause began, still paused", at(9), NOW_PAUSED, (), "alice"),
    ("the tick at the very instant it was paused", at(8, 30), NOW_PAUSED, (), "alice"),
    ("a tick before the pause", at(8), NOW_PAUSED, (), None),
    ("a pause that does not say when it began", at(9), pause(None), (), None),
    ("inside a resumed pause", at(6), None, RESUMED, "bob"),
    ("at a resumed pause's start", at(5), None, RESUMED, "bob"),
    ("at its resume: the tick was free again", at(6, 30), None, RESUMED, None),
    ("an older resumed pause", at(2, 30), None, RESUMED, "carol"),
    ("between two pauses", at(4), None, RESUMED, None),
    ("after every pause, none now", at(7), None, RESUMED, None),
    ("a resumed pause with no start", at(6), None, (pause(None, at(7)),), None),
]


@pytest.mark.parametrize(
    ("tick", "paused", "resumed", "holder"),
    [case[1:] for case in HOLDING],
    ids=[case[0] for case in HOLDING],
)
def test_which_pause_held_a_tick(
    tick: datetime, paused: ControlNote | None, resumed: tuple[ControlNote, ...], holder: str | None
) -> None:
    held = holding_pause(tick, paused, resumed)
    assert (None if held is None else held.by) == holder
    assert Pauses(paused, resumed).holding(tick) == held


def test_a_tick_held_by_a_pause_is_recorded_paused_with_who_when_and_why() -> None:
    record = unrun_record(at(9), "worker-2", at(9, 2), NOW_PAUSED)
    assert record.outcome is TickOutcome.PAUSED
    assert (record.by, record.reason, record.asked_at) == ("alice", "disk swap", at(8, 30))
    assert decode(at(9), record.encode()) == record
    missed = unrun_record(at(9), "lockctl check", at(9, 2), None, host="ops-1")
    assert missed == TickRecord(
        at(9), TickOutcome.MISSED, worker="lockctl check", host="ops-1", finished_at=at(9, 2)
    )


def test_a_resume_keeps_the_pause_it_ended_newest_first_and_only_the_newest_few() -> None:
    earlier = tuple(pause(at(1) + timedelta(minutes=i), at(1, 30)) for i in range(PAUSES_KEPT))
    kept = decode_pauses(ended(NOW_PAUSED, at(10), earlier))
    assert len(kept) == PAUSES_KEPT
    assert kept[0] == pause(at(8, 30), at(10))
    assert kept[1:] == earlier[: PAUSES_KEPT - 1]
    assert pauses_key("nightly") == "lockctl/control/nightly/pauses"


# What the `pauses` key may hold: only lockctl's own pauses with both ends bound a time.
UNTRUSTED = [
    ("not JSON", b"\xff{", 0),
    ("another format", json.dumps({"format": 2, "pauses": []}).encode(), 0),
    ("pauses not a list", json.dumps({"format": 1, "pauses": {"by": "x"}}).encode(), 0),
    ("an entry with no end", encode_pauses([pause(at(1))]), 0),
    ("an entry that ends before it begins", encode_pauses([pause(at(2), at(1))]), 0),
    ("an entry not an object", json.dumps({"format": 1, "pauses": [1, "x"]}).encode(), 0),
    ("over the size bound", b" " * (PAUSES_KEPT * 4096 + 1), 0),
    ("one good entry", encode_pauses([pause(at(1), at(2))]), 1),
]


@pytest.mark.parametrize(
    ("value", "count"), [case[1:] for case in UNTRUSTED], ids=[case[0] for case in UNTRUSTED]
)
def test_the_pauses_key_is_read_as_untrusted_text(value: bytes, count: int) -> None:
    assert len(decode_pauses(value)) == count


def test_a_forged_name_in_the_pauses_key_is_made_printable() -> None:
    value = encode_pauses([pause(at(1), at(2), by="eve\x1b[2J")])
    assert "\x1b" not in decode_pauses(value)[0].by


HOURLY = parse_schedule("@hourly")
JOB = LedgerJob("nightly", "locks/nightly/.lock", HOURLY, 300.0, 200)
NOW = at(10, 30)


def test_history_shows_unrecorded_ticks_a_pause_held_as_paused_and_check_does_not_page() -> None:
    ran = TickRecord(at(7), TickOutcome.SUCCEEDED, worker="worker-1", exit_status=0)
    snapshot = LedgerSnapshot((ran,), None, NOW)
    # every replica was down from 07:30; the job was paused at 08:30 and still is
    found = build_history(JOB, snapshot, NOW, Pauses(NOW_PAUSED))
    outcomes = {row.tick.hour: row.outcome for row in found.rows}
    assert outcomes == {10: "paused", 9: "paused", 8: "missed", 7: "succeeded"}
    assert found.unrecorded_missed == [at(10), at(9), at(8)]  # all three are to be recorded
    assert (
        found.rows[0].label
        == "paused (not recorded yet, by alice at 2026-12-01T08:30:00.000Z: disk swap)"
    )
    judged = assess(found, 300.0, max_intervals=2)
    assert judged.state is State.CRITICAL  # for 08:00 alone: the two paused ticks do not count
    assert judged.reasons == ("missed 2026-12-01T08:00:00Z (not recorded yet)",)
    # without the pause every one of them is missed
    plain = build_history(JOB, snapshot, NOW)
    assert [row.outcome for row in plain.rows[:3]] == ["missed"] * 3
    # paused from before 08:00: nothing pages, though nothing ran since 07:00
    early = build_history(JOB, snapshot, NOW, Pauses(pause(at(7, 30))))
    assert assess(early, 300.0, max_intervals=2).state is State.OK
