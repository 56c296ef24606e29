"""The cheap skip of a scheduled run: the tick this run belongs to is already taken.

The tick is chosen once, when the run starts (`ScheduledTick`), and the run waits for the tick's
planned start (its jitter, provision/ledger/turns.py) before it looks. It does not wait for its
rank's stagger as a scheduler does: a per-tick process already reads before it claims, and on a
slow host a second more per run can push a run past its timer's next firing.

Most runs of a scheduled job skip (every worker's timer fires; one claims the tick). Such a run
is settled by one read of the tick's record, before a session, a child or the HTTP client's
imports: provision/consul/quick.py reads it with the standard library. When the record is not
there, or the quick read cannot tell, the run goes on through the engine, whose claim is the
authority (it reads again: the record may have appeared meanwhile).

A run of a plain lock (no schedule) that does not --wait skips when another session holds the
lock: that too is settled by a quick read of the lock key (its Session) and of the holder's
session's node, before a session of our own is made: `lock_held`. A key without a holder (free,
or in lock-delay) or a read that cannot tell goes on through the engine, whose acquire is the
authority.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

from provision.consul.quick import quick_get, quick_session_node
from provision.consul.settings import resolve_settings
from provision.ledger.records import decode, taken_fields, tick_key, tick_name
from provision.ledger.ticks import choose_tick
from provision.ledger.turns import Turn, turn
from provision.outcomes import Outcome
from provision.runner.events import EventLog
from provision.runner.holder import Holder, claimed_worker
from provision.runner.results import RunResult, SkipReason
from provision.schedule import parse_schedule
from provision.system.secrets import Secret
from provision.workers.config import JobConfig, WorkerConfig

WallClock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class ScheduledTick:
    """The tick a `lockctl run` belongs to, and this worker's turn at it."""

    tick: datetime
    turn: Turn


def scheduled_tick(job: JobConfig, worker: str, wall: WallClock = utc_now) -> ScheduledTick | None:
    """The tick of this moment (None for a job without a schedule) and this worker's turn."""
    if job.schedule is None:
        return None
    schedule = parse_schedule(job.schedule, job.timezone)
    choice = choose_tick(schedule, wall(), job.timings.start_deadline)
    mine = turn(job.name, choice.tick, worker, job.workers, job.timings.jitter, choice.window)
    return ScheduledTick(choice.tick, mine)


def await_planned_start(
    chosen: ScheduledTick, wall: WallClock = utc_now, sleep: Callable[[float], None] = time.sleep
) -> None:
    """Sleep until the tick's planned start (at once when it has come already)."""
    left = chosen.tick.timestamp() + chosen.turn.planned - wall().timestamp()
    if left > 0:
        sleep(left)


def tick_taken(
    worker: WorkerConfig,
    job: JobConfig,
    tick: datetime,
    events: EventLog,
    *,
    token: Secret | None = None,
) -> RunResult | None:
    """A `skipped` result (and its event) when `tick` has a record already; None when it has
    none or the quick read could not tell: run the engine. `token`: a login's, sent instead of
    the config's (a worker that logs in has no token file)."""
    settings = resolve_settings(**worker.connection())
    if token is not None:
        settings = dataclasses.replace(settings, token=token)
    entry = quick_get(settings, tick_key(job.lock_key, tick))
    if entry is None or not entry.exists:
        return None
    record = decode(tick, entry.value, entry.modify_index)
    events.emit("skipped", tick=tick_name(tick), **taken_fields(record))
    return RunResult(Outcome.SKIPPED, 0, tick=tick)


def lock_held(worker: WorkerConfig, job: JobConfig, events: EventLog) -> RunResult | None:
    """A `skipped` result (and its event, as the engine says it, without a session of ours)
    when another session holds the job's lock; None when none does (free, or in lock-delay) or
    the quick reads could not tell: run the engine."""
    settings = resolve_settings(**worker.connection())
    entry = quick_get(settings, job.lock_key)
    if entry is None or entry.session is None:
        return None
    node = quick_session_node(settings, entry.session)
    holder = Holder(entry.session, node, claimed_worker(entry.value))
    events.emit("skipped", **holder.event_fields())
    return RunResult(Outcome.SKIPPED, 0, skip=SkipReason.TAKEN)
