"""`lockctl run`'s notifications: a scheduled job's tick, once run here, told to its notify
blocks and its ping as `lockctl schedule` tells them (provision/notify/), from the tick's
record as Consul keeps it (its output's ends included), after the run and before the exit.

Beside the runner's core, not in it: the run's result names its tick; one consistent read of
that tick's record is the completed note the notifier hears. The tick's work is over by then:
a receiver that hangs holds the process's exit DRAIN seconds at most, never the lock or the
next tick. A tick this run's housekeeping recorded missed is not told here (a scheduler's
replica tells those).
"""

from __future__ import annotations

from provision.consul import Consul, ConsulError
from provision.ledger.records import tick_name
from provision.notify.notifier import JobNotify, Notifier, load_job
from provision.notify.sender import DRAIN, Delivery, Lanes, result_event
from provision.outcomes import Outcome
from provision.runner.events import EventLog
from provision.runner.results import RunResult
from provision.schedule import parse_schedule
from provision.system.text import printable
from provision.tick.consul_store import ConsulTickStore
from provision.tick.edge import Note
from provision.tick.store import JobKeys
from provision.workers.config import JobConfig

TOLD = frozenset({Outcome.RAN, Outcome.LOST, Outcome.TIMED_OUT})  # a record completed here


def run_notify(job: JobConfig) -> JobNotify | None:
    """The job's notifications ready, or None without any (InputError naming a URL file
    that cannot be used: the run is refused before anything runs, as the scheduler's start)."""
    if not job.notifications or job.schedule is None:
        return None
    schedule = parse_schedule(job.schedule, job.timezone)
    return load_job(JobKeys(job.name, job.lock_key, job.key), schedule, job.notifications)


def tell(made: JobNotify, consul: Consul, result: RunResult, events: EventLog) -> None:
    """The tick's outcome told, when this run completed its record; sent within DRAIN."""
    if result.outcome not in TOLD or result.tick is None:
        return
    keys = made.keys
    store = ConsulTickStore(consul)
    try:
        record = store.read_tick(keys, result.tick)[0]
    except ConsulError as exc:
        events.emit(
            "notify-failed",
            tick=tick_name(result.tick),
            error=printable(f"cannot read the tick's record: {type(exc).__name__}", 200),
        )
        return
    if record is None or not record.finished:
        return
    lanes = Lanes(lambda delivery, outcome, error: _said(events, delivery, outcome, error))
    notifier = Notifier(lanes, lambda job, tick: store.read_tick(job, tick)[0])
    notifier.update([made])
    lanes.start()
    notifier(Note("completed", keys.name, record.tick, record=record))
    lanes.close(DRAIN)


def _said(events: EventLog, delivery: Delivery, result: str, error: str | None) -> None:
    said = result_event(delivery, result, error)
    if said is not None:
        events.emit(said[0], **said[1])
