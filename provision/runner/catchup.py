"""A catch-up run (`catchup = "latest"`, ledger/catchup.py): after a time nobody ran the job,
the newest tick nobody ran, once, while within its start deadline. `lockctl run` looks after
its own tick (run first: its window is the shorter); `lockctl schedule` and serve() run on
the tick core, whose catch-up is its own (tick/core.py catchup_plan).
The look reads the ledger's key names, and the candidate tick's record when it has one.

The run is the engine's, for that tick (runner/engine.py): its claim is the tick's claim
transaction, over no record or over the `missed` record at the ModifyIndex just read
(ledger/store.py), so two replicas coming back at once run it once, and a catch-up and the
recording of the tick as missed cannot both win. Its record says `catchup: true`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime

from provision.consul import Consul
from provision.ledger.catchup import LATEST, catchup_tick, may_catch_up
from provision.ledger.operator import readable_pauses
from provision.ledger.records import TickOutcome, tick_name
from provision.ledger.store import Ledger
from provision.ledger.ticks import TickChoice
from provision.runner.body import JobBody
from provision.runner.engine import run_job
from provision.runner.events import EventLog, ms
from provision.runner.forkserver import ForkServer
from provision.runner.precheck import WallClock, utc_now
from provision.runner.results import RunOptions, RunResult
from provision.runner.stop import StopRequest
from provision.runner.tick_lock import TickRun, job_schedule
from provision.workers.config import JobConfig


def plan_catchup(
    ledger: Ledger, job: JobConfig, events: EventLog, wall: WallClock = utc_now
) -> TickRun | None:
    """The catch-up to run now, or None: the job does not ask for one, no tick's window closed
    within its start deadline, that tick has a record other than `missed`, or a pause held it.
    One read of the ledger's key names, of the tick's record when it has one (a default read:
    the claim over a missed record needs the index the leader has; a stale one only loses the
    claim), and of the job's control keys when there is a tick to catch up."""
    schedule = job_schedule(job)
    if job.catchup != LATEST or schedule is None:
        return None
    deadline = job.timings.start_deadline
    recorded = ledger.ticks()  # names only
    candidate = catchup_tick(schedule, wall(), deadline, recorded)
    if candidate is None:
        return None
    record = ledger.read(candidate)[0] if candidate in recorded else None
    if not may_catch_up(record) or _held(ledger, job, candidate):
        return None  # ran, or claimed; or a pause held it, so it was not due
    lag = (wall() - candidate).total_seconds()
    if lag > deadline:
        return None  # the read took it past its deadline
    over = 0 if record is None else record.modify_index
    events.emit(
        "catch-up",
        tick=tick_name(candidate),
        lag_ms=ms(lag),
        recorded_missed=record is not None and record.outcome is TickOutcome.MISSED,
    )
    choice = TickChoice(candidate, window=deadline, lag=lag, wait=0.0)
    return TickRun(choice, catchup_over=over)


def _held(ledger: Ledger, job: JobConfig, tick: datetime) -> bool:
    """Whether a pause held `tick` (one read of the job's control keys, made only for a tick
    that may be caught up otherwise): a pause resumed while every replica was down."""
    return readable_pauses(ledger.consul, job.name).holding(tick) is not None


def run_catchup(  # noqa: PLR0913 (until this shape runs on the tick core)
    consul: Consul,
    job: JobConfig,
    worker: str,
    command: Sequence[str],
    options: RunOptions,
    events: EventLog,
    stop: StopRequest,
    clock: Callable[[], float] = time.monotonic,
    wall: WallClock = utc_now,
    *,
    session: str | None = None,
    forks: ForkServer | None = None,
    body: Callable[[], JobBody] | None = None,
) -> RunResult | None:
    """Look for a catch-up and run it (never waiting for the lock); None when there is none.
    `body`: what makes the job instead of `command` (an embedded app's, provision/embed/)."""
    catchup = plan_catchup(Ledger(consul, job.lock_key), job, events, wall)
    if catchup is None:
        return None
    once = replace(options, wait=False, timeout=None)
    return run_job(
        consul,
        job,
        worker,
        command,
        once,
        events,
        stop,
        clock,
        wall,
        catchup,
        session=session,
        forks=forks,
        body=body,
    )
