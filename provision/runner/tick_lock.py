"""A scheduled job's run: the tick it belongs to, claimed in the same transaction as the lock.

    plan_tick   which tick this run is for (provision/ledger/ticks.py decides); one read of its
                record, before any session or child: the cheap skip when another worker took it
    TickLock    the job's LockSession whose acquire is the tick's claim (provision/ledger/
                store.py: check-not-exists + lock + record + read, one transaction) and whose
                finish completes the record and unlocks in one more
    housekeep   after the run: record the ticks nobody ran as missed, prune beyond history_limit

The ledger makes "once per tick" hold whatever the timers and clocks do: exactly one claim of a
tick can win, and a tick's record is never written twice (check-not-exists, cas index 0).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime

from provision.consul import Consul, ConsulError
from provision.fencing import Outcome
from provision.ledger.control import NO_PAUSES, ControlNote, decode_note, unrun_record
from provision.ledger.operator import readable_pauses
from provision.ledger.records import TickOutcome, TickRecord, taken_fields, tick_name
from provision.ledger.store import ClaimTerms, Ledger
from provision.ledger.ticks import (
    MISSED_GRACE,
    TickChoice,
    choose_tick,
    clock_skew,
    judge_tick,
    missed_ticks,
    to_prune,
    unsettled_ticks,
)
from provision.ledger.turns import Turn, turn
from provision.runner.events import EventLog, ms
from provision.runner.holder import holder_record
from provision.runner.lock import Ending, HeldLock, LockSession
from provision.runner.precheck import WallClock, utc_now
from provision.runner.results import SkipReason
from provision.runner.tick_verdicts import TickRefusal, paused_refusal, refused_skip, tick_outcome
from provision.schedule import Schedule, parse_schedule
from provision.system.control_keys import control_prefix
from provision.system.text import printable
from provision.workers.config import JobConfig

MAX_MISSED_PER_RUN = 60


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
class TickRun:
    """What the caller of a scheduled job's run decided before it: the tick it waited for and
    its judgement of it (plan_tick: claim it, or why not), when it was planned to start (its
    jitter, for the record), and whether to housekeep after it (a scheduler: as its cadence
    says; the claim can still ask for it, runner/engine.py)."""

    plan: TickChoice | TickSkip
    planned_start: float = 0.0  # seconds after the tick
    housekeep: bool = True
    manual: ControlNote | None = None  # a trigger's run: its instant is `plan.tick`
    # a catch-up (ledger/catchup.py): the ModifyIndex of the tick's `missed` record it claims
    # over, 0 when the tick has no record; None: the tick's own run
    catchup_over: int | None = None


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
        paused = record.outcome is TickOutcome.PAUSED
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
    reason = (
        f"tick {tick_name(choice.tick)}: started {choice.lag:.1f}s after it on the Consul "
        f"agent's clock, later than its start deadline ({choice.window:.0f}s); not run"
    )
    return TickSkip(choice.tick, Outcome.MISSED, {"reason": reason, "recorded": recorded})


def _unrun_records(
    ledger: Ledger, job: JobConfig, ticks: list[datetime], worker: str, now: datetime
) -> list[TickRecord]:
    """The records of ticks nobody ran: `paused` where a pause held one, else `missed` (the
    job's control keys are read only when there are such ticks: rarely)."""
    pauses = readable_pauses(ledger.consul, job.name) if ticks else NO_PAUSES
    return [unrun_record(t, worker, now, pauses.holding(t)) for t in ticks]


class TickLock(LockSession):
    """The job's lock for one tick: acquired only with the tick's claim."""

    def __init__(  # noqa: PLR0913 (until this shape runs on the tick core)
        self,
        consul: Consul,
        job: JobConfig,
        worker: str,
        tick: datetime,
        clock: Callable[[], float] = time.monotonic,
        wall: WallClock = utc_now,
        planned_start: float = 0.0,
        previous: datetime | None = None,
        catchup_over: int | None = None,
        *,
        manual: ControlNote | None = None,
    ) -> None:
        super().__init__(consul, job, worker, clock)
        self.manual = manual  # a trigger's run (lockctl trigger): who asked, when, why, its id
        self.ledger = Ledger(consul, job.lock_key, control_prefix(job.name))
        self.tick = tick
        self.previous = previous  # the schedule's tick before ours: is it recorded?
        self.previous_recorded: bool | None = None  # the claim's answer to that
        self.next_tick: datetime | None = None  # the schedule's tick after ours: retries stop
        self.wall = wall
        self.planned_start = planned_start  # seconds after the tick (jitter): in the record
        self.catchup_over = catchup_over  # a catch-up's (TickRun): claims over a missed record
        self.record: TickRecord | None = None  # ours, once claimed
        self.tick_taken = False  # the claim found the tick taken: retrying cannot help
        self.paused: TickRecord | None = None  # the claim found the job paused: recorded so
        self._lock_refusal: str | None = None

    def _holder_fields(self) -> dict[str, str | int]:
        return {**super()._holder_fields(), "tick": tick_name(self.tick)}

    def try_acquire(self) -> HeldLock | None:
        claimed_at = self.wall()
        record = TickRecord(
            self.tick,
            TickOutcome.RUNNING,
            worker=self.worker,
            session=self.session_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            claimed_at=claimed_at,
            start_lag=max(0.0, (claimed_at - self.tick).total_seconds()),
            planned_start=self.planned_start or None,
            catchup=True if self.catchup_over is not None else None,
        )
        trigger = None
        if self.manual is not None:
            trigger = self.ledger.untaken_trigger(self.manual.id)
            if trigger is None:
                self.tick_taken = True
                return None
            note = self.manual
            record = replace(
                record, by=note.by, reason=note.reason, asked_at=note.at, trigger=note.id
            )
        sent = self._clock()
        over = self.catchup_over or 0
        terms = ClaimTerms(self.previous, over, trigger)
        claim = self.ledger.claim(record, self._holder_record(), self.session_id, terms)
        if not claim.won:
            self.tick_taken, self._lock_refusal = claim.tick_taken, claim.lock_refusal
            return None
        claimed = replace(record, lock_index=claim.lock_index, modify_index=claim.record_index)
        if claim.paused is not None:  # ours, and paused: recorded so, the lock handed back
            self.paused = self._record_paused(claimed, decode_note(claim.paused))
            return None
        self.confirm(sent)
        self.previous_recorded = claim.previous_recorded
        self.record = claimed
        return HeldLock(claim.lock_index, claim.lock_modify_index)

    def _record_paused(self, claimed: TickRecord, note: ControlNote) -> TickRecord:
        """Complete our claim of a paused job's tick as `paused` (who paused it, when, why) and
        release the lock, in one transaction: the job does not start, and the tick is neither
        run nor missed."""
        paused = claimed.completed(
            TickOutcome.PAUSED,
            finished_at=self.wall(),
            by=note.by,
            reason=note.reason,
            asked_at=note.at,
        )
        completion = self.ledger.complete(paused, self.session_id, release=True)
        if completion.released is None and not completion.recorded:
            self.release()  # no answer to the transaction: at least free the key
        return paused

    @property
    def final_refusal(self) -> bool:
        """Waiting for the lock cannot help: the tick is taken, or the job is paused."""
        return self.tick_taken or self.paused is not None

    def why_not_acquired(self) -> TickRefusal:  # type: ignore[override]
        if self.paused is not None:
            return paused_refusal(self.paused)
        if self.tick_taken and self.manual is not None:
            reason = f"trigger {self.manual.id} already taken (run by another replica)"
            skip = refused_skip(recorded=True, lock_delay=False, running=None)
            return TickRefusal(self.tick, {"reason": reason, "trigger": self.manual.id}, skip)
        if self.tick_taken:
            record, _ = self.ledger.read(self.tick)
            if record is not None:
                skip = refused_skip(recorded=True, lock_delay=False, running=None)
                return TickRefusal(self.tick, taken_fields(record), skip)
        return self._lock_refused()

    def _lock_refused(self) -> TickRefusal:
        return lock_refusal(self.consul, self.key, self.tick, self._lock_refusal)

    def finish(self, ending: Ending, *, release: bool) -> bool | None:
        if self.record is None:  # never claimed
            return super().finish(ending, release=release)
        finished_at = self.wall()
        done = self.record.completed(
            tick_outcome(ending, release),
            finished_at=finished_at,
            exit_status=ending.exit_status,
            duration=round(ending.duration, 3),
            stdout=ending.stdout,
            stderr=ending.stderr,
            attempts=ending.attempts,
            retries_cut=ending.retries_cut,
        )
        completion = self.ledger.complete(done, self.session_id, release=release)
        if release and completion.released is None and not completion.recorded:
            return self.release()  # no answer to the transaction: at least free the key
        return completion.released


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


def housekeep(
    ledger: Ledger,
    job: JobConfig,
    schedule: Schedule,
    worker: str,
    events: EventLog,
    ran: datetime | None = None,
    wall: WallClock = utc_now,
) -> bool:
    """After the run of tick `ran`: record the ticks nobody ran as missed, delete beyond
    history_limit (never a record dated in the future: ledger/ticks.py). Best effort: a failure
    here is a warning event. Whether it must be done again soon: it failed, or a tick before
    `ran` has no record and is not missed yet (its window is still open), so only a later
    housekeeping can record it."""
    try:
        recorded = ledger.ticks()  # names only: the values are not needed here
        now = wall()  # Consul's clock where the caller has it: what is missed, and suspect
        deadline = job.timings.start_deadline
        missed = missed_ticks(schedule, recorded, now, deadline, limit=MAX_MISSED_PER_RUN)
        unsettled = [] if ran is None else unsettled_ticks(schedule, recorded, now, deadline, ran)
        written = ledger.record_unrun(_unrun_records(ledger, job, missed[::-1], worker, now))
        # `now` judges what is dated in the future: if it is behind, a peer's real record may
        # look suspect, and a suspect record is only kept, never deleted
        pruned = ledger.prune(to_prune(recorded | set(missed), job.history_limit, now=now))
    except ConsulError as exc:
        events.emit("housekeeping-failed", warning=str(exc))
        return True
    if written or pruned:
        held = [r.tick for r in written if r.outcome is TickOutcome.PAUSED]  # no miss: no alert
        events.emit(
            "housekeeping",
            missed_recorded=len(written) - len(held),
            missed_ticks=[tick_name(t) for t in sorted(set(missed) - set(held))][:8] or None,
            paused_recorded=len(held) or None,
            pruned=pruned,
        )
    return bool(unsettled)
