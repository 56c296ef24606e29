"""A scheduled job's tick as `lockctl run` and embed's calls choose and judge it before the tick
core takes its turn (runner/on_core.py, embed/): the tick of this moment, a worker's turn at it,
and one read of its record.

    current_tick  the tick a run started now belongs to (provision/ledger/ticks.py decides)
    plan_tick     whether to claim it: one read of its record, before any session or child: the
                  cheap skip when another worker took it, or it is too late (recorded missed
                  once it is missed for every clock) or has not come on the agent's clock
    lock_refusal  why the claim was refused for the lock: overlap, lock-delay, another holder

The ledger makes "once per tick" hold whatever the timers and clocks do: exactly one claim of a
tick can win, and a tick's record is never written twice (check-not-exists, cas index 0).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from provision.consul import Consul, ConsulError
from provision.ledger.control import NO_PAUSES, unrun_record
from provision.ledger.holder import holder_record
from provision.ledger.operator import readable_pauses
from provision.ledger.records import TickRecord, taken_fields, tick_name
from provision.ledger.store import Ledger
from provision.ledger.ticks import (
    MISSED_GRACE,
    TickChoice,
    choose_tick,
    clock_skew,
    judge_tick,
)
from provision.ledger.turns import Turn, turn
from provision.outcomes import Outcome
from provision.runner.events import EventLog, ms
from provision.runner.precheck import WallClock, utc_now
from provision.runner.results import SkipReason
from provision.runner.tick_verdicts import TickRefusal, missed_fields, refused_skip
from provision.schedule import Schedule, parse_schedule
from provision.system.text import printable
from provision.workers.config import JobConfig


def job_schedule(job: JobConfig) -> Schedule | None:
    return None if job.schedule is None else parse_schedule(job.schedule, job.timezone)


def current_tick(job: JobConfig, schedule: Schedule, wall: WallClock = utc_now) -> datetime:
    """The tick a run started now belongs to: `lockctl run`'s one choice, made once."""
    return choose_tick(schedule, wall(), job.timings.start_deadline).tick


def job_turn(job: JobConfig, schedule: Schedule, tick: datetime, worker: str) -> Turn:
    """This worker's turn at `tick`: when it may claim, and whether it reads first."""
    window = choose_tick(schedule, tick, job.timings.start_deadline).window
    return turn(job.name, tick, worker, job.workers, job.timings.jitter, window)


@dataclass(frozen=True)
class TickSkip:
    """This run does not claim its tick: `outcome` is skipped or missed, `fields` the event's,
    `skip` why it skipped (None when missed)."""

    tick: datetime
    outcome: Outcome  # SKIPPED or MISSED
    fields: dict[str, object]
    skip: SkipReason | None = None


def plan_tick(
    ledger: Ledger,
    job: JobConfig,
    schedule: Schedule,
    tick: datetime,
    events: EventLog,
    wall: WallClock = utc_now,
) -> TickChoice | TickSkip:
    """Whether to claim `tick` (the one the caller waited for), or why not: taken already, too
    late, or not come yet on the agent's clock. `wall`: the clock every decision is judged by,
    Consul's where the caller has one (consul/clock.py); its answers teach it, the read's too."""
    sent = utc_now()  # this host's clock, only to warn when it is not the agent's
    # stale: off the leader; a claim it missed, the claim's own transaction refuses
    record, agent_date = ledger.read(tick, stale=True)
    received = utc_now()
    if record is not None:
        paused = record.outcome is Outcome.PAUSED
        skip = SkipReason.PAUSED if paused else SkipReason.TAKEN
        return TickSkip(tick, Outcome.SKIPPED, taken_fields(record), skip)
    choice = judge_tick(schedule, tick, wall(), job.timings.start_deadline, agent_date)
    if agent_date is not None:
        choice = replace(choice, skew=clock_skew(sent, received, agent_date))
    if choice.skew is not None:
        events.emit(
            "clock-skew",
            tick=tick_name(choice.tick),
            skew_ms=ms(choice.skew),
            warning="this host's clock and the Consul agent's differ; lockctl judges ticks "
            "by the agent's, keep them in sync (NTP)",
        )
    if choice.too_late:
        return _too_late(ledger, job, choice, events.worker, wall)
    if choice.too_early:
        reason = (
            f"tick {tick_name(choice.tick)} has not come on the Consul agent's clock "
            f"(it is {choice.wait:.0f}s away there)"
        )
        return TickSkip(choice.tick, Outcome.SKIPPED, {"reason": reason}, SkipReason.OTHER)
    return choice


def _too_late(
    ledger: Ledger, job: JobConfig, choice: TickChoice, worker: str, wall: WallClock
) -> TickSkip:
    """Later than the claim window: refuse the tick. Record it missed only once it is missed
    for every clock within MISSED_GRACE of ours (a peer a second behind may still claim it),
    and only while its record would still be kept (`recent`): an older tick's record may have
    been deleted by retention, after it ran."""
    recorded = False
    if choice.lag > choice.window + MISSED_GRACE and choice.recent:
        try:
            missed = _unrun_records(ledger, job, [choice.tick], worker, wall())
            recorded = ledger.record_missed(missed) == 1
        except ConsulError:
            recorded = False
    fields = missed_fields(choice.tick, choice.lag, choice.window, recorded)
    return TickSkip(choice.tick, Outcome.MISSED, fields)


def _unrun_records(
    ledger: Ledger, job: JobConfig, ticks: list[datetime], worker: str, now: datetime
) -> list[TickRecord]:
    """The records of ticks nobody ran: `paused` where a pause held one, else `missed` (the
    job's control keys are read only when there are such ticks: rarely)."""
    pauses = readable_pauses(ledger.consul, job.name) if ticks else NO_PAUSES
    return [unrun_record(t, worker, now, pauses.holding(t)) for t in ticks]


def lock_refusal(consul: Consul, key: str, tick: datetime, refusal: str | None) -> TickRefusal:
    """The claim of `tick` was refused for the lock: held (the previous tick still runs) or in
    lock-delay (`refusal`, Consul's own answer, says so: only it knows). The lock's holder is
    read to say which tick it runs."""
    when = tick_name(tick)
    # Consul's own answer to the claim's lock operation: only it knows of a lock-delay
    if refusal is not None and "lock delay" in refusal:
        reason = f"tick {when}: the lock is in lock-delay (its last holder's session ended)"
        skip = refused_skip(recorded=False, lock_delay=True, running=None)
        return TickRefusal(tick, {"reason": reason}, skip)
    try:
        entry, _ = consul.kv.get(key)
    except ConsulError:
        entry = None
    held = holder_record(entry.value if entry else None)  # bounded, printable
    running, claims = held.get("tick"), held.get("worker", "?")
    skip = refused_skip(recorded=False, lock_delay=False, running=running)
    if running is not None:
        reason = (
            f"tick {when}: overlap, tick {running} is still running "
            f"(its record claims worker {claims})"
        )
    else:
        reason = f"tick {when}: the lock is held by another session (claims {claims})"
    holder = entry.session if entry and entry.session else None
    fields: dict[str, object] = {
        "reason": reason,
        "holder": None if holder is None else printable(holder, 64),
    }
    return TickRefusal(tick, fields, skip)
