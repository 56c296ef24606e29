"""A job's run history from its tick ledger: what `lockctl history`, `status` and `check` show.

One read per job: a read-only transaction of two get-trees, the ticks and the lock key, so the
records and the lock's holder are one moment of Consul's state (a run that completes between
two separate reads would otherwise look abandoned). Consul filters what a token may not read out
of a transaction's answer instead of refusing it, so an empty answer is confirmed with a plain
read of the lock key, which does say 403.

Every record is the writer's word (anyone with write on the prefix writes these keys), decoded
bounded and printable by provision/ledger/records.py. A `running` record whose session no longer
holds the lock is shown `abandoned`: its runner died before completing it. A record dated in the
future (ledger/ticks.py `suspect`) is shown `suspect` and is never a run: not the last one, not
a success. Ticks nobody ran whose claim window closed are shown `missed` whether or not anyone
recorded them yet.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from provision.consul import Consul, KVOp, PermissionDenied
from provision.durations import DurationSyntaxError, parse_duration
from provision.ledger.records import (
    FIELD_LIMIT,
    TickOutcome,
    TickRecord,
    decode,
    parse_tick_name,
    tick_name,
    ticks_prefix,
)
from provision.ledger.store import Ledger
from provision.ledger.ticks import missed_ticks, suspect
from provision.schedule import Schedule, parse_schedule
from provision.system.text import printable

if TYPE_CHECKING:
    from provision.spec.models import Job

ABANDONED = "abandoned"  # shown for a `running` record whose session no longer holds the lock
SUSPECT = "suspect"  # shown for a record dated in the future, whatever it says
NOTICER = "lockctl check"  # the worker field of the missed records `check` writes
_DAYS = re.compile(r"(\d{1,5})d")


@dataclass(frozen=True)
class LedgerJob:
    """What the ledger readers need of a spec job that has a schedule."""

    name: str
    lock_key: str
    schedule: Schedule
    start_deadline: float
    history_limit: int


def ledger_job(job: Job) -> LedgerJob | None:
    """The job's ledger settings, or None when it has no schedule (and so no ledger)."""
    if job.schedule is None:
        return None
    return LedgerJob(
        name=job.name,
        lock_key=job.lock_key,
        schedule=parse_schedule(job.schedule, job.timezone),
        start_deadline=job.start_deadline.seconds,
        history_limit=job.history_limit,
    )


# --- reading ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LedgerSnapshot:
    """One job's records (oldest first) and who holds its lock, at one moment."""

    records: tuple[TickRecord, ...]
    lock_session: str | None  # Consul's word: the session on the lock key now
    date: datetime | None  # the agent's clock at the answer


def read_snapshot(consul: Consul, lock_key: str) -> LedgerSnapshot:
    """GET the ticks and the lock key in one read-only transaction (PUT /v1/txn); an empty
    answer is confirmed with GET /v1/kv/<lock key> (403 when the token may not read)."""
    prefix = ticks_prefix(lock_key)
    answer = consul.txn.kv([KVOp("get-tree", prefix), KVOp("get-tree", lock_key)])
    lock = next((entry for entry in answer.results if entry.key == lock_key), None)
    records = []
    for entry in answer.results:
        tick = parse_tick_name(entry.key[len(prefix) :]) if entry.key.startswith(prefix) else None
        if tick is not None:
            records.append(decode(tick, entry.value, entry.modify_index))
    date = answer.date
    if lock is None and not records:
        _, meta = consul.kv.get(lock_key)  # raises PermissionDenied where the txn stayed silent
        date = meta.date or date
    session = None if lock is None or lock.session is None else lock.session
    return LedgerSnapshot(tuple(sorted(records, key=lambda r: r.tick)), session, date)


# --- the history ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TickRow:
    """One tick as shown: its record (None: missed and not recorded yet) and what it means."""

    tick: datetime
    outcome: str  # a TickOutcome value, or `abandoned`
    record: TickRecord | None

    @property
    def recorded(self) -> bool:
        return self.record is not None

    @property
    def missed(self) -> bool:
        return self.outcome == TickOutcome.MISSED.value

    @property
    def suspect(self) -> bool:
        return self.outcome == SUSPECT

    @property
    def label(self) -> str:
        """The outcome for people: says when a missed tick is not in the ledger yet, and what
        a suspect record claims (an outcome lockctl decoded: one of its own words)."""
        if self.suspect and self.record is not None:
            return f"suspect: dated in the future (says {self.record.outcome.value})"
        return "missed (not recorded yet)" if self.missed and not self.recorded else self.outcome

    def to_record(self) -> dict[str, Any]:
        r = self.record
        return {
            "tick": tick_name(self.tick),
            "outcome": self.outcome,
            "recorded": self.recorded,
            "recorded_outcome": None if r is None else r.outcome.value,
            "worker": None if r is None else r.worker,  # the record's own word
            "host": None if r is None else r.host,
            "session": None if r is None else r.session,
            "lock_index": None if r is None else r.lock_index,
            "exit_status": None if r is None else r.exit_status,
            "duration": None if r is None else r.duration,
            "start_lag": None if r is None else r.start_lag,
            "planned_start": None if r is None else r.planned_start,
            "claimed_at": _iso(None if r is None else r.claimed_at),
            "finished_at": _iso(None if r is None else r.finished_at),
        }


@dataclass(frozen=True)
class JobHistory:
    job: str
    lock_key: str
    schedule: Schedule
    rows: tuple[TickRow, ...]  # newest first
    now: datetime  # the clock it was computed at (the agent's, when it answered with one)
    next_tick: datetime
    lock_session: str | None = None

    @property
    def unrecorded_missed(self) -> list[datetime]:
        return [row.tick for row in self.rows if row.missed and not row.recorded]

    @property
    def runs(self) -> tuple[TickRow, ...]:
        """The rows that may be runs, newest first: all but the suspect ones."""
        return tuple(row for row in self.rows if not row.suspect)

    @property
    def suspect(self) -> tuple[TickRow, ...]:
        """The records dated in the future, newest first."""
        return tuple(row for row in self.rows if row.suspect)

    @property
    def last(self) -> TickRow | None:
        """The newest tick that may be a run: a suspect record is never the last run."""
        return next(iter(self.runs), None)

    def since(self, moment: datetime | None) -> JobHistory:
        if moment is None:
            return self
        return replace(self, rows=tuple(row for row in self.rows if row.tick >= moment))

    def to_record(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "lock_key": self.lock_key,
            "schedule": self.schedule.text,
            "timezone": self.schedule.zone,
            "now": _iso(self.now),
            "next_tick": tick_name(self.next_tick),
            "ticks": [row.to_record() for row in self.rows],
        }


def build_history(job: LedgerJob, snapshot: LedgerSnapshot, now: datetime) -> JobHistory:
    """The rows, newest first: every record (a dead runner's `running` shown abandoned, one
    dated in the future suspect) and the ticks the ledger shows nobody ran whose claim window
    closed (pure)."""
    rows = [_row(record, snapshot.lock_session, now) for record in snapshot.records]
    recorded = {record.tick for record in snapshot.records}
    missed = missed_ticks(job.schedule, recorded, now, job.start_deadline, limit=job.history_limit)
    rows += [TickRow(tick, TickOutcome.MISSED.value, None) for tick in missed]
    rows.sort(key=lambda row: row.tick, reverse=True)
    next_tick = job.schedule.next_ticks(now, 1)[0]
    return JobHistory(
        job.name, job.lock_key, job.schedule, tuple(rows), now, next_tick, snapshot.lock_session
    )


def _row(record: TickRecord, lock_session: str | None, now: datetime) -> TickRow:
    if suspect(record.tick, now):
        return TickRow(record.tick, SUSPECT, record)
    if record.outcome is TickOutcome.RUNNING and (
        record.session is None or record.session != _shown(lock_session)
    ):
        return TickRow(record.tick, ABANDONED, record)
    return TickRow(record.tick, record.outcome.value, record)


def _shown(session: str | None) -> str | None:
    """The lock's session as a record's session field would hold it (bounded, printable)."""
    return None if session is None else printable(session, FIELD_LIMIT)


def read_history(consul: Consul, job: LedgerJob, now: datetime | None = None) -> JobHistory:
    """The job's history as of `now`, else the agent's clock (Consul's word, the one the runners
    compare with), else this host's."""
    snapshot = read_snapshot(consul, job.lock_key)
    moment = now or snapshot.date or datetime.now(timezone.utc)
    return build_history(job, snapshot, moment)


# --- recording what was missed ------------------------------------------------------------------


@dataclass(frozen=True)
class MissedRecording:
    written: int
    denied: bool  # the token may read but not write: reported, not recorded


def record_missed(consul: Consul, history: JobHistory) -> MissedRecording:
    """Write `missed` records for the ticks `history` computed (cas index 0: never twice, and
    never over a claim that landed meanwhile). A read-only token is no error: nothing is
    written, and the caller says so."""
    ticks = history.unrecorded_missed
    if not ticks:
        return MissedRecording(0, False)
    host = printable(socket.gethostname(), FIELD_LIMIT)
    records = [
        TickRecord(tick, TickOutcome.MISSED, worker=NOTICER, host=host, finished_at=history.now)
        for tick in ticks
    ]
    try:
        return MissedRecording(Ledger(consul, history.lock_key).record_missed(records), False)
    except PermissionDenied:
        return MissedRecording(0, True)


# --- --since ------------------------------------------------------------------------------------


def parse_since(text: str, now: datetime) -> datetime:
    """`24h`, `90m`, `7d` (back from `now`) or an ISO date or date/time (UTC unless it says
    otherwise): the earliest tick to show. ValueError, in one line, for anything else."""
    back = _duration_back(text)
    if back is not None:
        return now - back
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        shown = repr(text) if len(text) <= 40 else repr(text[:40]) + "..."
        raise ValueError(
            f"{shown} is neither a duration back from now (24h, 90m, 7d) nor an ISO date or "
            "date/time (2026-12-01, 2026-12-01T02:00:00Z)"
        ) from None
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment


def _duration_back(text: str) -> timedelta | None:
    days = _DAYS.fullmatch(text)
    if days:
        return timedelta(days=int(days.group(1)))
    if text[:1] in "+-":
        return None  # a sign means a date's offset here, not a duration
    try:
        return timedelta(seconds=parse_duration(text).seconds)
    except (DurationSyntaxError, OverflowError):
        return None


def _iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
