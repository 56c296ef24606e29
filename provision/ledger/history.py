"""A job's run history from its tick ledger: what `lockctl history`, `status` and `check` show.

Reads are bounded whatever the ledger holds (ledger/store.py `tick_names`, `fetch`): the key
names first (names only, up to 4 MiB of them), then only the records a reader needs, newest
first (history: --limit and --since; status: the newest; check: back to a success and its
recent ticks), FETCH_BATCH at a time, each answer read up to a cap: a record over
RECORD_MAX_BYTES is reported in one line (`key: value: why`), counted and shown `unreadable`,
never decoded. The lock key is read first (a plain GET: it says 403 to a token that may not
read, where a listing of names is filtered instead) and every batch checks its index, so the
records and the lock's holder are one moment of Consul's state: a run that completes between
two separate reads would otherwise look abandoned.

Every record is the writer's word (anyone with write on the prefix writes these keys), decoded
bounded and printable by provision/ledger/records.py. A `running` record whose session no longer
holds the lock is shown `abandoned`: its runner died before completing it. A record dated in the
future (ledger/ticks.py `suspect`) is shown `suspect` and is never a run: not the last one, not
a success. Ticks nobody ran whose claim window closed are shown `missed` whether or not anyone
recorded them yet.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from provision.blackouts import Blackout, holding_window
from provision.consul import Consul
from provision.keyed import keyed_lock_key
from provision.ledger.attempts import attempts_text
from provision.ledger.control import NO_PAUSES, Pauses
from provision.ledger.operator import readable_pauses
from provision.ledger.records import (
    FIELD_LIMIT,
    RecordProblem,
    TickRecord,
    tick_key,
    tick_name,
    timestamp,
)
from provision.ledger.store import Ledger
from provision.ledger.ticks import missed_ticks, suspect
from provision.outcomes import Outcome
from provision.schedule import Schedule, parse_schedule
from provision.system.text import printable

if TYPE_CHECKING:
    from provision.spec.models import Job

ABANDONED = "abandoned"  # shown for a `running` record whose session no longer holds the lock
SUSPECT = "suspect"  # shown for a record dated in the future, whatever it says
NOTICER = "lockctl check"  # the worker field of the missed records `check` writes
SUSPECT_READ = 10  # suspect records (dated in the future) whose values a reader reads; all counted
TOO_LARGE = "too large: not read"  # the note of a record over RECORD_MAX_BYTES
# what a tick nobody recorded is
UNRUN = (Outcome.MISSED.value, Outcome.PAUSED.value, Outcome.BLACKOUT.value)


@dataclass(frozen=True)
class LedgerJob:
    """What the ledger readers need of a spec job that has a schedule."""

    name: str
    lock_key: str
    schedule: Schedule
    start_deadline: float
    history_limit: int
    blackouts: tuple[Blackout, ...] = ()  # its ticks in these are `blackout`, not missed
    key: str | None = None  # a keyed job's key whose ledger this is (provision/keyed.py)

    @property
    def title(self) -> str:
        """The job, and the key whose ledger this is: `report, key tenant-42`."""
        return self.name if self.key is None else f"{self.name}, key {self.key}"

    def keyed(self, key: str) -> LedgerJob:
        """The ledger of the job's runs for `key` (a key that passed keyed.key_problem)."""
        return replace(self, lock_key=keyed_lock_key(self.lock_key, key), key=key)


def ledger_job(job: Job) -> LedgerJob | None:
    """The job's ledger settings, or None when it has no schedule (and so no ledger)."""
    if job.schedule is None:
        return None
    return LedgerJob(
        name=job.name,
        lock_key=job.lock_key,
        schedule=parse_schedule(job.schedule, job.timezone),
        start_deadline=job.timings.start_deadline,
        history_limit=job.history_limit,
        blackouts=job.blackouts,
    )


# --- reading ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LedgerSnapshot:
    """One job's records (oldest first, the ones read) and who holds its lock, at one moment;
    `recorded`: every tick the ledger has a key for (None: the records' own)."""

    records: tuple[TickRecord, ...]
    lock_session: str | None  # Consul's word: the session on the lock key now
    date: datetime | None  # the agent's clock at the answer
    recorded: frozenset[datetime] | None = None
    problems: tuple[RecordProblem, ...] = ()  # records not decoded (over RECORD_MAX_BYTES)

    @property
    def ticks(self) -> frozenset[datetime]:
        if self.recorded is not None:
            return self.recorded
        return frozenset(record.tick for record in self.records)


# Whether the records read so far (newest first) tell a reader enough, at the clock given: it
# stops there (`check`: once it has read back to a success and past its recent ticks).
Enough = Callable[[Sequence[TickRecord], datetime], bool]


@dataclass(frozen=True)
class Wanted:
    """Which records a reader reads: the newest `limit` from `since` on (to `until`) that are
    not dated in the future (and up to SUSPECT_READ of those), newest first, until `enough`
    says so."""

    limit: int
    since: datetime | None = None
    enough: Enough | None = None
    until: datetime | None = None
    back: timedelta | None = None  # since this long before now, on the read's (Consul's) clock

    def earliest(self, now: datetime) -> datetime | None:
        if self.back is None:
            return self.since
        return max(now - self.back, self.since or now - self.back)


def wanted_ticks(
    ticks: frozenset[datetime], now: datetime, wanted: Wanted
) -> tuple[list[datetime], list[datetime]]:
    """The ticks whose records to read, newest first: the real ones, and the suspect ones
    (newest by name, so thousands of forged ones push no real record out: pure)."""
    real = sorted((t for t in ticks if not suspect(t, now)), reverse=True)
    since = wanted.earliest(now)
    if since is not None:
        real = [tick for tick in real if tick >= since]
    if wanted.until is not None:
        real = [tick for tick in real if tick <= wanted.until]
    future = sorted((t for t in ticks if suspect(t, now)), reverse=True)
    return real[: max(wanted.limit, 0)], future[:SUSPECT_READ]


def read_snapshot(consul: Consul, lock_key: str, wanted: Wanted) -> LedgerSnapshot:
    """The ledger's names (GET ?keys), then the lock key (GET: 403 when the token may not read)
    and the wanted records at one state of it, in capped read-only transactions (PUT /v1/txn):
    the real ones newest first until `wanted.enough`, then the suspect ones to show."""
    ledger = Ledger(consul, lock_key)
    ticks, date = ledger.tick_names()
    names = frozenset(ticks)
    moment = date or datetime.now(timezone.utc)
    real, future = wanted_ticks(names, moment, wanted)
    enough = wanted.enough
    until = None if enough is None else lambda read: enough(_newest_first(read), moment)
    fetched = ledger.fetch(real, until=until)
    if future:  # not runs: the lock's state means nothing to them
        fetched = fetched.then(ledger.fetch(future))
    records = tuple(sorted(fetched.records, key=lambda r: r.tick))
    return LedgerSnapshot(
        records, fetched.lock_session, date or fetched.date, names, fetched.problems
    )


def _newest_first(records: Sequence[TickRecord]) -> list[TickRecord]:
    return sorted(records, key=lambda record: record.tick, reverse=True)


# --- the history ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TickRow:
    """One tick as shown: its record (None: missed and not recorded yet) and what it means."""

    tick: datetime
    outcome: str  # a Outcome value, or `abandoned`
    record: TickRecord | None
    note: str | None = None  # lockctl's own word on it: TOO_LARGE

    @property
    def recorded(self) -> bool:
        return self.record is not None

    @property
    def missed(self) -> bool:
        return self.outcome == Outcome.MISSED.value

    @property
    def suspect(self) -> bool:
        return self.outcome == SUSPECT

    @property
    def label(self) -> str:
        """The outcome for people: says when a missed tick is not in the ledger yet, and what
        a suspect record claims (an outcome lockctl decoded: one of its own words)."""
        if self.suspect and self.record is not None:
            return f"suspect: dated in the future (says {self.record.outcome.value})"
        if self.note is not None:
            return f"{self.outcome} ({self.note})"
        r = self.record
        if r is None:  # missed, and nobody recorded it yet
            return "missed (not recorded yet)" if self.missed else self.outcome
        said = attempts_text(self.outcome, r.attempts, r.retries_cut, r.catchup)
        if self.outcome == Outcome.BUFFERED.value:
            return f"{said} (runs when the run before it ends)"
        if r.window is not None:
            return f"{said} (window {r.window})"
        if r.by is not None:
            manual = "manual, " if r.trigger is not None else ""
            manual = "backfill, " if r.backfill is not None else manual
            return f"{said} ({manual}{operator_said(r)})"
        return said

    def to_record(self) -> dict[str, Any]:
        """The row as `history --json` says it; `window` only for a blackout record (the same
        document as the release before for every other row: scripts reading it keep working)."""
        r = self.record
        window = {} if r is None or r.window is None else {"window": r.window}
        if r is not None and r.backfill is not None:  # only a backfill's row says it (as window)
            window["backfill"] = r.backfill
        return {
            "tick": tick_name(self.tick),
            "outcome": self.outcome,
            "recorded": self.recorded,
            "recorded_outcome": None if r is None else r.outcome.value,
            "note": self.note,
            "worker": None if r is None else r.worker,  # the record's own word
            "host": None if r is None else r.host,
            "session": None if r is None else r.session,
            "lock_index": None if r is None else r.lock_index,
            "exit_status": None if r is None else r.exit_status,
            "duration": None if r is None else r.duration,
            "attempts": None if r is None or r.attempts is None else list(r.attempts),
            "retries_cut": None if r is None else r.retries_cut,
            "start_lag": None if r is None else r.start_lag,
            "planned_start": None if r is None else r.planned_start,
            "claimed_at": _iso(None if r is None else r.claimed_at),
            "finished_at": _iso(None if r is None else r.finished_at),
            "stdout": None if r is None else r.stdout,  # the end of it, masked and printable
            "stderr": None if r is None else r.stderr,
            "by": None if r is None else r.by,  # who paused the job, or asked for this run
            "reason": None if r is None else r.reason,
            "asked_at": _iso(None if r is None else r.asked_at),
            "trigger": None if r is None else r.trigger,
            "catchup": None if r is None else r.catchup,
            **window,
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
    suspect_count: int = 0  # every record dated in the future, read or not (by name)
    problems: tuple[RecordProblem, ...] = ()  # records read but not decoded, one line each
    pauses: Pauses = NO_PAUSES  # read only when a tick nobody ran has no record yet
    blackouts: tuple[Blackout, ...] = ()  # the job's windows: its ticks in them are not missed
    key: str | None = None  # a keyed job's key whose ledger this is

    @property
    def title(self) -> str:
        """The job, and the key whose ledger this is: `report, key tenant-42`."""
        return self.job if self.key is None else f"{self.job}, key {self.key}"

    @property
    def unrecorded_missed(self) -> list[datetime]:  # nobody ran them: missed, or paused
        return [row.tick for row in self.rows if not row.recorded and row.outcome in UNRUN]

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

    def newest(self, count: int) -> JobHistory:
        """The newest `count` rows that may be runs, and the suspect ones read."""
        kept = set(self.runs[: max(count, 0)]) | set(self.suspect)
        return replace(self, rows=tuple(row for row in self.rows if row in kept))

    def to_record(self) -> dict[str, Any]:
        return {
            "job": self.job,
            **({} if self.key is None else {"key": self.key}),
            "lock_key": self.lock_key,
            "schedule": self.schedule.text,
            "timezone": self.schedule.zone,
            "now": _iso(self.now),
            "next_tick": tick_name(self.next_tick),
            "ticks": [row.to_record() for row in self.rows],
            "suspect_records": self.suspect_count,
            "problems": [{"key": p.key, "field": p.field, "why": p.why} for p in self.problems],
        }


def build_history(
    job: LedgerJob, snapshot: LedgerSnapshot, now: datetime, pauses: Pauses = NO_PAUSES
) -> JobHistory:
    """The rows, newest first: every record (a dead runner's `running` shown abandoned, one
    dated in the future suspect) and the ticks the ledger shows nobody ran whose claim window
    closed: `blackout` when one of the job's windows held it, `paused` when one of `pauses`
    did, else `missed` (pure)."""
    too_large = {problem.key for problem in snapshot.problems}
    rows = [_row(job, r, snapshot.lock_session, now, too_large) for r in snapshot.records]
    recorded = snapshot.ticks  # every name: a record not read is still a tick someone has
    missed = missed_ticks(job.schedule, recorded, now, job.start_deadline, limit=job.history_limit)
    rows += [_unrun_row(tick, pauses, job.blackouts) for tick in missed]
    rows.sort(key=lambda row: row.tick, reverse=True)
    next_tick = job.schedule.next_ticks(now, 1)[0]
    suspects = sum(1 for tick in recorded if suspect(tick, now))
    return JobHistory(
        job.name,
        job.lock_key,
        job.schedule,
        tuple(rows),
        now,
        next_tick,
        snapshot.lock_session,
        suspects,
        snapshot.problems,
        pauses,
        job.blackouts,
        job.key,
    )


def _unrun_row(tick: datetime, pauses: Pauses, windows: tuple[Blackout, ...]) -> TickRow:
    window = holding_window(windows, tick)
    if window is not None:
        note = f"not recorded yet, window {window.name}"
        return TickRow(tick, Outcome.BLACKOUT.value, None, note)
    pause = pauses.holding(tick)
    if pause is None:
        return TickRow(tick, Outcome.MISSED.value, None)
    return TickRow(tick, Outcome.PAUSED.value, None, f"not recorded yet, {pause.said()}")


def _row(
    job: LedgerJob, record: TickRecord, lock_session: str | None, now: datetime, too_large: set[str]
) -> TickRow:
    if suspect(record.tick, now):
        return TickRow(record.tick, SUSPECT, record)
    if tick_key(job.lock_key, record.tick) in too_large:
        return TickRow(record.tick, record.outcome.value, record, TOO_LARGE)
    if record.outcome is Outcome.RUNNING and (
        record.session is None or record.session != _shown(lock_session)
    ):
        return TickRow(record.tick, ABANDONED, record)
    return TickRow(record.tick, record.outcome.value, record)


def _shown(session: str | None) -> str | None:
    """The lock's session as a record's session field would hold it (bounded, printable)."""
    return None if session is None else printable(session, FIELD_LIMIT)


def read_history(
    consul: Consul, job: LedgerJob, now: datetime | None = None, wanted: Wanted | None = None
) -> JobHistory:
    """The job's history as of `now`, else the agent's clock (Consul's word, the one the runners
    compare with), else this host's, from the records `wanted` (default: the newest
    history_limit, what the ledger keeps)."""
    snapshot = read_snapshot(consul, job.lock_key, wanted or Wanted(job.history_limit))
    moment = now or snapshot.date or datetime.now(timezone.utc)
    history = build_history(job, snapshot, moment)
    if not history.unrecorded_missed:
        return history
    return build_history(job, snapshot, moment, readable_pauses(consul, job.name))


def read_tick(consul: Consul, job: LedgerJob, tick: datetime) -> tuple[JobHistory, TickRow | None]:
    """One tick's row, its record read alone (None: no record, and not missed either: a tick
    still to come, or one before the ledger's oldest record), and the history it is from."""
    found = read_history(consul, job, wanted=Wanted(1, since=tick, until=tick))
    return found, next((row for row in found.rows if row.tick == tick), None)


# --- --since ------------------------------------------------------------------------------------


def operator_said(record: TickRecord) -> str:
    """`by alice at 2026-12-04T22:00:00.000Z: disk swap`: an operator's word in a record."""
    when = "" if record.asked_at is None else f" at {timestamp(record.asked_at)}"
    why = f": {record.reason}" if record.reason else ""
    return f"by {record.by}{when}{why}"


def _iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
