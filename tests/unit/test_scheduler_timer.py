"""The scheduler's one timer (provision/scheduler/timer.py), with stand-in jobs: no Consul.

The jobs' real runs are tested on the cluster (tests/integration/test_scheduler*.py); here the
timer alone: each job's run at its turn, a thread only while a run lasts, one job's slow or
broken run never holding up the others, and its end at a stop or a retire.

No test counts what happens in a span of time (a loaded machine runs less in it): each waits,
within a bound, for what it expects, and a run that must last is held until the test lets it
end (`hold`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from provision.ledger.control import ControlNote
from provision.runner.stop import StopRequest
from provision.scheduler.loop import Turn
from provision.scheduler.timer import TickTimer
from tests.lockctl_process import wait_until

WAIT = 30.0  # seconds: the bound on each wait (what is waited for comes in well under a second)


class FakeJob:
    """A job on `@every <every>s` from its start, whose run takes `run_for` seconds."""

    def __init__(
        self,
        name: str,
        every: float,
        hold: threading.Event | None = None,
        fail: bool = False,
        lost: int = 0,
    ) -> None:
        self.name, self.every, self.hold, self.fail = name, every, hold, fail
        self.lost = lost  # the first `lost` next_turn calls raise (a schedule it cannot work out)
        self.job = self  # the timer names its threads after job.job.name
        self.started = datetime.now(timezone.utc)
        self.ran: list[datetime] = []
        self.threads: set[str] = set()
        self.n = 0

    def next_turn(self) -> Turn:
        if self.lost:
            self.lost -= 1
            raise OverflowError("date value out of range")
        self.n += 1
        tick = self.started + timedelta(seconds=self.every * self.n)
        return Turn(tick, tick)

    def run_tick(self, tick: datetime) -> None:
        self.ran.append(tick)
        self.threads.add(threading.current_thread().name)
        if self.hold is not None:  # a long run: it lasts until the test lets it end
            self.hold.wait(WAIT)
        if self.fail:
            raise RuntimeError("a bug in this job's run")


def started(jobs: list[Any], **kwargs: Any) -> tuple[TickTimer, StopRequest, threading.Thread]:
    """The timer over `jobs`, running in a thread of its own; its stop request."""
    stop = StopRequest()
    timer = TickTimer(jobs, stop, **kwargs)
    thread = threading.Thread(target=timer.run)
    thread.start()
    return timer, stop, thread


def run_timer(
    jobs: list[FakeJob], until: Callable[[], bool], **kwargs: Callable[..., None]
) -> TickTimer:
    """Run the timer until `until()` holds (asserted, within WAIT), then stop it."""
    timer, stop, thread = started(jobs, **kwargs)
    try:
        assert wait_until(until, WAIT), [len(job.ran) for job in jobs]
    finally:
        stop.request()
        for job in jobs:
            if job.hold is not None:
                job.hold.set()
        thread.join(WAIT)
    assert not thread.is_alive()
    return timer


def test_idle_jobs_cost_no_thread() -> None:
    before = threading.active_count()
    idle = [FakeJob(f"job-{n}", 3600.0) for n in range(1000)]
    _, stop, thread = started(idle)
    time.sleep(0.3)
    assert threading.active_count() - before == 1  # the timer's own, for 1,000 jobs
    stop.request()
    thread.join(5)
    assert not any(job.ran for job in idle)


def test_hundreds_of_due_jobs_each_run_every_tick_in_order() -> None:
    jobs = [FakeJob(f"job-{n}", 0.2) for n in range(300)]
    run_timer(jobs, until=lambda: all(len(job.ran) >= 3 for job in jobs))
    for job in jobs:
        assert job.ran == [
            job.started + timedelta(seconds=0.2 * n) for n in range(1, len(job.ran) + 1)
        ]


def test_a_run_that_outlasts_its_interval_holds_up_only_its_own_job() -> None:
    slow, quick = FakeJob("slow", 0.1, hold=threading.Event()), FakeJob("quick", 0.1)
    seen: list[int] = []  # slow's runs when quick had run 4 times

    def quick_ran_four_times() -> bool:
        seen.append(len(slow.ran))
        return len(quick.ran) >= 4

    run_timer([slow, quick], until=quick_ran_four_times)
    assert seen[-1] == 1  # slow's one run went on all along: its next ticks waited, not quick's


def test_a_job_whose_run_raises_is_reported_and_still_gets_its_next_ticks() -> None:
    broken, healthy = FakeJob("broken", 0.1, fail=True), FakeJob("healthy", 0.1)
    errors: list[str] = []
    run_timer(
        [broken, healthy],
        until=lambda: len(broken.ran) >= 3 and len(healthy.ran) >= 3,
        on_error=lambda job, exc: errors.append(str(exc)),
    )
    assert errors and set(errors) == {"a bug in this job's run"}


def test_a_job_whose_next_turn_raises_is_reported_tried_again_and_holds_up_no_other() -> None:
    lost, healthy = FakeJob("lost", 0.1, lost=2), FakeJob("healthy", 0.1)
    errors: list[str] = []
    _, stop, thread = started(
        [lost, healthy],
        on_error=lambda job, exc: errors.append(f"{job.name}: {exc}"),
        retry_turn=timedelta(seconds=0.2),
    )
    # never held up by the other; its turn worked out at the second retry: it runs again
    ran = wait_until(lambda: len(healthy.ran) >= 6 and bool(lost.ran), WAIT)
    stop.request()
    thread.join(WAIT)
    assert ran and not thread.is_alive()
    assert errors == ["lost: date value out of range"] * 2  # at the start, and tried again


def test_a_stop_ends_the_timer_once_the_runs_under_way_end_and_starts_no_new_one() -> None:
    job = FakeJob("long", 0.1, hold=threading.Event())
    _, stop, thread = started([job])
    assert wait_until(lambda: job.ran, WAIT)
    stop.request()
    thread.join(0.3)
    assert thread.is_alive()  # it waits for the run under way
    assert job.hold is not None
    job.hold.set()
    thread.join(WAIT)
    assert not thread.is_alive()
    assert len(job.ran) == 1  # the one under way at the stop; none after it


def test_a_retire_starts_no_new_run() -> None:
    job = FakeJob("ticking", 0.1)
    timer, stop, thread = started([job])
    assert wait_until(lambda: job.ran, WAIT)
    timer.retire()
    thread.join(WAIT)
    assert not thread.is_alive() and not stop.requested
    count = len(job.ran)
    time.sleep(0.3)  # three of its intervals: a run not retired would have come
    assert len(job.ran) == count


class ClockJob(FakeJob):
    """A job whose turn is worked out on the timer's clock: its next whole 10 s after now."""

    def __init__(self, clock: Callable[[], datetime]) -> None:
        super().__init__("job-clock", 10.0)
        self.clock = clock

    def next_turn(self) -> Turn:
        now = self.clock().timestamp()
        tick = datetime.fromtimestamp(now - now % 10 + 10, timezone.utc)
        return Turn(tick, tick)


def test_a_replan_works_out_every_waiting_turn_again_on_the_clock_as_it_is_now() -> None:
    # The turn was worked out on a clock 3 minutes ahead (this host's, before Consul's was
    # known): without a replan the job would wait 3 minutes for it.
    offset = [180.0]

    def clock() -> datetime:
        return datetime.now(timezone.utc) + timedelta(seconds=offset[0])

    job = ClockJob(clock)
    timer, stop, thread = started([job], wall=clock)
    try:
        time.sleep(0.2)
        offset[0] = 0.0  # Consul's clock learnt
        timer.replan()
        give_up = time.monotonic() + 15
        while not job.ran and time.monotonic() < give_up:
            time.sleep(0.05)
        assert job.ran  # the turn was worked out again: within 10 s, not 3 minutes
        assert abs((job.ran[0] - datetime.now(timezone.utc)).total_seconds()) < 2
    finally:
        stop.request()
        thread.join(10)


def test_a_reload_changes_one_job_without_waiting_for_the_others_runs() -> None:
    """While a long run goes on: a job added runs at its turns, an idle job retired runs no
    more at once, and the long job's successor starts only once the long run has ended; the
    job nobody touched keeps ticking all along, and `on_retired` hears of each job that left."""
    quick, idle = FakeJob("quick", 0.1), FakeJob("idle", 0.15)
    hold = threading.Event()
    long, after = FakeJob("long", 0.1, hold=hold), FakeJob("after", 0.1)
    added = FakeJob("added", 0.1)
    retired: list[str] = []
    timer, stop, thread = started([quick, idle, long], on_retired=lambda j: retired.append(j.name))
    try:
        assert wait_until(lambda: long.ran and idle.ran, WAIT)  # the long run is under way
        timer.retire_job(long, successor=after)  # type: ignore[arg-type]
        timer.retire_job(idle)  # type: ignore[arg-type]
        timer.add(added)  # type: ignore[arg-type]
        assert wait_until(lambda: added.ran, WAIT)
        idle_runs, quick_runs = len(idle.ran), len(quick.ran)
        # never held up by the long run, which still goes on
        assert wait_until(lambda: len(quick.ran) > quick_runs + 5, WAIT)
        assert retired == ["idle"] and not after.ran and len(long.ran) == 1
        hold.set()  # the long run ends: its successor runs, the idle job never again
        assert wait_until(lambda: after.ran, WAIT)
    finally:
        hold.set()
        stop.request()
        thread.join(WAIT)
    assert retired == ["idle", "long"]
    assert len(long.ran) == 1 and len(idle.ran) == idle_runs


class TriggeredJob(FakeJob):
    """A FakeJob that records its manual runs (a trigger's) among its runs, in order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.order: list[str] = []

    def run_tick(self, tick: datetime) -> None:
        self.order.append("tick")
        super().run_tick(tick)

    def run_manual(self, note: ControlNote) -> None:
        self.order.append(f"manual {note.id}")


NOTE = ControlNote("ops", datetime(2026, 12, 4, 22, 0, tzinfo=timezone.utc), None, "t1")


def test_a_trigger_runs_at_once_when_its_job_is_idle() -> None:
    job = TriggeredJob("idle", every=3600)
    timer, stop, thread = started([job])
    try:
        timer.trigger(job, NOTE)  # type: ignore[arg-type]
        assert wait_until(lambda: job.order == ["manual t1"], WAIT), job.order
    finally:
        stop.request()
        thread.join(WAIT)


def test_a_trigger_during_its_job_s_run_comes_right_after_it() -> None:
    hold = threading.Event()
    job = TriggeredJob("busy", every=0.05, hold=hold)
    timer, stop, thread = started([job])
    try:
        assert wait_until(lambda: job.order == ["tick"], WAIT)  # held: its run goes on
        timer.trigger(job, NOTE)  # type: ignore[arg-type]
        hold.set()  # the run ends: the trigger's run is next, before the job's next tick
        assert wait_until(lambda: len(job.order) >= 3, WAIT), job.order
        assert job.order[:3] == ["tick", "manual t1", "tick"]
    finally:
        hold.set()
        stop.request()
        thread.join(WAIT)
