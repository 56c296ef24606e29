"""`lockctl schedule` on the tick core (scheduler/on_core.py), its pure and local parts: a worker
config's job as the core runs it (a table), each worker's turn the same as the old engine's,
a body that cannot start ending its run at once, a trigger's run with a key of its own, and a
clock thread that a failing callback does not end. Asserted by order, never by duration."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import cast

import pytest

from provision.consul import AgentClock
from provision.errors import InputError
from provision.ledger.records import tick_name
from provision.runner.core_body import Unfenced, idempotency_key
from provision.runner.tick_lock import job_turn
from provision.schedule import parse_schedule
from provision.scheduler.on_core import BodySaid, GuardedClock, ServiceBody, core_job
from provision.tick.clock import VirtualClock
from provision.tick.core import plan_tick
from provision.tick.edge import BodyEnd, Run
from provision.timings import CatchupReach, JobTimings
from provision.workers.config import JobConfig

WAIT = 10.0  # seconds a test waits for what must happen (never reached when it works)
TIMINGS = JobTimings(ttl=10.0, lock_delay=4.0, renew_interval=1.0, kill_grace=1.0, jitter=5.0)


def _job(**given: object) -> JobConfig:
    fields: dict[str, object] = {
        "name": "ingest",
        "lock_key": "locks/ingest/.lock",
        "timings": TIMINGS,
        "schedule": "@every 3s",
        "command": ("/bin/true",),
    }
    fields.update(given)
    return JobConfig(**fields)  # type: ignore[arg-type]


CASES = {
    "every, UTC, skip": (
        _job(workers=("worker-1", "worker-2", "worker-3")),
        ("@every 3s", "UTC", ("worker-1", "worker-2", "worker-3"), 50, False),
    ),
    "cron in its timezone, latest": (
        _job(
            schedule="0 2 * * *",
            timezone="Europe/Berlin",
            workers=("worker-b", "worker-a"),
            history_limit=17,
            catchup="latest",
        ),
        ("0 2 * * *", "Europe/Berlin", ("worker-b", "worker-a"), 17, True),
    ),
    "no workers listed (an older config)": (
        _job(schedule="@hourly", workers=(), catchup="skip"),
        ("@hourly", "UTC", (), 50, False),
    ),
}


@pytest.mark.parametrize(("job", "expected"), CASES.values(), ids=list(CASES))
def test_a_config_job_becomes_the_core_job_it_describes(
    job: JobConfig, expected: tuple[str, str, tuple[str, ...], int, bool]
) -> None:
    text, zone, workers, history_limit, catchup = expected
    made = core_job(job)
    assert (made.keys.name, made.keys.lock_key) == (job.name, job.lock_key)
    assert made.schedule == parse_schedule(text, zone)
    assert made.schedule.zone == zone
    assert made.timings is job.timings
    assert made.workers == workers
    assert (made.history_limit, made.catchup) == (history_limit, catchup)


def test_a_config_job_catching_up_all_carries_its_reach_to_the_core() -> None:
    made = core_job(_job(catchup="all", catchup_reach=CatchupReach(7200.0, 3)))
    assert made.catchup is True and made.catchup_all == CatchupReach(7200.0, 3)
    assert core_job(_job(catchup="latest")).catchup_all is None


def test_a_job_without_a_schedule_is_refused() -> None:
    with pytest.raises(ValueError, match="ingest: no schedule"):
        core_job(_job(schedule=None))


@pytest.mark.parametrize("schedule", ["@every 3s", "*/5 * * * *"])
def test_each_worker_s_turn_on_the_core_is_the_old_engine_s(schedule: str) -> None:
    """The claim order (rank, stagger, jitter) each worker gets from the core's plan is the one
    job_turn gave the old engine, tick after tick: replicas of both kinds agree who goes first."""
    job = _job(schedule=schedule, workers=("worker-3", "worker-1", "worker-2"))
    made, old = core_job(job), parse_schedule(schedule)
    ticks = old.next_ticks(datetime(2026, 3, 29, 0, 30, tzinfo=timezone.utc), 12)
    ranks = set()
    for tick in ticks:
        for worker in (*job.workers, "stranger"):
            planned = plan_tick(made, tick, worker).turn
            assert planned == job_turn(job, old, tick, worker), (tick, worker)
            ranks.add(planned.rank)
    assert ranks == {0, 1, 2}  # every rank came up: the order was really compared


# --- the body ----------------------------------------------------------------------------------
def _run(clock: VirtualClock) -> Run:
    tick = clock.wall() - timedelta(seconds=1)
    return Run("ingest", "worker-1", tick, 41, "session-id", lambda: True)


def test_a_body_that_cannot_start_is_said_and_ends_at_once_without_a_status() -> None:
    clock = VirtualClock()
    failures: list[str] = []
    ended: list[BodyEnd | None] = []

    def prepare() -> Unfenced:
        raise InputError("cannot start '/gone': not found or not executable")

    said = BodySaid(lambda body: None, failures.append)
    body = ServiceBody(prepare, "locks/ingest/.lock", clock, None, said)
    body.start(_run(clock), lambda: ended.append(body.ending))
    assert failures == ["cannot start '/gone': not found or not executable"]
    assert ended == [] and body.ending is None  # told from a callback of its own, not start()
    clock.advance(0)
    assert ended == [BodyEnd(None)]


@dataclass
class FakeJob:
    """A job whose start records what it was told, and that has ended at once, exit 0."""

    told: list[Mapping[str, str]] = field(default_factory=list)

    def start(self, lock_env: Mapping[str, str], fence: object = None) -> None:
        self.told.append(dict(lock_env))

    def wait(self) -> int:
        return 0

    def tree_alive(self) -> bool:
        return False

    def signal_tree(self, signum: int) -> bool:
        return False

    def output_tails(self) -> tuple[str | None, str | None]:
        return ("done", None)

    def abort(self) -> None: ...

    def close(self) -> None: ...


@pytest.mark.parametrize("trigger", [None, "a1b2c3"])
def test_a_trigger_s_run_has_a_key_of_its_own_and_the_output_ends_are_kept(
    trigger: str | None,
) -> None:
    clock = VirtualClock()
    job = FakeJob()
    ended = threading.Event()
    prepare = cast("Callable[[], Unfenced]", lambda: job)
    said = BodySaid(lambda body: None, lambda why: None)
    body = ServiceBody(prepare, "locks/ingest/.lock", clock, trigger, said)
    run = _run(clock)
    body.start(run, ended.set)
    (told,) = job.told
    assert told["LOCKCTL_TICK"] == tick_name(run.tick) and told["LOCK_INDEX"] == "41"
    assert told["LOCKCTL_IDEMPOTENCY_KEY"] == idempotency_key("ingest", run.tick, trigger, 0)
    give_up = time.monotonic() + WAIT
    while clock.next_due() is None and time.monotonic() < give_up:  # the reaper's news, handed
        time.sleep(0.01)
    clock.advance(0)
    assert ended.is_set() and body.ending == BodyEnd(0) and body.tails == ("done", None)


def test_a_callback_that_raises_is_said_and_the_clock_runs_the_next_one() -> None:
    failed: list[Exception] = []
    clock = GuardedClock(AgentClock(), failed.append)
    done = threading.Event()

    def broken() -> None:
        raise RuntimeError("a bug")

    now = clock.monotonic()
    clock.call_at(now, broken)
    clock.call_at(now, done.set)
    thread = threading.Thread(target=clock.run, daemon=True)
    thread.start()
    try:
        assert done.wait(WAIT)
    finally:
        clock.close()
        thread.join(WAIT)
    assert not thread.is_alive()
    assert [str(exc) for exc in failed] == ["a bug"]
