"""`lockctl backfill`'s decisions, pure: the range's ticks, those skipped (run already, a
blackout window's, beyond a pruned ledger, still their own turn's), the limit, the flags'
errors, the note as written and as decoded (untrusted), and when a backfill is pending."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from provision.errors import InputError
from provision.ledger.backfill import (
    BACKFILL_WINDOW,
    MAX_TICKS,
    BackfillLedger,
    BackfillNote,
    BackfillPlan,
    beyond_ledger,
    decode_backfill,
    instant,
    limit_problem,
    pending,
    plan_backfill,
    range_problem,
)
from provision.ledger.records import TickRecord
from provision.outcomes import Outcome
from provision.schedule import parse_schedule

HOURLY = parse_schedule("0 * * * *")
T0 = datetime(2026, 12, 7, 0, 0, tzinfo=timezone.utc)


def h(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


def ledger(outcomes: dict[int, Outcome]) -> BackfillLedger:
    return BackfillLedger({h(n): TickRecord(h(n), o) for n, o in outcomes.items()})


def no_window(tick: datetime) -> str | None:
    return None


@pytest.mark.parametrize(
    ("recorded", "span", "run", "skipped"),
    [
        # nothing recorded: every tick of the range, both ends included
        ({}, (0, 3), [0, 1, 2, 3], {}),
        # one ran, one failed: neither again; a missed and a paused one run
        (
            {0: Outcome.SUCCEEDED, 1: Outcome.FAILED, 2: Outcome.MISSED, 3: Outcome.PAUSED},
            (0, 3),
            [2, 3],
            {0: "already recorded succeeded", 1: "already recorded failed"},
        ),
        # running, lost, blackout, unreadable: someone has the tick, or the spec held it
        (
            {1: Outcome.RUNNING, 2: Outcome.BLACKOUT, 3: Outcome.UNREADABLE},
            (1, 4),
            [4],
            {
                1: "already recorded running",
                2: "already recorded blackout",
                3: "already recorded unreadable",
            },
        ),
        # the range's ends between ticks: the ticks inside it
        ({}, (0.5, 2.5), [1, 2], {}),
    ],
)
def test_the_ticks_a_backfill_runs_and_skips(
    recorded: dict[int, Outcome],
    span: tuple[float, float],
    run: list[int],
    skipped: dict[int, str],
) -> None:
    plan = plan_backfill(HOURLY, (h(span[0]), h(span[1])), h(10), ledger(recorded), no_window)
    assert plan.run == tuple(h(n) for n in run)
    assert dict(plan.skipped) == {h(n): why for n, why in skipped.items()}


def test_a_tick_a_blackout_window_held_is_skipped_even_without_a_record() -> None:
    def held(tick: datetime) -> str | None:
        return "nightly" if tick == h(2) else None

    plan = plan_backfill(HOURLY, (h(1), h(3)), h(10), ledger({}), held)
    assert plan.run == (h(1), h(3))
    assert plan.skipped == ((h(2), "in blackout window nightly"),)


def test_a_tick_whose_claim_window_is_still_open_is_left_to_its_own_turn() -> None:
    plan = plan_backfill(
        HOURLY, (h(1), h(3)), h(3) - timedelta(microseconds=1), ledger({}), no_window
    )
    assert plan.run == (h(1), h(2))
    assert [tick for tick, _ in plan.skipped] == [h(3)]


@pytest.mark.parametrize(
    ("count", "beyond"),
    [
        (3, True),  # records newer than the tick: retention may have pruned the tick's
        (1, True),  # fewer than history_limit: it may have been raised since a prune
        (0, False),  # an empty ledger: a new job, every tick unknown and run
    ],
)
def test_a_tick_older_than_the_ledger_s_oldest_record_is_never_run(
    count: int, beyond: bool
) -> None:
    recorded = {5 + n: Outcome.SUCCEEDED for n in range(count)}
    assert beyond_ledger(h(1), set(ledger(recorded).records)) is beyond
    plan = plan_backfill(HOURLY, (h(1), h(1)), h(10), ledger(recorded), no_window)
    assert (plan.run == ()) is beyond


@pytest.mark.parametrize(
    ("ticks", "limit", "yes", "problem"),
    [
        (10, 10, False, None),
        (11, 10, False, "11 ticks to run, over the job's catchup_limit (10): confirm with --yes"),
        (11, 10, True, None),
        (MAX_TICKS + 1, 500, True, f"more than {MAX_TICKS} ticks to run"),
    ],
)
def test_the_limit(ticks: int, limit: int, yes: bool, problem: str | None) -> None:
    plan = BackfillPlan(tuple(h(n) for n in range(ticks)), ())
    found = limit_problem(plan, limit, yes)
    assert found == problem if problem is None else found is not None and found.startswith(problem)


def test_a_range_longer_than_a_backfill_may_hold_is_cut_one_past_it_to_refuse_it() -> None:
    every_second = parse_schedule("@every 1s")
    plan = plan_backfill(every_second, (h(0), h(1)), h(2), ledger({}), no_window)
    assert len(plan.run) == MAX_TICKS + 1
    assert limit_problem(plan, 10, yes=True) is not None


@pytest.mark.parametrize(
    ("start", "end", "problem"),
    [
        (1, 2, None),
        (2, 2, "--from 2026-12-07T02:00:00.000Z is not before --to 2026-12-07T02:00:00.000Z"),
        (3, 2, "--from 2026-12-07T03:00:00.000Z is not before --to"),
        (1, 11, "--to 2026-12-07T11:00:00.000Z is in the future"),
    ],
)
def test_the_range_flags(start: int, end: int, problem: str | None) -> None:
    found = range_problem(h(start), h(end), h(10))
    assert found == problem if problem is None else found is not None and found.startswith(problem)


@pytest.mark.parametrize(
    ("text", "moment"),
    [
        ("2026-12-07T02:00:00Z", h(2)),
        ("2026-12-07T03:00:00+01:00", h(2)),
        ("2026-12-07T02:00:00", None),  # no zone: which instant it means depends on the host
        ("yesterday", None),
        ("", None),
    ],
)
def test_an_instant_flag(text: str, moment: datetime | None) -> None:
    if moment is not None:
        assert instant("--from", text) == moment
        return
    with pytest.raises(InputError, match=r"^--from '.*' is not an instant such as "):
        instant("--from", text)


def test_a_note_is_decoded_as_written_and_a_stranger_is_none() -> None:
    note = BackfillNote("alice", h(10), (h(1), h(2)), "outage", "b-1")
    assert decode_backfill(note.encode()) == note
    for value in (
        None,
        b"not json",
        b'{"format": 1, "by": "x", "at": "2026-12-07T10:00:00Z", "ticks": []}',
        b'{"format": 1, "id": "b", "ticks": ["2026-12-07T01:00:00Z"]}',  # no time
        b'{"format": 2, "id": "b", "at": "2026-12-07T10:00:00Z", "ticks": ["2026-12-07T01:00Z"]}',
        b"x" * 10_000,
    ):
        assert decode_backfill(value) is None
    odd = (
        b'{"format":1,"id":"b","at":"2026-12-07T10:00:00Z","by":"a\\u001b[2J",'
        b'"ticks":["2026-12-07T02:00:00Z","nope",3,"2026-12-07T01:00:00Z"]}'
    )
    decoded = decode_backfill(odd)
    assert decoded is not None and decoded.ticks == (h(1), h(2))  # sorted, the rest dropped
    assert "\x1b" not in decoded.by


def test_a_backfill_is_pending_while_a_tick_of_it_is_not_run_and_it_is_young() -> None:
    note = BackfillNote("alice", h(10), (h(1), h(2)), None, "b-1")
    ran = {h(1): TickRecord(h(1), Outcome.SUCCEEDED)}
    assert pending(note, ran, h(11))
    done = {**ran, h(2): TickRecord(h(2), Outcome.FAILED)}
    assert not pending(note, done, h(11))
    missed = {**ran, h(2): TickRecord(h(2), Outcome.MISSED)}
    assert pending(note, missed, h(11))
    late = h(10) + timedelta(seconds=BACKFILL_WINDOW + 1)
    assert not pending(note, missed, late)  # over: its schedulers no longer try it


def test_a_backfilled_record_says_so_in_history_and_keeps_its_id() -> None:
    from provision.ledger.history import TickRow
    from provision.ledger.records import decode

    record = TickRecord(
        h(1), Outcome.SUCCEEDED, by="alice", reason="outage", asked_at=h(10), backfill="b-1"
    )
    again = decode(h(1), record.encode())
    assert again.backfill == "b-1"
    row = TickRow(h(1), "succeeded", again)
    assert row.label == "succeeded (backfill, by alice at 2026-12-07T10:00:00.000Z: outage)"
    assert row.to_record()["backfill"] == "b-1"
    assert (
        "backfill"
        not in TickRow(h(1), "succeeded", TickRecord(h(1), Outcome.SUCCEEDED)).to_record()
    )


def test_a_range_of_more_ticks_than_a_backfill_holds_is_refused_whatever_ran() -> None:
    """Ticks past the first MAX_TICKS are never looked at: a range with 101 ticks that ran
    and 60 missed after them is refused, never planned as nothing to run."""
    every_minute = parse_schedule("* * * * *")
    ran = {
        T0 + timedelta(minutes=n): TickRecord(T0 + timedelta(minutes=n), Outcome.SUCCEEDED)
        for n in range(120)
    }
    plan = plan_backfill(
        every_minute,
        (T0, T0 + timedelta(hours=3)),
        T0 + timedelta(hours=4),
        BackfillLedger(ran),
        no_window,
    )
    assert plan.crowded and plan.run == ()
    problem = limit_problem(plan, 10, yes=True)
    assert problem is not None and "more than 100 ticks in the range" in problem
