"""The cheap skip of a scheduled run: the tick this run belongs to is already taken.

Most runs of a scheduled job skip (every worker's timer fires; one claims the tick). Such a run
is settled by one read of the tick's record, before a session, a child or the HTTP client's
imports: provision/consul/quick.py reads it with the standard library. When the record is not
there, or the quick read cannot tell, the run goes on through the engine, whose claim is the
authority (it reads again: the record may have appeared meanwhile).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone

from provision.consul.quick import quick_get
from provision.consul.settings import resolve_settings
from provision.ledger.records import decode, taken_fields, tick_key, tick_name
from provision.ledger.ticks import choose_tick
from provision.runner.events import EventLog
from provision.runner.fencing import Outcome
from provision.runner.results import RunResult
from provision.schedule import parse_schedule
from provision.workers.config import JobConfig, WorkerConfig

WallClock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def tick_taken(
    worker: WorkerConfig, job: JobConfig, events: EventLog, wall: WallClock = utc_now
) -> RunResult | None:
    """A `skipped` result (and its event) when the job's current tick has a record already;
    None when it has none or the quick read could not tell: run the engine."""
    if job.schedule is None:
        return None
    schedule = parse_schedule(job.schedule, job.timezone)
    tick = choose_tick(schedule, wall(), job.start_deadline).tick
    settings = resolve_settings(**worker.connection())
    entry = quick_get(settings, tick_key(job.lock_key, tick))
    if entry is None or not entry.exists:
        return None
    record = decode(tick, entry.value, entry.modify_index)
    events.emit("skipped", tick=tick_name(tick), **taken_fields(record))
    return RunResult(Outcome.SKIPPED, 0, tick=tick)
