"""Retries (issue 21 item 2): the retry decision and the delay's verdict as tables, the record's
attempts and how history shows them, the spec's keys, the worker config and the counts."""

from __future__ import annotations

import io
import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from provision.ledger.attempts import attempts_text, decode_attempts, decode_cut
from provision.ledger.records import TickOutcome, TickRecord, decode
from provision.outcomes import Outcome
from provision.scheduler.report import CoreReport
from provision.spec import SpecError, parse_spec
from provision.tick.edge import Note
from provision.tick.retries import Retry, Stop, StopReason, delay_verdict, next_attempt
from provision.timings import JobTimings
from provision.workers.config import config_record, load_worker_config

T = JobTimings(ttl=15, lock_delay=15, renew_interval=5, kill_grace=5)
TWO = JobTimings(ttl=15, lock_delay=15, renew_interval=5, kill_grace=5, retries=2, retry_delay=30)
ON_TIMEOUT = JobTimings(
    ttl=15, lock_delay=15, renew_interval=5, kill_grace=5, retries=1, retry_on_timeout=True
)
RAN, LOST, TIMED_OUT = Outcome.RAN, Outcome.LOST, Outcome.TIMED_OUT


@pytest.mark.parametrize(
    ("verdict", "status", "attempt", "timings", "now", "next_tick", "expected"),
    [
        # success ends it, retries or not
        (RAN, 0, 1, TWO, 100.0, None, Stop(StopReason.SUCCEEDED)),
        (RAN, 0, 3, TWO, 100.0, None, Stop(StopReason.SUCCEEDED)),
        # no retries configured: a failure is final
        (RAN, 1, 1, T, 100.0, None, Stop(StopReason.NOT_RETRIED)),
        # a failure with retries left: the next attempt after retry_delay
        (RAN, 1, 1, TWO, 100.0, None, Retry(2, 130.0)),
        (RAN, 137, 2, TWO, 100.0, 200.0, Retry(3, 130.0)),
        # retries + 1 attempts made: no more
        (RAN, 1, 3, TWO, 100.0, None, Stop(StopReason.EXHAUSTED)),
        # never at or past the next tick's instant
        (RAN, 1, 1, TWO, 100.0, 130.0, Stop(StopReason.NEXT_TICK)),
        (RAN, 1, 1, TWO, 100.0, 129.0, Stop(StopReason.NEXT_TICK)),
        (RAN, 1, 1, TWO, 100.0, 130.5, Retry(2, 130.0)),
        # a lost (fenced) or interrupted run is never retried
        (LOST, 1, 1, TWO, 100.0, None, Stop(StopReason.NOT_RETRIED)),
        (LOST, None, 1, TWO, 100.0, None, Stop(StopReason.NOT_RETRIED)),
        (Outcome.INTERRUPTED, 143, 1, TWO, 100.0, None, Stop(StopReason.NOT_RETRIED)),
        # a timed-out attempt only with retry_on_timeout
        (TIMED_OUT, 137, 1, TWO, 100.0, None, Stop(StopReason.NOT_RETRIED)),
        (TIMED_OUT, 137, 1, ON_TIMEOUT, 100.0, None, Retry(2, 110.0)),
        (TIMED_OUT, 137, 2, ON_TIMEOUT, 100.0, None, Stop(StopReason.EXHAUSTED)),
        # exited 0 but timed out (stopped, its tree killed): a timed-out attempt all the same
        (TIMED_OUT, 0, 1, ON_TIMEOUT, 100.0, None, Retry(2, 110.0)),
        # a job killed by a signal under the lock failed (128 + N): retried
        (RAN, 139, 1, TWO, 100.0, None, Retry(2, 130.0)),
    ],
)
def test_next_attempt(
    verdict: Outcome,
    status: int | None,
    attempt: int,
    timings: JobTimings,
    now: float,
    next_tick: float | None,
    expected: Retry | Stop,
) -> None:
    assert next_attempt(verdict, status, attempt, timings, now, next_tick) == expected


@pytest.mark.parametrize(
    ("now", "lost", "stop", "expected"),
    [
        (10.0, False, None, None),  # confirmed 9 s ago, bound 10 s: wait on
        (11.0, False, None, LOST),  # not confirmed within the fencing bound: no next attempt
        (5.0, True, None, LOST),  # Consul said the lock is gone
        (5.0, False, 15, Outcome.INTERRUPTED),
        (5.0, True, 15, LOST),  # a loss outranks the stop: the record must say lost
    ],
)
def test_delay_verdict(now: float, lost: bool, stop: int | None, expected: Outcome | None) -> None:
    assert delay_verdict(now, 1.0, 10.0, lost, stop) == expected


@pytest.mark.parametrize(
    ("outcome", "attempts", "cut", "shown"),
    [
        ("succeeded", None, None, "succeeded"),
        ("succeeded", (0,), None, "succeeded"),
        ("succeeded", (1, 0), None, "succeeded (2nd attempt)"),
        ("succeeded", (1, 1, 0), None, "succeeded (3rd attempt)"),
        ("succeeded", (1,) * 10 + (0,), None, "succeeded (11th attempt)"),
        ("failed", (1, 1, 1), None, "failed (3 attempts)"),
        ("failed", (1,), "next-tick", "failed (1 attempt, retries cut by the next tick)"),
        ("failed", (1, 2), "stop-requested", "failed (2 attempts, retries cut by a stop request)"),
        ("timed-out", (1, 137), None, "timed-out (2 attempts)"),
        ("lost", (1, None), None, "lost (2 attempts)"),
    ],
)
def test_history_shows_the_attempts(
    outcome: str, attempts: tuple[int | None, ...] | None, cut: str | None, shown: str
) -> None:
    assert attempts_text(outcome, attempts, cut) == shown


TICK = datetime(2026, 12, 4, 22, 0, tzinfo=timezone.utc)


def test_a_record_keeps_each_attempts_status_within_its_budget() -> None:
    record = TickRecord(
        TICK,
        TickOutcome.SUCCEEDED,
        worker="w" * 64,
        exit_status=0,
        attempts=(1, 0),
        stdout="x" * 5000,
        stderr="y" * 5000,
    )
    value = record.encode()
    assert b'"attempts":[1,0]' in value and len(value) <= 4096
    back = decode(TICK, value)
    assert (back.attempts, back.retries_cut, back.exit_status) == ((1, 0), None, 0)
    most = TickRecord(TICK, TickOutcome.FAILED, attempts=(-(2**31),) * 11, retries_cut="next-tick")
    assert decode(TICK, most.encode()).attempts == (-(2**31),) * 11
    assert b"attempts" not in TickRecord(TICK, TickOutcome.SUCCEEDED, exit_status=0).encode()


@pytest.mark.parametrize(
    "value", [[], [1] * 12, ["1"], [1.5], [True], [2**40], {"a": 1}, "1,0", None]
)
def test_attempts_written_by_anyone_else_are_not_believed(value: object) -> None:
    assert decode_attempts(value) is None
    raw = json.dumps({"format": 1, "tick": "x", "outcome": "failed", "attempts": value})
    assert decode(TICK, raw.encode()).attempts is None


def test_a_cut_is_one_of_lockctls_own_words() -> None:
    assert decode_cut("next-tick") == "next-tick"
    assert decode_cut("\x1b[31mevil") is None and decode_cut(3) is None


SPEC = """worker "worker-1" { address = "http://127.0.0.21:8500" }
defaults {
  retries     = 2
  retry_delay = "30s"
}
job "inherits" {
  prefix   = "locks/inherits/"
  workers  = ["worker-1"]
  schedule = "@hourly"
}
job "own" {
  prefix           = "locks/own/"
  workers          = ["worker-1"]
  schedule         = "@every 1m"
  retries          = 10
  retry_delay      = "0s"
  retry_on_timeout = true
}
job "none" {
  prefix  = "locks/none/"
  workers = ["worker-1"]
  retries = 0
}
"""


def test_the_spec_settles_retries_into_the_jobs_timings() -> None:
    jobs = {job.name: job.timings for job in parse_spec(SPEC, "r.hcl").jobs}
    shown = {name: (t.retries, t.retry_delay, t.retry_on_timeout) for name, t in jobs.items()}
    assert shown == {
        "inherits": (2, 30.0, False),
        "own": (10, 0.0, True),
        "none": (0, 30.0, False),
    }
    plain = parse_spec(SPEC.replace('retry_delay = "30s"', ""), "r.hcl").jobs[0].timings
    assert (plain.retries, plain.retry_delay, plain.retry_on_timeout) == (2, 10.0, False)


def test_a_retry_delay_as_long_as_an_every_schedules_interval_is_refused_at_its_line() -> None:
    text = SPEC.replace('retry_delay      = "0s"', 'retry_delay      = "1m"')
    with pytest.raises(SpecError) as caught:
        parse_spec(text, "r.hcl")
    assert str(caught.value.problems[0]) == (
        'r.hcl:16: job "own".retry_delay: retry_delay 1m must be below the schedule\'s '
        "interval 1m, or no retry could start before the next tick"
    )
    inherited = SPEC.replace('"@hourly"', '"@every 30s"')  # the defaults' 30s on the job's line
    with pytest.raises(SpecError) as caught:
        parse_spec(inherited, "r.hcl")
    assert str(caught.value.problems[0]).startswith('r.hcl:9: job "inherits".schedule: retry')


def test_the_worker_config_carries_retries_only_when_the_job_retries(tmp_path: Path) -> None:
    record = config_record(parse_spec(SPEC, "r.hcl"), "worker-1", Path("/t"))
    jobs = record["jobs"]
    assert {k: jobs["own"][k] for k in ("retries", "retry_delay", "retry_on_timeout")} == {
        "retries": 10,
        "retry_delay": "0s",
        "retry_on_timeout": True,
    }
    assert not {"retries", "retry_delay", "retry_on_timeout"} & set(jobs["none"])
    path = tmp_path / "lockctl.json"
    path.write_text(json.dumps(record))
    loaded = load_worker_config(path)
    assert loaded.job("inherits").timings.retries == 2
    assert loaded.job("inherits").timings.retry_delay == 30.0
    assert loaded.job("own").timings.retry_on_timeout is True
    assert loaded.job("none").timings.retries == 0  # as an older lockctl's config says


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("retries", 11, "jobs.own.retries: 11 is outside 0..10"),
        ("retries", "2", "jobs.own.retries: must be a whole number, 0..10"),
        ("retry_delay", "2h", "jobs.own.retry_delay: 2h is outside 0s..1h"),
        ("retry_on_timeout", "yes", "jobs.own.retry_on_timeout: must be true or false"),
    ],
)
def test_a_hand_edited_config_is_checked_as_the_spec_is(
    tmp_path: Path, field: str, value: object, problem: str
) -> None:
    record = config_record(parse_spec(SPEC, "r.hcl"), "worker-1", Path("/t"))
    record["jobs"]["own"][field] = value
    path = tmp_path / "lockctl.json"
    path.write_text(json.dumps(record))
    with pytest.raises(Exception) as caught:
        load_worker_config(path)
    assert problem in str(caught.value)


def test_the_scheduler_counts_retries_and_cuts_from_the_core_s_notes() -> None:
    report = CoreReport("w1", io.StringIO())
    tick = datetime(2026, 12, 1, 13, 0, tzinfo=timezone.utc)

    def completed(outcome: TickOutcome, status: int, **fields: object) -> Note:
        record = TickRecord(
            tick, outcome, worker="w1", session="s-1", lock_index=7, exit_status=status, **fields
        )
        return Note("completed", "job-a", tick, record=record)

    for note in (
        Note("retry-started", "job-a", tick, "attempt 2"),
        completed(TickOutcome.SUCCEEDED, 0, attempts=(1, 0)),
        Note("retry-started", "job-a", tick, "attempt 2"),
        Note("retry-started", "job-a", tick, "attempt 3"),
        completed(TickOutcome.FAILED, 1, attempts=(1, 1, 1)),
        completed(TickOutcome.FAILED, 1, retries_cut="next-tick"),
        completed(TickOutcome.SUCCEEDED, 0),
    ):
        report(note)

    def total(name: str) -> float | None:
        return report.registry.get_sample_value(name, {"job": "job-a", "worker": "w1"})

    assert total("lockctl_job_retries_total") == 3
    assert total("lockctl_retries_cut_total") == 1
    assert total("lockctl_run_failures_total") == 2
