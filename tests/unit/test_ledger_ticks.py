"""The tick rules (provision/ledger/ticks.py) as tables: which tick a run belongs to, its claim
window, the agent's clock, and which ticks nobody ran. No Consul, no sleeping."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest

from provision.ledger.ticks import (
    FUTURE_TOLERANCE,
    MAX_EARLY_WAIT,
    MISSED_GRACE,
    MISSED_WALK,
    choose_tick,
    claim_window,
    clock_skew,
    judge_tick,
    missed_ticks,
    skew_to_say,
    suspect,
    to_prune,
    unsettled_ticks,
)
from provision.schedule import Schedule, parse_schedule
from provision.tick.core import MAX_MISSED_PER_HOUSEKEEPING

UTC = timezone.utc
T = datetime(2026, 12, 1, 2, 0, 0, tzinfo=UTC)  # a tick of every schedule below
EVERY_5S = parse_schedule("@every 5s")
DAILY = parse_schedule("0 2 * * *")
WEEKDAYS_9_17 = parse_schedule("0 9,17 * * 1-5")
FAR = datetime(2099, 1, 1, tzinfo=UTC)  # a record anyone with write on the prefix can forge


def at(seconds: float) -> datetime:
    return T + timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("schedule", "now", "deadline", "tick", "window", "too_late"),
    [
        (EVERY_5S, at(0), 300, T, 5, False),  # exactly on the tick
        (EVERY_5S, at(0.9), 300, T, 5, False),  # a timer a second late
        (EVERY_5S, at(4.999), 300, T, 5, False),  # the window is cut at the next tick
        (EVERY_5S, at(5), 300, at(5), 5, False),  # which is the next run's tick
        (EVERY_5S, at(-0.001), 300, at(-5), 5, False),  # a clock a little behind: last tick
        (EVERY_5S, at(2.5), 2, T, 2, True),  # start deadline shorter than the interval
        (EVERY_5S, at(2), 2, T, 2, False),  # at the deadline itself: still in time
        (DAILY, at(299), 300, T, 300, False),  # daily: the start deadline is the window
        (DAILY, at(301), 300, T, 300, True),
        (DAILY, at(7 * 3600), 300, T, 300, True),  # a worker booting hours late
        (DAILY, at(-1), 300, T - timedelta(days=1), 300, True),  # before today's: yesterday's
    ],
)
def test_a_run_belongs_to_the_latest_tick_within_its_window(
    schedule, now, deadline, tick, window, too_late
) -> None:
    choice = choose_tick(schedule, now, deadline)
    assert (choice.tick, choice.window, choice.too_late) == (tick, window, too_late)
    assert choice.lag == pytest.approx((now - tick).total_seconds())
    assert (choice.wait, choice.skew) == (0.0, None)  # no agent clock given


def test_the_window_of_an_irregular_cron_is_cut_at_its_next_tick() -> None:
    friday_17 = datetime(2026, 12, 4, 17, 0, tzinfo=UTC)  # next: Monday 09:00
    assert claim_window(WEEKDAYS_9_17, friday_17, 86400) == 86400
    monday_9 = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)  # next: Monday 17:00
    assert claim_window(WEEKDAYS_9_17, monday_9, 86400) == 8 * 3600


@pytest.mark.parametrize(
    ("now", "agent_date", "wait", "too_early"),
    [
        (at(0.3), at(0), 0.0, False),  # the tick has come there (Date rounds down)
        (at(0.3), at(-1), 1.0, False),  # agent 0.3..1.3 s behind: wait for its tick
        (at(0.2), at(-3), 3.0, False),  # `now` 3 s ahead of the agent's Date: wait
        (at(0.1), at(-MAX_EARLY_WAIT - 1), MAX_EARLY_WAIT + 1, True),  # too far: skip it
        (at(0.5), at(3), 0.0, False),  # the agent's clock is past the tick: no wait
    ],
)
def test_the_agents_clock_says_whether_the_tick_has_come(now, agent_date, wait, too_early) -> None:
    choice = choose_tick(EVERY_5S, now, 300, agent_date)
    assert choice.tick == T
    assert choice.wait == wait
    assert choice.skew is None  # this host's clock is compared by the caller (plan_tick)
    assert choice.too_early is too_early


@pytest.mark.parametrize(
    ("now", "too_late", "recent"),
    [
        (at(4.9), False, True),  # in its window
        (at(5.1), True, True),  # the next tick has come: too late, its record still kept
        (at(9.9), True, True),  # one later tick has come
        (at(10), True, False),  # two have: retention may have deleted this tick's record
        (at(65), True, False),  # a host clock 65 s behind Consul's: never run, never recorded
    ],
)
def test_a_tick_is_recent_while_at_most_one_later_tick_has_come(now, too_late, recent) -> None:
    choice = judge_tick(EVERY_5S, T, now, 300)
    assert (choice.too_late, choice.recent) == (too_late, recent)


def ticks(*seconds: float) -> set[datetime]:
    return {at(s) for s in seconds}


@pytest.mark.parametrize(
    ("recorded", "now", "deadline", "limit", "missed"),
    [
        (set(), at(100), 300, 10, []),  # an empty ledger: nothing before the first run
        (ticks(0, 5, 10), at(12), 300, 10, []),  # every tick recorded
        (ticks(0, 10), at(12), 300, 10, []),  # 5's window closed at 10, +grace: not yet
        (ticks(0, 10), at(10 + MISSED_GRACE + 0.1), 300, 10, [at(5)]),
        (ticks(0), at(30), 300, 10, [at(20), at(15), at(10), at(5)]),  # newest first
        (ticks(0), at(30), 300, 2, [at(20), at(15)]),  # at most `limit`
        (ticks(0), at(30), 1, 10, [at(25), at(20), at(15), at(10), at(5)]),  # short deadline
        (ticks(10), at(30), 300, 10, [at(20), at(15)]),  # nothing before the oldest record
        # a far-future record is not the latest tick run: the walk starts at now, not there
        (ticks(0) | {FAR}, at(30), 300, 10, [at(20), at(15), at(10), at(5)]),
        ({FAR}, at(30), 300, 10, []),  # nor the oldest: alone it arms no dead-man switch
    ],
)
def test_missed_ticks_are_the_unrecorded_ones_whose_window_closed(
    recorded, now, deadline, limit, missed
) -> None:
    assert missed_ticks(EVERY_5S, recorded, now, deadline, limit=limit) == missed


def test_missed_ticks_scan_is_bounded_for_a_long_outage() -> None:
    # a week of @every 5s ticks nobody ran: only the newest `limit` are named, quickly
    recorded = {T}
    week = at(7 * 86400)
    missed = missed_ticks(EVERY_5S, recorded, week, 300, limit=60)
    assert len(missed) == 60 and missed[0] == week - timedelta(seconds=5 + 5)
    assert missed == sorted(missed, reverse=True)


class CountingSchedule:
    """A schedule that counts the ticks it computes (a cron step each, in a zone with DST)."""

    def __init__(self, schedule: Schedule) -> None:
        self.schedule, self.steps = schedule, 0

    def latest_tick_at_or_before(self, moment: datetime) -> datetime:
        self.steps += 1
        return self.schedule.latest_tick_at_or_before(moment)

    def next_ticks(self, after: datetime, count: int) -> list[datetime]:
        self.steps += count
        return self.schedule.next_ticks(after, count)

    def ticks_at_or_before(self, moment: datetime) -> Iterator[datetime]:
        for tick in self.schedule.ticks_at_or_before(moment):
            self.steps += 1
            yield tick


BERLIN_MINUTE = parse_schedule("* * * * *", "Europe/Berlin")


def minutes_back(now: datetime, count: int) -> list[datetime]:
    tick = BERLIN_MINUTE.latest_tick_at_or_before(now)
    return [tick - timedelta(minutes=i) for i in range(count)]


@pytest.mark.parametrize(
    ("recorded", "limit", "named", "why"),
    [
        (set(minutes_back(T, 10_000)[::2]), 10_000, MISSED_WALK // 2,
         "history_limit 10,000, every other minute recorded: only the walk's unrecorded ones"),
        ({T - timedelta(days=30)}, 10_000, MISSED_WALK - 1,
         "a month nobody ran: the newest MISSED_WALK ticks, the one still open aside"),
        ({T - timedelta(days=30)}, 5, 5, "at most `limit`"),
    ],
)  # fmt: skip
def test_the_missed_tick_walk_is_bounded_whatever_the_ledger_and_the_limit(
    recorded, limit, named, why
) -> None:
    """Before, the walk went back limit + len(recorded) + 8 ticks, each a cron step started 3 h
    ahead: ~10 s of CPU for a per-minute job in Europe/Berlin with history_limit 10,000."""
    now = T + timedelta(seconds=30)  # the tick T's window (60 s) is still open
    counting = CountingSchedule(BERLIN_MINUTE)
    missed = missed_ticks(counting, recorded, now, 300, limit=limit)  # type: ignore[arg-type]
    assert len(missed) == named, why
    assert counting.steps <= MISSED_WALK + 2, why  # the walk and the tick after `now`
    assert missed == sorted(missed, reverse=True) and not set(missed) & set(recorded)
    assert all(tick > now - timedelta(minutes=MISSED_WALK) for tick in missed)


def test_the_walk_covers_what_one_housekeeping_records() -> None:
    """A housekeeping records up to MAX_MISSED_PER_HOUSEKEEPING at once: the walk must reach
    them past the newest ticks whose windows are still open (at most one interval, plus
    MISSED_GRACE: three ticks of a 1 s schedule)."""
    every_second = parse_schedule("@every 1s")
    missed = missed_ticks(every_second, {T}, at(3600), 300, limit=MAX_MISSED_PER_HOUSEKEEPING)
    assert len(missed) == MAX_MISSED_PER_HOUSEKEEPING


@pytest.mark.parametrize(
    ("schedule", "moment"),
    [
        (BERLIN_MINUTE, datetime(2026, 10, 25, 1, 30, tzinfo=UTC)),  # 03:30 -> 02:00 CET twice
        (BERLIN_MINUTE, datetime(2026, 3, 29, 1, 30, tzinfo=UTC)),  # 02:00-03:00 skipped
        (parse_schedule("30 2 * * *", "Europe/Berlin"), datetime(2026, 3, 31, tzinfo=UTC)),
        (parse_schedule("*/7 * * * *", "Australia/Lord_Howe"), datetime(2026, 4, 5, tzinfo=UTC)),
        (EVERY_5S, at(2)),
    ],
)
def test_one_walk_back_matches_stepping_back_tick_by_tick(schedule, moment) -> None:
    walk = schedule.ticks_at_or_before(moment)
    stepped, tick = [], schedule.latest_tick_at_or_before(moment)
    for _ in range(200):
        stepped.append(tick)
        tick = schedule.latest_tick_at_or_before(tick - timedelta(seconds=1))
    assert [next(walk) for _ in range(200)] == stepped


def test_retention_prunes_the_oldest_beyond_the_limit() -> None:
    kept = [at(5 * i) for i in range(12)]
    now = at(60)
    assert to_prune(list(reversed(kept)), 10, now=now) == kept[:2]
    assert to_prune(kept, 12, now=now) == []
    assert to_prune(kept[:11], 10, now=now) == []  # within the slack: no delete on most runs
    many = [at(5 * i) for i in range(220)]
    now = at(5 * 220)
    assert to_prune(many, 200, now=now) == []  # 200 + 10% = 220 kept before a batch goes
    assert to_prune([*many, now], 200, now=now) == many[:21]  # then back to the newest 200
    assert to_prune([], 10, now=now) == []


@pytest.mark.parametrize(
    ("tick", "now", "expected", "why"),
    [
        (at(0), at(0), False, "the tick that is due"),
        (at(-3600), at(0), False, "an old record"),
        (at(3), at(0), False, "a worker whose clock is 3 s ahead claimed it early: real"),
        (at(MAX_EARLY_WAIT + 1), at(0), False, "as early as a claim that waited for its agent"),
        (at(FUTURE_TOLERANCE), at(0), False, "the tolerance itself is still believed"),
        (at(FUTURE_TOLERANCE + 1), at(0), True, "a second past it"),
        (at(300), at(0), True, "a few minutes ahead"),
        (FAR, at(0), True, "2099"),
    ],
)  # fmt: skip
def test_a_tick_later_than_now_plus_the_tolerance_is_suspect(
    tick: datetime, now: datetime, expected: bool, why: str
) -> None:
    assert suspect(tick, now) is expected, why


def later(*seconds: float) -> list[datetime]:
    """Ticks `seconds` after NOW, the retention tables' clock."""
    return [NOW + timedelta(seconds=s) for s in seconds]


NOW = at(5 * 11)  # the eleventh tick after T: REAL's newest
REAL = [at(5 * i) for i in range(12)]  # T .. NOW, one a tick: 12 records for a limit of 10


@pytest.mark.parametrize(
    ("ticks", "keep", "pruned", "why"),
    [
        ([*REAL, FAR], 10, REAL[:2], "a 2099 record is neither deleted nor counted"),
        ([*REAL[1:], FAR, *later(300)], 10, [],
         "11 real records are within the slack: the suspect ones evict none of them"),
        ([*REAL[:2], *later(*range(100, 10_000, 100))], 10, [],
         "99 future records: the 2 real ones stay, and so do they"),
        (later(*range(100, 3000, 100)), 10, [], "a ledger of suspect records only: none go"),
        ([*REAL, *later(3)], 10, REAL[:3],
         "a record claimed 3 s early by a worker whose clock is ahead is real: kept, counted"),
        ([*REAL, *later(FUTURE_TOLERANCE)], 10, REAL[:3], "so is one at the tolerance"),
    ],
)  # fmt: skip
def test_retention_never_deletes_or_counts_suspect_records(
    ticks: list[datetime], keep: int, pruned: list[datetime], why: str
) -> None:
    """Before, the newest `keep` by name were kept: records of 2099 pushed the real ledger out,
    the record of the run that had just ended first of all."""
    assert to_prune(ticks, keep, now=NOW) == pruned, why
    assert not any(suspect(tick, NOW) for tick in pruned), why


@pytest.mark.parametrize(
    ("sent", "received", "agent_date", "skew"),
    [
        (at(0.2), at(0.2), at(-3), 2.7),  # an answer at once: as judge_tick always judged
        (at(0.0), at(2.5), at(2), None),  # a loaded agent, 2.5 s to answer: its clock is right
        (at(0.0), at(2.5), at(-4), 4.75),  # a late answer and a clock 4-5 s behind ours
        (at(0.0), at(2.0), at(5), pytest.approx(-4.5)),  # this host behind, whatever the delay
        (at(0.0), at(1.0), at(-2), None),  # 2-3 s ahead by the middle, but 1 s of doubt
    ],
)
def test_the_answers_delay_is_no_evidence_of_skew(sent, received, agent_date, skew) -> None:
    """A read that waited 2.5 s in a queue answered with a Date 2.5 s after it was sent: before,
    that was reported as a skew, and a scheduler that saw one read before every claim, which
    loaded Consul more, which delayed the next answers (seen at 300 jobs on 3 replicas)."""
    assert clock_skew(sent, received, agent_date) == skew


@pytest.mark.parametrize(
    ("recorded", "now", "before", "unsettled", "why"),
    [
        (ticks(-10, 5), at(5.1), at(5), [at(0)],
         "a tick claimed at once after a gap: 0's window closes at 5, its grace at 7, so it "
         "cannot be called missed yet (-5 can: housekeeping records it now)"),
        (ticks(-10, 5), at(12), at(5), [],
         "later: their windows and the grace have passed, housekeeping records them"),
        (ticks(-10, -5, 0, 5), at(5.1), at(5), [], "nothing unrecorded"),
        (ticks(-10, 0, 5), at(9), at(5), [],
         "-5's window closed at 0, the grace at 2: missable at 9, no longer unsettled"),
        (ticks(5), at(5.1), at(5), [], "nothing older than the oldest record is judged"),
        (set(), at(5.1), at(5), [], "an empty ledger"),
        (ticks(-10, 5) | {FAR}, at(5.1), at(5), [at(0)],
         "a 2099 record changes nothing: the walk goes back from the tick just run"),
        (ticks(-86400, 5), at(-3600), at(5), [at(5 - 5 * i) for i in range(1, MISSED_WALK + 1)],
         "a clock stepped back an hour: no tick is missable, the walk still ends (it went "
         "back through the whole day before)"),
    ],
)  # fmt: skip
def test_unsettled_ticks_are_the_unrecorded_ones_not_missable_yet(
    recorded, now, before, unsettled, why
) -> None:
    """After a run, the ticks a later housekeeping must still record (ledger/ticks.py): the
    scheduler housekeeps again at its next run while there are any, not a minute later."""
    assert unsettled_ticks(EVERY_5S, recorded, now, 300, before) == unsettled, why


@pytest.mark.parametrize(
    ("host_ahead", "uncertainty", "said", "say"),
    [
        (None, 0.0, None, None),  # no answer yet: nothing known
        (1.9, 0.0, None, None),  # under SKEW_REPORTED
        (2.5, 0.0, None, 2.5),  # said
        (-65.0, 0.2, None, -65.0),  # behind, as much
        (2.5, 1.2, None, None),  # the answers allow under 2 s: no evidence
        (2.6, 0.0, 2.5, None),  # said already, moved under a second
        (4.0, 0.0, 2.5, 4.0),  # moved: said again
    ],
)
def test_a_skew_is_said_when_known_and_again_when_it_moves(
    host_ahead: float | None, uncertainty: float, said: float | None, say: float | None
) -> None:
    assert skew_to_say(host_ahead, uncertainty, said) == say
