"""Why a scheduled run did not claim its tick, on the real cluster, as its RunResult says (the
`reason` of `lockctl_skips_total`): the tick has a record (taken, by the read or by the claim),
the previous tick's run holds the lock (overlap), its session ended without a release
(lock-delay), a plain `lockctl run` holds it (other); and a run that claimed carries the start
lag its tick's record holds."""

from __future__ import annotations

import io
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import pytest

from provision.consul import Consul
from provision.fencing import Outcome
from provision.ledger.records import TickOutcome
from provision.ledger.store import Ledger
from provision.ledger.ticks import TickChoice, judge_tick
from provision.runner.engine import run_job
from provision.runner.events import EventLog
from provision.runner.lock import LockSession
from provision.runner.results import RunOptions, RunResult, SkipReason
from provision.runner.stop import StopRequest
from provision.runner.tick_lock import TickLock, TickRun, TickSkip, plan_tick
from provision.schedule import parse_schedule
from provision.timings import JobTimings
from provision.workers.config import JobConfig

if TYPE_CHECKING:
    pass

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("subreaper")]

WORKER = "worker-1"
SCHEDULE = parse_schedule("@every 3s")
TIMINGS = JobTimings(ttl=10.0, lock_delay=4.0, renew_interval=1.0, kill_grace=1.0, min_hold=0.0)


@pytest.fixture
def job(consul: Consul) -> Iterator[JobConfig]:
    uid = uuid.uuid4().hex[:8]
    key = f"test/skips-{uid}/.lock"
    yield JobConfig(f"skips-{uid}", key, TIMINGS, "@every 3s", command=("true",))
    consul.kv.delete(f"test/skips-{uid}/", recurse=True)


def _ticks() -> tuple[datetime, datetime]:
    """The current tick and the next: the holder claims the first, the run the second."""
    now = datetime.now(timezone.utc)
    tick = SCHEDULE.latest_tick_at_or_before(now)
    return tick, SCHEDULE.next_ticks(tick, 1)[0]


def _fresh_tick() -> datetime:
    """A tick just come (waited for): its claim window (3 s, cut at the next tick) is almost
    whole ahead. The current tick may have a few milliseconds of it left, and a read and a
    claim after that find it too late."""
    tick = SCHEDULE.next_ticks(datetime.now(timezone.utc), 1)[0]
    time.sleep(max(0.0, tick.timestamp() + 0.05 - time.time()))
    return tick


def _events(job: JobConfig) -> EventLog:
    return EventLog(job.name, WORKER, io.StringIO())


def _claim(consul: Consul, job: JobConfig, plan: TickChoice | TickSkip) -> RunResult:
    """The engine's run of the plan's tick, as `lockctl run`'s."""
    return run_job(
        consul, job, WORKER, ["true"], RunOptions(), _events(job), StopRequest(), tick=TickRun(plan)
    )


def _read_first(consul: Consul, job: JobConfig, tick: datetime) -> TickChoice | TickSkip:
    return plan_tick(Ledger(consul, job.lock_key), job, SCHEDULE, tick, _events(job))


def _plan(job: JobConfig, tick: datetime) -> TickChoice:
    """The claim without a read first, as a scheduler's whose clocks agreed lately."""
    return judge_tick(SCHEDULE, tick, tick, job.timings.start_deadline)  # in time, no wait


@pytest.fixture
def running(consul: Consul, job: JobConfig) -> Iterator[TickLock]:
    """A run of a tick just come that holds the lock (its job still going). Not the current
    tick: on a loaded machine the test's read came after what was left of its 3 s window, and
    judged it missed, not taken (a stressed run here)."""
    tick = _fresh_tick()
    holder = TickLock(consul, job, "worker-2", tick)
    holder.open()
    assert holder.try_acquire() is not None
    yield holder
    holder.release()
    holder.destroy()


def test_a_tick_another_run_claimed_is_taken_by_the_read_and_by_the_claim(
    consul: Consul, job: JobConfig, running: TickLock
) -> None:
    by_read = _claim(consul, job, _read_first(consul, job, running.tick))
    assert (by_read.outcome, by_read.skip, by_read.tick) == (
        Outcome.SKIPPED,
        SkipReason.TAKEN,
        running.tick,
    )
    by_claim = _claim(consul, job, _plan(job, running.tick))
    assert (by_claim.outcome, by_claim.skip) == (Outcome.SKIPPED, SkipReason.TAKEN)
    assert by_claim.start_lag is None and by_claim.duration is None


def test_the_next_tick_while_the_previous_runs_is_an_overlap(
    consul: Consul, job: JobConfig, running: TickLock
) -> None:
    _, following = _ticks()
    result = _claim(consul, job, _plan(job, following))
    assert (result.outcome, result.skip) == (Outcome.SKIPPED, SkipReason.OVERLAP)
    assert Ledger(consul, job.lock_key).read(following)[0] is None  # nothing claimed it


def test_a_lock_whose_session_ended_is_in_lock_delay(
    consul: Consul, job: JobConfig, running: TickLock
) -> None:
    consul.session.destroy(running.session_id)  # no release: Consul's lock-delay (4 s) begins
    _, following = _ticks()
    result = _claim(consul, job, _plan(job, following))
    assert (result.outcome, result.skip) == (Outcome.SKIPPED, SkipReason.LOCK_DELAY)


def test_a_lock_held_without_a_tick_is_other(consul: Consul, job: JobConfig) -> None:
    plain = LockSession(consul, job, "worker-2")  # a plain `lockctl run` of the same key
    plain.open()
    try:
        assert plain.try_acquire() is not None
        _, following = _ticks()
        result = _claim(consul, job, _plan(job, following))
        assert (result.outcome, result.skip) == (Outcome.SKIPPED, SkipReason.OTHER)
    finally:
        plain.release()
        plain.destroy()


def test_a_run_carries_the_start_lag_its_record_holds(consul: Consul, job: JobConfig) -> None:
    tick = _fresh_tick()
    ledger = Ledger(consul, job.lock_key)
    plan = _read_first(consul, job, tick)
    assert isinstance(plan, TickChoice)
    result = _claim(consul, job, plan)
    assert (result.outcome, result.exit_code, result.skip) == (Outcome.RAN, 0, None)
    record = ledger.read(tick)[0]
    assert record is not None and record.outcome is TickOutcome.SUCCEEDED
    assert result.start_lag is not None and record.start_lag is not None
    assert result.start_lag == pytest.approx(record.start_lag, abs=0.0005)  # stored to the ms
    assert 0.0 <= result.start_lag <= plan.lag + 5.0  # claimed after the plan, not long after
