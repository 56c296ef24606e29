"""The run of one scheduled tick inside `lockctl schedule`: the tick the loop waited for,
judged (a read of its record first unless this replica is first in the claim order, or the
cadence wants the clocks compared), then the engine's run of it under the replica's session."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

from provision.consul import Consul
from provision.ledger.store import Ledger
from provision.ledger.ticks import TickChoice
from provision.runner.body import JobBody
from provision.runner.engine import run_job
from provision.runner.events import EventLog
from provision.runner.forkserver import ForkServer
from provision.runner.precheck import WallClock, utc_now
from provision.runner.results import RunOptions, RunResult
from provision.runner.stop import StopRequest
from provision.runner.tick_lock import TickRun, job_turn, plan_tick
from provision.schedule import parse_schedule
from provision.scheduler.cadence import Cadence, after_read, after_run, tick_work
from provision.workers.config import JobConfig


def scheduled_run(  # noqa: PLR0913 (until this shape runs on the tick core)
    consul: Consul,
    job: JobConfig,
    worker: str,
    due: datetime,
    events: EventLog,
    stop: StopRequest,
    session: str,
    cadence: Cadence,
    *,
    clock: Callable[[], float] = time.monotonic,
    wall: WallClock = utc_now,
    forks: ForkServer | None = None,
    body: Callable[[], JobBody] | None = None,
) -> tuple[RunResult, Cadence]:
    """The run of tick `due`, the one the loop waited for, under the replica's session: the
    engine's, with the read before the claim when this replica is not first in the claim order
    or `cadence` wants the clocks compared, and the housekeeping as often as `cadence` says."""
    schedule = parse_schedule(job.schedule or "", job.timezone)  # cached
    work = tick_work(cadence, clock())
    turn = job_turn(job, schedule, due, worker)
    ledger = Ledger(consul, job.lock_key)
    read = work.read_first or turn.reads_first
    plan = plan_tick(ledger, job, schedule, due, events, wall, read=read)
    if work.read_first:
        # a skew of this host's clock is only said: every decision is on the agent's clock
        agree = isinstance(plan, TickChoice) and plan.wait == 0
        cadence = after_read(cadence, clock(), clocks_agree=agree)
    result = run_job(
        consul,
        job,
        worker,
        list(job.command or ()),
        RunOptions(),
        events,
        stop,
        clock,
        wall,
        TickRun(plan, turn.planned, housekeep=work.housekeep),
        session=session,
        forks=forks,
        body=body,
    )
    claimed = result.lock_index is not None
    return result, after_run(cadence, clock(), work, claimed=claimed, again=result.housekeep_again)
