"""The catch-up rules (provision/ledger/catchup.py) as tables: which tick a catch-up runs, and
over which records. No Consul, no sleeping."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from provision.ledger.catchup import catchup_tick, may_catch_up, ticks_to_catch_up
from provision.ledger.records import TickOutcome, TickRecord
from provision.schedule import Schedule, parse_schedule
from provision.timings import CatchupReach

UTC = timezone.utc
T = datetime(2026, 12, 1, 2, 0, 0, tzinfo=UTC)  # a tick of every schedule below
EVERY_10S = parse_schedule("@every 10s")
HOURLY = parse_schedule("@hourly")
WEEKDAYS_9_17 = parse_schedule("0 9,17 * * 1-5")
MONDAY_9 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def at(seconds: float, base: datetime = T) -> datetime:
    return base + timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("schedule", "now", "deadline", "expected"),
    [
        # the current tick's window is open: a late run of it, not a catch-up; the one before
        # it closed at T and is within its deadline
        (EVERY_10S, at(5), 30, at(-10)),
        (EVERY_10S, at(0), 30, at(-10)),  # on the tick: the previous one's window just closed
        (EVERY_10S, at(9.9), 30, at(-10)),
        (EVERY_10S, at(20.5), 30, at(10)),  # only the newest: T stays missed
        (EVERY_10S, at(5), 15, at(-10)),  # 15 s after T-10: at its deadline... within it
        (EVERY_10S, at(5.1), 15, None),  # past it: nothing to catch up
        (EVERY_10S, at(5), 10, None),  # start_deadline = interval: never a catch-up
        (EVERY_10S, at(5), 5, None),  # below the interval: never either
        (EVERY_10S, at(3), 2, None),  # the current tick is past its deadline: nothing
        (HOURLY, at(600), 3 * 3600, at(-3600)),  # 1h schedule, 3h deadline: the 01:00 run
        (HOURLY, at(600), 3600, None),  # deadline = interval
        (HOURLY, at(600), 3600 + 600, at(-3600)),  # just above it: 70 min after 01:00
        # weekdays at 9 and 17: on Monday 10:00 the newest closed window is Friday's 17:00
        (WEEKDAYS_9_17, at(3600, MONDAY_9), 86400, None),  # 65 h ago: past a day's deadline
        (WEEKDAYS_9_17, at(3600, MONDAY_9), 3 * 86400, at(-64 * 3600, MONDAY_9)),
    ],
)
def test_the_catchup_tick_is_the_newest_whose_window_closed_within_its_deadline(
    schedule: Schedule, now: datetime, deadline: float, expected: datetime | None
) -> None:
    long_ago = now - timedelta(days=30)  # a ledger whose oldest record is older than all
    assert catchup_tick(schedule, now, deadline, {long_ago}) == expected


@pytest.mark.parametrize(
    ("recorded", "expected"),
    [
        (set(), None),  # an empty ledger: the job may not have existed then
        ({at(-10)}, None),  # the oldest record is the candidate itself (recorded missed)
        ({at(-5)}, None),  # only newer ones: nothing says the job existed at T-10
        ({at(-20)}, at(-10)),
        ({at(-20), at(-10)}, at(-10)),  # its record decides (may_catch_up), not this rule
    ],
)
def test_a_catchup_needs_an_older_record(
    recorded: set[datetime], expected: datetime | None
) -> None:
    assert catchup_tick(EVERY_10S, at(5), 30, recorded) == expected


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        (None, True),  # nobody ran it, nobody recorded it missed yet
        (TickOutcome.MISSED, True),  # recorded missed: claimed over that record
        (TickOutcome.RUNNING, False),  # someone claimed it (another replica's catch-up)
        (TickOutcome.SUCCEEDED, False),
        (TickOutcome.FAILED, False),
        (TickOutcome.LOST, False),
        (TickOutcome.INTERRUPTED, False),
        (TickOutcome.TIMED_OUT, False),
        (TickOutcome.UNREADABLE, False),  # a record we cannot read: never run over it
    ],
)
def test_only_a_tick_nobody_ran_may_be_caught_up(
    outcome: TickOutcome | None, expected: bool
) -> None:
    record = None if outcome is None else TickRecord(T, outcome)
    assert may_catch_up(record) is expected


def test_a_catchup_record_says_so_and_reads_back() -> None:
    from provision.ledger.records import decode

    record = TickRecord(T, TickOutcome.RUNNING, worker="worker-1", catchup=True)
    assert b'"catchup":true' in record.encode()
    assert decode(T, record.encode()).catchup is True
    assert decode(T, TickRecord(T, TickOutcome.RUNNING).encode()).catchup is None
    assert b"catchup" not in TickRecord(T, TickOutcome.RUNNING).encode()
    assert decode(T, b'{"format":1,"outcome":"succeeded","catchup":"yes"}').catchup is None


@pytest.mark.parametrize(
    ("attempts", "cut", "catchup", "expected"),
    [
        (None, None, None, "succeeded"),
        (None, None, True, "succeeded (catch-up)"),
        ((3, 0), None, None, "succeeded (2nd attempt)"),
        ((3, 0), None, True, "succeeded (catch-up, 2nd attempt)"),
    ],
)
def test_history_says_a_catchup_beside_its_attempts(
    attempts: tuple[int, ...] | None, cut: str | None, catchup: bool | None, expected: str
) -> None:
    from provision.ledger.attempts import attempts_text

    assert attempts_text("succeeded", attempts, cut, catchup) == expected


def _ledger(ran: dict[float, TickOutcome | str]) -> dict[datetime, TickRecord]:
    """A ledger: the record of each tick (seconds from T); its oldest says when the job began."""
    return {
        at(s): TickRecord(at(s), RAN, catchup=True)
        if outcome == CAUGHT_UP
        else TickRecord(at(s), TickOutcome(outcome))
        for s, outcome in ran.items()
    }


def _not_held(tick: datetime) -> bool:
    return False


RAN = TickOutcome.SUCCEEDED
MISSED = TickOutcome.MISSED
CAUGHT_UP = "caught up"


@pytest.mark.parametrize(
    ("now", "reach", "ran", "held", "expected"),
    [
        # none missed: every closed tick in the window ran
        (at(5), CatchupReach(60, 10), {s: RAN for s in range(-60, 10, 10)}, (), []),
        # an outage T-40..T-10 (four ticks), back at T+5: all four, oldest first; T is the
        # due tick (its window open), no catch-up
        (
            at(5),
            CatchupReach(3600, 10),
            {-50: RAN, 0: RAN},
            (),
            [at(-40), at(-30), at(-20), at(-10)],
        ),
        # recorded `missed` counts as nobody ran it; a run one does not
        (
            at(5),
            CatchupReach(3600, 10),
            {-30: MISSED, -20: RAN, -50: RAN},
            (),
            [at(-40), at(-30), at(-10)],
        ),
        # more than the limit: the newest three of them, oldest first
        (at(5), CatchupReach(3600, 3), {-50: RAN}, (), [at(-30), at(-20), at(-10)]),
        # ticks caught up already count toward the limit (a later look reaches no further)
        (at(5), CatchupReach(3600, 3), {-50: RAN, -20: CAUGHT_UP, -10: CAUGHT_UP}, (), [at(-30)]),
        # outside the window: 25 s back reaches T-20 and T-10 only
        (at(5), CatchupReach(25, 10), {-50: RAN}, (), [at(-20), at(-10)]),
        # a pause or blackout window held T-30 and T-20: never caught up
        (at(5), CatchupReach(3600, 10), {-50: RAN}, (-30, -20), [at(-40), at(-10)]),
        # recorded paused or blackout (the hold already written): not caught up either
        (
            at(5),
            CatchupReach(3600, 10),
            {-50: RAN, -40: TickOutcome.PAUSED, -30: TickOutcome.BLACKOUT},
            (),
            [at(-20), at(-10)],
        ),
        # past the due tick's window (now T+12, the window of T closed at T+10): T too
        (at(12), CatchupReach(3600, 10), {-20: RAN, -10: RAN}, (), [at(0)]),
    ],
)
def test_catchup_all_picks_the_ticks_nobody_ran_in_its_window(
    now: datetime,
    reach: CatchupReach,
    ran: dict[float, TickOutcome | str],
    held: tuple[float, ...],
    expected: list[datetime],
) -> None:
    held_ticks = {at(s) for s in held}
    picked = ticks_to_catch_up(EVERY_10S, now, 10, reach, _ledger(ran), held_ticks.__contains__)
    assert picked == expected


def test_catchup_all_reaches_back_no_further_than_the_ledger() -> None:
    only = {at(-30): TickRecord(at(-30), TickOutcome.SUCCEEDED)}
    assert ticks_to_catch_up(EVERY_10S, at(5), 10, CatchupReach(), only, _not_held) == [
        at(-20),
        at(-10),
    ]
    assert ticks_to_catch_up(EVERY_10S, at(5), 10, CatchupReach(), {}, _not_held) == []


def test_catchup_all_ignores_the_start_deadline() -> None:
    """Hourly with the default 5-minute deadline: "latest" never catches up, "all" does."""
    ledger = {at(-5 * 3600): TickRecord(at(-5 * 3600), TickOutcome.SUCCEEDED)}
    now = at(600)
    assert catchup_tick(HOURLY, now, 300, set(ledger)) is None
    picked = ticks_to_catch_up(HOURLY, now, 300, CatchupReach(3 * 3600, 10), ledger, _not_held)
    assert picked == [at(-2 * 3600), at(-3600), at(0)]
