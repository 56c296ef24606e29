"""`lockctl run` on the tick core (runner/on_core.py): the core's notes said as today's event
lines, and a tick's record as completed turned into today's exit status. Pure: no Consul, no
process (the real cluster's runs: every `lockctl run` of a scheduled job in tests/integration)."""

from __future__ import annotations

import io
import json
import signal
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from provision.errors import EXIT_ABORTED, EXIT_JOB_TIMEOUT, EXIT_LOCK_LOST
from provision.ledger.records import TickOutcome, TickRecord
from provision.outcomes import Outcome
from provision.runner.events import EventLog
from provision.runner.on_core import Said, TickAsk, core_job, ran_result
from provision.runner.results import RunOptions
from provision.tick.clock import VirtualClock
from provision.tick.edge import Note
from provision.timings import JobTimings
from provision.workers.config import JobConfig

TICK = datetime(2026, 1, 1, 0, 0, 10, tzinfo=timezone.utc)
TIMINGS = JobTimings(15.0, 15.0, 5.0, 5.0, 30.0, timeout=20.0)
JOB = JobConfig("job-a", "locks/a/.lock", TIMINGS, "@every 10s", "UTC", command=("true",))


def _record(outcome: TickOutcome, status: int | None, **more: Any) -> TickRecord:
    claimed = TickRecord(TICK, TickOutcome.RUNNING, worker="w1", session="s-1", lock_index=4)
    return claimed.completed(outcome, finished_at=TICK, exit_status=status, duration=1.0, **more)


@pytest.mark.parametrize(
    ("outcome", "status", "said", "code"),
    [
        (TickOutcome.SUCCEEDED, 0, Outcome.RAN, 0),
        (TickOutcome.FAILED, 3, Outcome.RAN, 3),
        (TickOutcome.FAILED, None, Outcome.RAN, 1),  # no status said: a failure all the same
        (TickOutcome.TIMED_OUT, -15, Outcome.TIMED_OUT, EXIT_JOB_TIMEOUT),
        (TickOutcome.LOST, 0, Outcome.LOST, EXIT_LOCK_LOST),
        (TickOutcome.INTERRUPTED, 143, Outcome.INTERRUPTED, 143),  # the job's own, as today
        (TickOutcome.INTERRUPTED, None, Outcome.INTERRUPTED, 128 + signal.SIGINT),
        (TickOutcome.ABORTED, 137, Outcome.ABORTED, EXIT_ABORTED),  # `lockctl abort`: 143
        (TickOutcome.ABORTED, None, Outcome.ABORTED, EXIT_ABORTED),  # cut in a retry's delay
    ],
)
def test_a_ticks_record_is_todays_exit_status(
    outcome: TickOutcome, status: int | None, said: Outcome, code: int
) -> None:
    result = ran_result(_record(outcome, status), signal.SIGINT)
    assert (result.outcome, result.exit_code) == (said, code)
    assert result.tick == TICK and result.lock_index == 4


def test_a_retried_ticks_result_counts_its_attempts() -> None:
    result = ran_result(_record(TickOutcome.SUCCEEDED, 0, attempts=(1, 0)))
    assert result.attempts == 2 and result.exit_code == 0


def test_min_hold_from_the_flag_overrides_the_config() -> None:
    ask = TickAsk(JOB, "w1", ("true",), RunOptions(min_hold=7.0), TICK)
    job = core_job(ask)
    assert job.timings.min_hold == 7.0 and job.timings.timeout == TIMINGS.timeout
    assert job.schedule.next_ticks(TICK, 1)[0] == TICK + timedelta(seconds=10)


class Heard:
    """A Said over an event stream read back as JSON lines."""

    def __init__(self) -> None:
        self.stream = io.StringIO()
        self.clock = VirtualClock(TICK)
        ask = TickAsk(JOB, "w1", ("true",), RunOptions(), TICK)
        self.said = Said(EventLog(JOB.name, "w1", self.stream), self.clock, ask)

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stream.getvalue().splitlines()]


def test_a_completion_is_released_or_lost_as_its_record_says() -> None:
    heard = Heard()
    heard.said(Note("completed", JOB.name, TICK, record=_record(TickOutcome.SUCCEEDED, 0)))
    heard.said(Note("completed", JOB.name, TICK, record=_record(TickOutcome.LOST, None)))
    released, lost = heard.lines()
    assert (released["event"], released["released"], released["child_status"]) == (
        "released",
        True,
        0,
    )
    assert (lost["event"], lost["released"], lost["lock_index"]) == ("lost", False, 4)


def test_a_catch_up_says_whether_it_goes_over_a_missed_record() -> None:
    heard = Heard()
    heard.clock.advance(12.5)
    missed = TickRecord(TICK, TickOutcome.MISSED, worker="w2")
    heard.said(Note("catch-up", JOB.name, TICK, record=missed))
    heard.said(Note("catch-up", JOB.name, TICK))
    over, fresh = heard.lines()
    assert (over["event"], over["recorded_missed"], over["lag_ms"]) == ("catch-up", True, 12500.0)
    assert fresh["recorded_missed"] is False


def test_a_catch_up_another_replica_ran_is_said_skipped_and_the_own_tick_only_once() -> None:
    """Two runs back after a gap both look for the same catch-up; the one whose claim is
    refused says so (the run's own tick's skip is said once, from its verdict, not here)."""
    heard = Heard()
    earlier = TICK - timedelta(seconds=10)
    heard.said(Note("catch-up", JOB.name, earlier))
    why = "tick 2026-01-01T00:00:00Z already taken by w2 (running)"
    heard.said(Note("skipped", JOB.name, earlier, why))
    heard.said(Note("skipped", JOB.name, TICK, "taken by w2"))
    look, refused = heard.lines()
    assert look["event"] == "catch-up"
    assert (refused["event"], refused["tick"], refused["reason"]) == (
        "skipped",
        "2026-01-01T00:00:00Z",
        why,
    )


def test_a_housekeeping_says_the_ticks_it_recorded_missed_and_paused() -> None:
    heard = Heard()
    earlier = [TICK - timedelta(seconds=10 * n) for n in (1, 2, 3)]
    paused = TickRecord(earlier[2], TickOutcome.PAUSED, worker="w1")
    for tick in earlier[:2]:
        heard.said(Note("missed", JOB.name, tick, record=TickRecord(tick, TickOutcome.MISSED)))
    heard.said(Note("missed", JOB.name, earlier[2], record=paused))
    heard.said(Note("housekeeping", JOB.name, None, "3 missed recorded, 4 pruned", count=4))
    (said,) = heard.lines()
    assert (said["event"], said["missed_recorded"], said["paused_recorded"], said["pruned"]) == (
        "housekeeping",
        2,
        1,
        4,
    )
    assert said["missed_ticks"] == ["2025-12-31T23:59:50Z", "2026-01-01T00:00:00Z"]


def test_the_pools_renewal_failure_is_said_and_its_other_notes_are_not() -> None:
    heard = Heard()
    heard.said(Note("session-created", "", None, "TTL 15s", session="s-1"))
    heard.said(Note("renew-failed", "", None, "no answer", session="s-1"))
    (said,) = heard.lines()
    assert (said["event"], said["session"], said["error"]) == ("renew-failed", "s-1", "no answer")


class AgentAhead:
    """The agent's clock as the turn's read taught it: this host is `ahead` seconds ahead."""

    def __init__(self, ahead: float) -> None:
        self.ahead = ahead
        self.uncertainty = timedelta(milliseconds=20)

    def host_ahead(self) -> float:
        return self.ahead


def test_a_skewed_host_clock_is_said_once_at_the_turns_first_note() -> None:
    heard = Heard()
    heard.said.agent_clock = AgentAhead(5.0)  # type: ignore[assignment]
    heard.said(Note("completed", JOB.name, TICK - timedelta(seconds=10)))  # not this turn's
    assert heard.lines() == []
    heard.said(Note("skipped", JOB.name, TICK, "taken"))
    heard.said(Note("too-late", JOB.name, TICK))
    (said,) = heard.lines()
    assert (said["event"], said["tick"], said["skew_ms"]) == (
        "clock-skew",
        "2026-01-01T00:00:10Z",
        5000.0,
    )


def test_a_host_clock_in_step_with_the_agents_is_not_said() -> None:
    heard = Heard()
    heard.said.agent_clock = AgentAhead(0.05)  # type: ignore[assignment]
    heard.said(Note("skipped", JOB.name, TICK, "taken"))
    assert heard.lines() == []


def test_a_renewal_a_retry_and_a_fence_are_said_with_their_figures() -> None:
    heard = Heard()
    heard.said(Note("renewed", "", None, session="s-1", seconds=0.0042))
    heard.said(Note("retrying", JOB.name, TICK, "attempt 2 after status 3", seconds=5.0))
    heard.said(Note("fenced", JOB.name, TICK, "the session is gone", seconds=12.5))
    renewed, retrying, fenced = heard.lines()
    assert (renewed["event"], renewed["session"], renewed["took_ms"]) == ("renewed", "s-1", 4.2)
    assert (retrying["event"], retrying["attempt"], retrying["delay_ms"]) == ("retrying", 1, 5000.0)
    assert (fenced["reason"], fenced["since_confirmed_ms"]) == ("the session is gone", 12500.0)


def test_a_housekeeping_says_the_ticks_it_recorded_blackout_apart_from_the_missed() -> None:
    heard = Heard()
    earlier = [TICK - timedelta(seconds=10 * n) for n in (1, 2)]
    held = TickRecord(earlier[1], TickOutcome.BLACKOUT, worker="w1", window="freeze")
    heard.said(
        Note("missed", JOB.name, earlier[0], record=TickRecord(earlier[0], TickOutcome.MISSED))
    )
    heard.said(Note("missed", JOB.name, earlier[1], record=held))
    heard.said(Note("housekeeping", JOB.name, None, "2 recorded", count=0))
    (said,) = heard.lines()
    assert (said["missed_recorded"], said["blackout_recorded"]) == (1, 1)
    assert said["missed_ticks"] == ["2026-01-01T00:00:00Z"]


def test_an_abort_of_this_run_is_said_with_who_and_why_a_past_runs_note_goes_unsaid() -> None:
    heard = Heard()
    heard.said.sessions[TICK] = "s-1"  # this process claimed TICK (its `acquired`)
    asked = "by ops at 2026-01-01T00:00:12.000Z: stuck (tick 2026-01-01T00:00:10Z)"
    heard.said(Note("aborted", JOB.name, TICK, asked))
    heard.said(Note("abort", JOB.name, TICK, "names no run of this replica"))  # another session
    heard.said(Note("abort", JOB.name, TICK - timedelta(hours=1), "names no run of this replica"))
    aborted, ignored = heard.lines()
    assert (aborted["event"], aborted["session"], aborted["asked"]) == ("aborted", "s-1", asked)
    assert (ignored["event"], ignored["tick"]) == ("abort-ignored", "2026-01-01T00:00:10Z")
