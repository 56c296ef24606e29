"""`lockctl check`'s rules (provision/ledger/health.py) and the history they judge
(provision/ledger/history.py): tables of ledgers, no Consul."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from provision.blackouts import Blackout
from provision.ledger.health import State, assess, closed_ticks, read_enough
from provision.ledger.history import (
    ABANDONED,
    SUSPECT_READ,
    JobHistory,
    LedgerJob,
    LedgerSnapshot,
    Wanted,
    build_history,
    wanted_ticks,
)
from provision.ledger.records import (
    RECORD_MAX_BYTES,
    TickOutcome,
    TickRecord,
    oversized,
    tick_name,
)
from provision.ledger.since import Earliest, parse_since, read_since
from provision.schedule import parse_schedule

HOURLY = parse_schedule("@hourly")
NOW = datetime(2026, 12, 1, 10, 30, tzinfo=timezone.utc)  # the 10:00 tick's window closed
JOB = LedgerJob("nightly", "locks/nightly/.lock", HOURLY, 300.0, 200)
S, F, L, X, M, R, U = "succeeded", "failed", "lost", "interrupted", "missed", "running", "unread"
T, P, A, C, B = "timed-out", "paused", "aborted", "cancelled", "buffered"
OUTCOMES = {
    B: TickOutcome.BUFFERED,
    C: TickOutcome.CANCELLED,
    A: TickOutcome.ABORTED,
    P: TickOutcome.PAUSED,
    T: TickOutcome.TIMED_OUT,
    S: TickOutcome.SUCCEEDED,
    F: TickOutcome.FAILED,
    L: TickOutcome.LOST,
    X: TickOutcome.INTERRUPTED,
    M: TickOutcome.MISSED,
    R: TickOutcome.RUNNING,
    U: TickOutcome.UNREADABLE,
}


def at(hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 12, 1, hour, minute, tzinfo=timezone.utc)


def record(hour: int, outcome: str, session: str | None = "s-old") -> TickRecord:
    exit_status = {S: 0, F: 3, T: 137}.get(outcome)
    return TickRecord(
        at(hour), OUTCOMES[outcome], worker="worker-1", session=session, exit_status=exit_status
    )


def history(
    records: list[TickRecord], now: datetime = NOW, lock: str | None = "s-old"
) -> JobHistory:
    return build_history(JOB, LedgerSnapshot(tuple(records), lock, now), now)


# (records as (hour, outcome), expected state, reasons that must appear)
CASES = [
    ("no record at all", [], State.OK, ["no ticks recorded yet"]),
    ("the last two ticks succeeded", [(9, S), (10, S)], State.OK, ["last success"]),
    ("a run is still going", [(9, S), (10, R)], State.OK, []),
    ("the last run failed", [(8, S), (9, S), (10, F)], State.WARNING, ["last run", "failed"]),
    ("the last run was fenced", [(9, S), (10, L)], State.WARNING, ["lost"]),
    ("the last run was interrupted", [(9, S), (10, X)], State.WARNING, ["interrupted"]),
    (
        "the last run timed out (which tick, its exit status)",
        [(9, S), (10, T)],
        State.WARNING,
        ["last run 2026-12-01T10:00:00Z timed-out (exit 137, on worker-1)"],
    ),
    ("a timeout then a success", [(9, T), (10, S)], State.OK, []),
    ("the last record is garbage", [(9, S), (10, U)], State.WARNING, ["unreadable"]),
    ("a failure then a success", [(9, F), (10, S)], State.OK, []),
    ("recorded missed among the recent", [(8, S), (9, M), (10, S)], State.CRITICAL, ["missed"]),
    ("missed but not recent", [(7, S), (8, M), (9, S), (10, S)], State.OK, []),
    ("computed missed (nobody ran 9:00)", [(8, S), (10, S)], State.CRITICAL, ["not recorded"]),
    ("every tick missed", [(8, M), (9, M), (10, M)], State.CRITICAL, ["no success since"]),
    ("all runners stopped after 8:00", [(8, S)], State.CRITICAL, ["missed", "no success in"]),
    ("two failures: no success in 2", [(8, S), (9, F), (10, F)], State.CRITICAL, ["failed"]),
    ("first record is the running tick", [(10, R)], State.OK, []),
    ("first record failed, one tick", [(10, F)], State.WARNING, ["failed"]),
    ("never a success over 2 ticks", [(9, F), (10, F)], State.CRITICAL, ["no success since"]),
    # an operator paused the job: its paused ticks are no run due, so none is missing
    ("paused for the last three ticks", [(7, S), (8, P), (9, P), (10, P)], State.OK, []),
    ("paused since the first record", [(8, P), (9, P), (10, P)], State.OK, []),
    ("a failure, then paused", [(6, S), (7, F), (8, P), (9, P), (10, P)], State.WARNING, ["7"]),
    ("paused, then a failure", [(7, S), (8, P), (9, P), (10, F)], State.WARNING, ["failed"]),
    ("paused, resumed, failing", [(6, S), (7, P), (8, P), (9, F), (10, F)], State.CRITICAL, []),
    ("paused, but a tick missed", [(7, S), (8, P), (9, M), (10, P)], State.CRITICAL, ["missed"]),
    # an operator aborted a run (lockctl abort): neither a success nor a failure; the ticks
    # judged reach back past it, as past a paused one
    ("the last run was aborted", [(8, S), (9, S), (10, A)], State.OK, []),
    ("a failure, then aborted", [(8, S), (9, F), (10, A)], State.WARNING, ["9:00:00Z failed"]),
    ("aborted, then a success", [(9, A), (10, S)], State.OK, []),
    ("aborted, and a tick missed", [(8, S), (9, M), (10, A)], State.CRITICAL, ["missed"]),
    ("the last run was cancelled (overlap)", [(8, S), (9, S), (10, C)], State.OK, []),
    ("a failure, then cancelled", [(8, S), (9, F), (10, C)], State.WARNING, ["9:00:00Z failed"]),
    ("cancelled, and a tick missed", [(8, S), (9, M), (10, C)], State.CRITICAL, ["missed"]),
    # overlap = "buffer_one": a tick still `buffered` past its start deadline was never run
    ("left buffered past its deadline", [(9, S), (10, B)], State.CRITICAL, ["buffered, never"]),
]


def test_a_tick_buffered_within_its_start_deadline_is_no_problem() -> None:
    rows = [record(9, S), record(10, R), TickRecord(at(10, 1), TickOutcome.BUFFERED)]
    now = at(10, 3)
    health = assess(history(rows, now=now), JOB.start_deadline)
    assert health.state is State.OK, health.line()
    later = assess(history(rows, now=at(10, 7)), JOB.start_deadline)  # 10:01 + 300 s + grace
    assert "missed 2026-12-01T10:01:00Z (buffered, never run)" in later.line()


@pytest.mark.parametrize(("name", "rows", "state", "reasons"), CASES, ids=[c[0] for c in CASES])
def test_check_rules(
    name: str, rows: list[tuple[int, str]], state: State, reasons: list[str]
) -> None:
    health = assess(history([record(h, o) for h, o in rows]), JOB.start_deadline)
    line = health.line()
    assert health.state is state, line
    for reason in reasons:
        assert reason in line, line
    assert line.startswith(f"{state.name} nightly: ") and "next 2026-12-01T11:00:00Z" in line


def test_a_running_record_whose_session_lost_the_lock_is_abandoned_and_warns() -> None:
    rows = [record(9, S), record(10, R, session="s-dead")]
    alive = history(rows, lock="s-dead")
    assert alive.rows[0].outcome == "running"
    dead = history(rows, lock="s-other")  # another session holds the lock now
    assert dead.rows[0].outcome == ABANDONED and dead.rows[0].recorded
    health = assess(dead, JOB.start_deadline)
    assert health.state is State.WARNING and "abandoned" in health.line()
    assert history(rows, lock=None).rows[0].outcome == ABANDONED  # the lock is free


def test_max_intervals_widens_what_counts_as_recent() -> None:
    rows = [record(h, o) for h, o in [(6, S), (7, M), (8, S), (9, S), (10, S)]]
    assert assess(history(rows), JOB.start_deadline, 2).state is State.OK
    assert assess(history(rows), JOB.start_deadline, 4).state is State.CRITICAL
    stale = [record(6, S), record(7, F), record(8, F), record(9, F), record(10, F)]
    assert assess(history(stale), JOB.start_deadline, 5).state is State.WARNING
    assert assess(history(stale), JOB.start_deadline, 4).state is State.CRITICAL


def test_a_tick_still_in_its_window_is_not_judged() -> None:
    """At 10:03 the 10:00 tick may still be claimed (deadline 5 min): not missed, not recent."""
    early = at(10, 3)
    assert closed_ticks(HOURLY, early, 300.0, 2) == [at(9), at(8)]
    health = assess(history([record(8, S), record(9, S)], now=early), JOB.start_deadline)
    assert health.state is State.OK, health.line()
    late = at(10, 5) + timedelta(seconds=3)  # window + 2 s grace passed
    health = assess(history([record(8, S), record(9, S)], now=late), JOB.start_deadline)
    assert health.state is State.CRITICAL and "missed 2026-12-01T10:00:00Z" in health.line()


def test_history_names_unrecorded_missed_ticks_newest_first() -> None:
    found = history([record(7, S), record(10, S)])
    assert [tick_name(r.tick) for r in found.rows] == [
        "2026-12-01T10:00:00Z",
        "2026-12-01T09:00:00Z",
        "2026-12-01T08:00:00Z",
        "2026-12-01T07:00:00Z",
    ]
    assert [r.label for r in found.rows[1:3]] == ["missed (not recorded yet)"] * 2
    assert found.unrecorded_missed == [at(9), at(8)]
    json_rows = found.to_record()["ticks"]
    assert json_rows[1]["outcome"] == "missed" and json_rows[1]["recorded"] is False
    assert found.since(at(9)).unrecorded_missed == [at(9)]


def test_the_ok_line_has_the_documented_shape() -> None:
    line = assess(history([record(9, S), record(10, S)]), JOB.start_deadline).line()
    assert line == (
        "OK nightly: last success 2026-12-01T10:00:00Z (30m ago), next 2026-12-01T11:00:00Z"
    )


def test_a_pipe_in_a_record_cannot_start_nagios_performance_data() -> None:
    hostile = TickRecord(at(10), TickOutcome.FAILED, worker="w|evil=1", exit_status=1)
    line = assess(history([record(9, S), hostile]), JOB.start_deadline).line()
    assert "|" not in line and "w\\x7cevil=1" in line


NOW_SINCE = datetime(2026, 12, 8, 12, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("24h", datetime(2026, 12, 7, 12, 0, tzinfo=timezone.utc)),
        ("90m", datetime(2026, 12, 8, 10, 30, tzinfo=timezone.utc)),
        ("7d", datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)),
        ("2026-12-01", datetime(2026, 12, 1, tzinfo=timezone.utc)),
        ("2026-12-01T02:00:00Z", datetime(2026, 12, 1, 2, tzinfo=timezone.utc)),
        ("2026-12-01T03:00:00+01:00", datetime(2026, 12, 1, 2, tzinfo=timezone.utc)),
        ("2026-12-01 02:00", datetime(2026, 12, 1, 2, tzinfo=timezone.utc)),
    ],
)
def test_since_takes_a_duration_back_or_an_iso_time(text: str, expected: datetime) -> None:
    assert parse_since(text, NOW_SINCE) == expected


def test_a_duration_since_counts_back_from_the_clock_the_ledger_is_read_on() -> None:
    """`--since 24h` waits for Consul's clock (the read's Date), a date does not."""
    consul_now = NOW_SINCE - timedelta(hours=13)  # this host 13 h ahead of Consul
    assert read_since("24h") == Earliest(back=timedelta(hours=24))
    assert read_since("24h").start(consul_now) == consul_now - timedelta(hours=24)
    assert read_since("2026-12-01").start(consul_now) == datetime(2026, 12, 1, tzinfo=timezone.utc)
    ticks = frozenset(NOW_SINCE - timedelta(hours=h) for h in (12, 36, 60))
    wanted = Wanted(10, back=timedelta(hours=48))  # as `history` asks, with no clock yet
    # 12-08 00:00 is in Consul's future (suspect); both others are within 48 h of its clock
    # (from this host's, 12-06 00:00 would be 60 h back)
    assert wanted_ticks(ticks, consul_now, wanted)[0] == [
        datetime(2026, 12, 7, tzinfo=timezone.utc),
        datetime(2026, 12, 6, tzinfo=timezone.utc),
    ]
    both = Wanted(10, since=consul_now - timedelta(hours=1), back=timedelta(hours=48))
    assert both.earliest(consul_now) == consul_now - timedelta(hours=1)  # the later bound


@pytest.mark.parametrize("text", ["yesterday", "7 days", "-24h", "1w", "", "2026-13-01", "9" * 500])
def test_since_refuses_anything_else_in_one_line(text: str) -> None:
    with pytest.raises(ValueError, match="neither a duration") as raised:
        parse_since(text, NOW_SINCE)
    assert "\n" not in str(raised.value) and len(str(raised.value)) < 200


# --- suspect records: dated in the future ------------------------------------------------------

FAR = datetime(2099, 1, 1, tzinfo=timezone.utc)
SOON = NOW + timedelta(minutes=5)  # a few minutes ahead: no runner claims that early


def dated(tick: datetime, outcome: str) -> TickRecord:
    return TickRecord(tick, OUTCOMES[outcome], worker="worker-1", session="s-old", exit_status=0)


# (records as (hour, outcome), suspect records, expected state, in the line, not in the line)
SUSPECT_CASES = [
    ("a 2099 success beside two real ones", [(9, S), (10, S)], [dated(FAR, S)], State.WARNING,
     ["1 suspect record, dated in the future (2099-01-01T00:00:00Z)",
      "last success 2026-12-01T10:00:00Z (30m ago)"], ["last success 2099"]),
    ("a 2099 success hides no stopped runner", [(8, S)], [dated(FAR, S)], State.CRITICAL,
     ["missed 2026-12-01T10:00:00Z", "no success in the last 2 ticks", "suspect"], []),
    ("a 2099 success hides no failure", [(9, S), (10, F)], [dated(FAR, S)], State.WARNING,
     ["last run 2026-12-01T10:00:00Z failed", "suspect"], []),
    ("a 2099 failure is not the last run", [(9, S), (10, S)], [dated(FAR, F)], State.WARNING,
     ["suspect", "last success 2026-12-01T10:00:00Z"], ["last run"]),
    ("a success 5 minutes ahead", [(9, F), (10, F)], [dated(SOON, S)], State.CRITICAL,
     ["no success since the first record", "1 suspect record"], ["last success"]),
    ("only a 2099 record", [], [dated(FAR, S)], State.WARNING,
     ["1 suspect record", "no run recorded yet"], ["last success", "no ticks recorded yet"]),
    ("many suspect records are counted, a few named", [(9, S), (10, S)],
     [dated(FAR + timedelta(days=d), S) for d in range(5)], State.WARNING,
     ["5 suspect records, dated in the future (2099-01-05T00:00:00Z, 2099-01-04T00:00:00Z, "
      "2099-01-03T00:00:00Z and 2 more)"], ["2099-01-02"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "rows", "future", "state", "present", "absent"),
    SUSPECT_CASES,
    ids=[c[0] for c in SUSPECT_CASES],
)
def test_check_judges_the_real_records_and_warns_of_suspect_ones(
    name: str,
    rows: list[tuple[int, str]],
    future: list[TickRecord],
    state: State,
    present: list[str],
    absent: list[str],
) -> None:
    health = assess(history([record(h, o) for h, o in rows] + future), JOB.start_deadline)
    line = health.line()
    assert health.state is state, line
    for text in present:
        assert text in line, line
    for text in absent:
        assert text not in line, line
    assert health.last_success is None or health.last_success <= NOW


def test_a_record_a_few_seconds_early_is_a_real_run() -> None:
    """At 10:59:57 a worker whose clock is 3 s ahead claimed the 11:00 tick: a run, not a
    suspect record (it must not be called one, nor deleted: it would let 11:00 run again)."""
    early = at(10, 59) + timedelta(seconds=57)
    found = history([record(9, S), record(10, S), record(11, R)], now=early)
    assert found.suspect == () and found.last is not None and found.last.tick == at(11)
    health = assess(found, JOB.start_deadline)
    assert health.state is State.OK and "suspect" not in health.line(), health.line()


def test_history_shows_suspect_records_marked_and_never_as_the_last_run() -> None:
    found = history([record(9, S), record(10, F), dated(SOON, S), dated(FAR, S)])
    assert [row.tick for row in found.rows] == [FAR, SOON, at(10), at(9)]
    assert [row.tick for row in found.suspect] == [FAR, SOON]
    assert [row.tick for row in found.runs] == [at(10), at(9)]
    assert found.last is not None and (found.last.tick, found.last.outcome) == (at(10), F)
    assert found.rows[0].label == "suspect: dated in the future (says succeeded)"
    json_row = found.to_record()["ticks"][0]
    assert (json_row["outcome"], json_row["recorded_outcome"]) == ("suspect", "succeeded")
    assert json_row["tick"] == "2099-01-01T00:00:00Z" and json_row["recorded"] is True
    assert [row.tick for row in found.since(at(10)).suspect] == [FAR, SOON]


# --- bounded reads: which records a reader reads -------------------------------------------------


def hours_back(count: int) -> list[datetime]:
    return [at(10) - timedelta(hours=h) for h in range(count)]


FORGED = [FAR + timedelta(days=d) for d in range(5000)]  # anyone with write may write these


@pytest.mark.parametrize(
    ("names", "wanted", "real", "future", "why"),
    [
        (hours_back(300), Wanted(50), hours_back(50), [], "the newest `limit`, newest first"),
        (hours_back(300), Wanted(50, since=at(8)), hours_back(3), [], "none before --since"),
        (hours_back(300) + FORGED, Wanted(1), hours_back(1), FORGED[::-1][:SUSPECT_READ],
         "5,000 forged future names push out no real record; a few are read, all counted"),
        ([], Wanted(50), [], [], "an empty ledger"),
    ],
)  # fmt: skip
def test_a_reader_reads_the_newest_records_it_needs_whatever_the_ledger_names(
    names, wanted, real, future, why
) -> None:
    """Before, history, status and check read every record whole: 100 records of 500 KB took
    260 MB and 4 s; now the names are read, then these records only."""
    assert wanted_ticks(frozenset(names), NOW, wanted) == (real, future), why


def newest_first(*rows: tuple[int, str]) -> list[TickRecord]:
    return [record(h, o) for h, o in rows]


@pytest.mark.parametrize(
    ("read", "enough", "why"),
    [
        (newest_first((10, S)), False, "the 9:00 tick is recent too: a missed record there"),
        (newest_first((10, S), (9, M)), True, "a success, and back to the oldest recent tick"),
        (newest_first((10, F), (9, F)), False, "no success yet: read on (check names the last)"),
        (newest_first((10, F), (9, F), (5, S)), True, "the last success, however old"),
        ([], False, "nothing read yet"),
    ],
)
def test_check_reads_back_to_a_success_and_its_recent_ticks_then_stops(read, enough, why) -> None:
    """What assess looks at: the recent ticks (missed records among them), the newest settled
    run and the last success; records older than all three change nothing it says."""
    assert read_enough(HOURLY, JOB.start_deadline, 2)(read, NOW) is enough, why


def test_a_record_too_large_to_read_is_counted_named_and_warns() -> None:
    key = "locks/nightly/ticks/2026-12-01T08:00:00Z"
    problem = oversized(at(8), key)
    assert problem.line() == (
        f"{key}: value: more than {RECORD_MAX_BYTES} bytes, over the {RECORD_MAX_BYTES}-byte cap "
        "of a tick record: not read"
    )
    records = (record(8, U), record(9, S), record(10, S))
    found = build_history(JOB, LedgerSnapshot(records, "s-old", NOW, problems=(problem,)), NOW)
    assert [row.label for row in found.rows] == [
        "succeeded",
        "succeeded",
        "unreadable (too large: not read)",
    ]
    assert found.to_record()["problems"] == [{"key": key, "field": "value", "why": problem.why}]
    health = assess(found, JOB.start_deadline)
    assert health.state is State.WARNING
    assert f"1 record too large to read ({key}: value: more than" in health.line()


def test_suspect_records_are_counted_by_name_even_those_not_read() -> None:
    names = frozenset([at(9), at(10), *FORGED])
    read = (record(9, S), record(10, S), dated(FORGED[-1], S))
    found = build_history(JOB, LedgerSnapshot(read, "s-old", NOW, names), NOW)
    assert found.suspect_count == len(FORGED) and len(found.suspect) == 1
    line = assess(found, JOB.start_deadline).line()
    assert f"{len(FORGED)} suspect records, dated in the future (" in line, line
    assert f"and {len(FORGED) - 1} more)" in line, line


def test_ticks_a_blackout_window_held_are_shown_blackout_and_do_not_page() -> None:
    """09:00 and 10:00 nobody ran, in a window of 08:30 to 10:15: shown `blackout` (not
    recorded yet: `check` records them so), and the job is judged on the ticks before it."""
    window = Blackout("freeze", parse_schedule("30 8 * * *"), 6300.0)
    job = replace(JOB, blackouts=(window,))
    rows = (record(7, S), record(8, S))
    found = build_history(job, LedgerSnapshot(rows, "s-old", NOW), NOW)
    unrun = [(r.tick.hour, r.outcome, r.label) for r in found.rows if not r.recorded]
    assert unrun == [
        (10, "blackout", "blackout (not recorded yet, window freeze)"),
        (9, "blackout", "blackout (not recorded yet, window freeze)"),
    ]
    assert found.unrecorded_missed == [at(10), at(9)]
    without = build_history(JOB, LedgerSnapshot(rows, "s-old", NOW), NOW)
    assert assess(without, JOB.start_deadline, 2).state is State.CRITICAL  # the control
    recorded = [TickRecord(at(h), TickOutcome.BLACKOUT, window="freeze") for h in (9, 10)]
    held = build_history(job, LedgerSnapshot((*rows, *recorded), "s-old", NOW), NOW)
    assert assess(held, JOB.start_deadline, 2).state is State.OK
    assert [r.label for r in held.rows[:2]] == ["blackout (window freeze)"] * 2
