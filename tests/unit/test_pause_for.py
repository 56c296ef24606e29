"""A time-boxed pause (`lockctl pause --for/--until`): the pure decision (does the pause hold a
tick), the flags' parsing, and the tick core in virtual time on the in-memory Consul: ticks
before the end are recorded paused, ticks from it on run, judged on Consul's clock even when a
replica's wall is stepped."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from tick_fleet import KEYS, Fleet, at

from provision.errors import InputError
from provision.ledger.control import (
    ControlNote,
    decode_note,
    holding_pause,
    parse_duration,
    pause_end,
    pause_holds,
)
from provision.ledger.operator import PauseState
from provision.ledger.records import TickOutcome
from provision.system.control_keys import paused_key

TIMED = ControlNote("ops", at(0), "disk swap", ends=at(35))


@pytest.mark.parametrize(
    ("note", "tick", "holds"),
    [
        (TIMED, at(10), True),
        (TIMED, at(34.999), True),
        (TIMED, at(35), False),  # the end itself runs
        (TIMED, at(40), False),
        (ControlNote("ops", at(0)), at(10**6), True),  # no end: until resumed
    ],
)
def test_a_pause_holds_the_ticks_before_its_end_only(
    note: ControlNote, tick: datetime, holds: bool
) -> None:
    assert pause_holds(note, tick) is holds
    assert (holding_pause(tick, note, ()) is not None) is holds


def test_a_time_boxed_note_reads_back_with_its_end_and_says_it() -> None:
    read = decode_note(TIMED.encode())
    assert read == TIMED
    assert "until 2026-01-01T00:00:35.000Z" in read.said()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("15m", 900), ("2h", 7200), ("1h30m", 5400), ("7d", 604800)],
)
def test_a_duration_is_a_sum_of_units(text: str, seconds: int) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "2", "h", "2x", "-2h", "2h ", "0s", "1.5h", "2 h"])
def test_anything_else_is_no_duration(text: str) -> None:
    assert parse_duration(text) is None


NOW = at(0)


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (("2", None), "--for '2' is not a duration"),
        (("0s", None), "--for '0s' is not a duration"),
        (("400d", None), "--for: 2027-02-05T00:00:00.000Z is more than 366 days away"),
        ((None, "tomorrow"), "--until 'tomorrow' is not an instant"),
        ((None, "2026-01-02T00:00:00"), "--until '2026-01-02T00:00:00' is not an instant"),
        ((None, "2025-12-31T23:00:00Z"), "--until: 2025-12-31T23:00:00.000Z is not after"),
        ((None, "2026-01-01T00:00:00Z"), "--until: 2026-01-01T00:00:00.000Z is not after"),
        (("2h", "2026-01-02T00:00:00Z"), "--for and --until: give one of them, not both"),
    ],
)
def test_a_bad_end_is_refused_naming_its_flag(
    given: tuple[str | None, str | None], said: str
) -> None:
    with pytest.raises(InputError) as refused:
        pause_end(*given, NOW)
    assert str(refused.value).startswith(said)
    assert "\n" not in str(refused.value)


def test_an_end_is_reckoned_from_the_clock_given() -> None:
    assert pause_end("2h", None, NOW) == at(7200)
    assert pause_end(None, "2026-01-01T01:00:00+01:00", at(-7200)) == NOW  # any offset, in UTC
    assert pause_end(None, None, NOW) is None


@pytest.mark.parametrize(
    ("note", "date", "ended"),
    [
        (TIMED, at(34), False),
        (TIMED, at(35), True),  # Consul's clock at the end: its ticks from now on run
        (ControlNote("ops", at(0)), at(10**6), False),  # no end
        (None, at(40), False),  # not paused
    ],
)
def test_status_says_a_pause_ended_once_consuls_clock_passed_it(
    note: ControlNote | None, date: datetime, ended: bool
) -> None:
    state = PauseState("report", note, date)
    assert state.ended is ended
    if note is not None:
        assert state.said().endswith("(ended; `lockctl resume` removes it)") is ended


# -- the tick core ----------------------------------------------------------------------------
def _outcomes(fleet: Fleet, ticks: range) -> list[TickOutcome | None]:
    records = [fleet.record(at(t)) for t in ticks]
    return [None if r is None else r.outcome for r in records]


def test_ticks_before_the_end_are_recorded_paused_and_those_after_it_run() -> None:
    fleet = Fleet()
    fleet.store.put(paused_key(KEYS.name), TIMED.encode())  # ends at 35: ticks 10..30 held
    for worker in fleet.workers:
        fleet.start(worker)
    fleet.run(65)  # to before tick 70
    paused, ran = TickOutcome.PAUSED, TickOutcome.SUCCEEDED
    assert _outcomes(fleet, range(0, 70, 10)) == [paused] * 4 + [ran] * 3
    assert sorted(fleet.ran_ticks()) == [at(40), at(50), at(60)]
    record = fleet.record(at(30))
    assert record is not None and (record.by, record.reason) == ("ops", "disk swap")


@pytest.mark.parametrize("step", [25.0, -20.0])  # a wall stepped past the end; one back
def test_the_end_is_judged_on_consuls_clock_whatever_a_replicas_wall_does(step: float) -> None:
    fleet = Fleet(workers=("w1",))
    fleet.store.put(paused_key(KEYS.name), TIMED.encode())
    fleet.start("w1")
    fleet.run(12)  # tick 10 held
    fleet.clocks["w1"].clock.step_wall(step)  # the replica's wall, not Consul's
    fleet.run(100)
    records = [r for t in range(0, 120, 10) if (r := fleet.record(at(t))) is not None]
    assert any(r.tick >= at(35) for r in records)  # it went on past the end
    # paused exactly before the end (after it: run, or missed while its wall lags; never paused)
    assert all((r.outcome is TickOutcome.PAUSED) == (r.tick < at(35)) for r in records), records
    assert all(tick >= at(35) for tick in fleet.ran_ticks())
