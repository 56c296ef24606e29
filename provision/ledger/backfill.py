"""Backfill (`lockctl backfill JOB --from T1 --to T2`): the ticks of a past range run once
each, late, on the operator's word. Pure rules and the note (table-tested in
tests/unit/test_ledger_backfill.py).

    lockctl/control/<job>/backfill  {"format": 1, "by": ..., "at": ..., "reason": ..., "id": ...,
                                     "ticks": ["2026-12-07T09:00:00Z", ...]}

The command decides the ticks (`plan_backfill`: the schedule's ticks in the range, less those
that ran, a blackout window held, or the ledger can no longer tell about) and writes ONE note;
the schedulers hear it on the control watch and claim each listed tick at its own instant,
oldest first, over its record as read (none, `missed` or `paused`), as a catch-up is claimed
(ledger/store.py ClaimTerms.over): the claim transaction lets one replica run each tick, once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from provision.errors import InputError
from provision.ledger.control import NOTE_FORMAT, _moment, note_fields, note_of
from provision.ledger.records import TickRecord, parse_tick_name, tick_name, timestamp
from provision.outcomes import Outcome
from provision.schedule import Schedule

MAX_TICKS = 100  # ticks in one backfill: a note stays a few KB (~23 bytes a tick)
BACKFILL_MAX_BYTES = 8192
# A backfill's ticks are claimed for this long after it was asked (as a trigger's run is):
# after that a tick it could not run (the job held elsewhere all along) is dropped, unrun.
BACKFILL_WINDOW = 24 * 3600.0
RERUN = (Outcome.MISSED, Outcome.PAUSED)  # a record a backfill runs over: nobody ran the tick


@dataclass(frozen=True)
class BackfillNote:
    """An operator's backfill: who asked, when, why, its id, and the ticks to run (oldest
    first)."""

    by: str
    at: datetime | None
    ticks: tuple[datetime, ...]
    reason: str | None = None
    id: str | None = None

    def encode(self) -> bytes:
        fields: dict[str, Any] = {"format": NOTE_FORMAT, "by": self.by}
        if self.at is not None:
            fields["at"] = timestamp(self.at)
        if self.reason:
            fields["reason"] = self.reason
        if self.id:
            fields["id"] = self.id
        fields["ticks"] = [tick_name(tick) for tick in self.ticks]
        return json.dumps(fields, separators=(",", ":"), ensure_ascii=False).encode()

    def said(self) -> str:
        """`by alice at 2026-12-07T09:40:00.000Z: rerun after the outage`."""
        when = "" if self.at is None else f" at {timestamp(self.at)}"
        return f"by {self.by}{when}" + (f": {self.reason}" if self.reason else "")


def decode_backfill(value: bytes | None) -> BackfillNote | None:
    """The note a backfill key holds (untrusted: every field checked and bounded); None when it
    is not one lockctl wrote (no id, no time or no ticks): left alone, never run."""
    raw = note_fields(value, BACKFILL_MAX_BYTES)
    if raw is None:
        return None
    listed = raw.get("ticks")
    names = listed[:MAX_TICKS] if isinstance(listed, list) else []
    ticks = [parse_tick_name(name) for name in names if isinstance(name, str)]
    said = note_of(raw)  # who, when, why, the id: as every control note's
    note = BackfillNote(
        by=said.by,
        at=said.at,
        ticks=tuple(sorted({tick for tick in ticks if tick is not None})),
        reason=said.reason,
        id=said.id,
    )
    return note if note.id and note.at and note.ticks else None


def may_backfill(record: TickRecord | None) -> bool:
    """Whether a backfill runs a tick with this record (None: none): nobody ran it. A `paused`
    tick is run (the operator asks for it by name); a `blackout` one is not (the spec says the
    job must not run then)."""
    return record is None or record.outcome in RERUN


def beyond_ledger(tick: datetime, recorded: Collection[datetime]) -> bool:
    """Whether the ledger can no longer tell if `tick` ran (pure): it is older than the oldest
    record, where retention may have pruned its record. A backfill never runs such a tick: it
    may have run, its record deleted since (a backfilled tick's own record among them, when a
    scheduler hears the backfill again after a restart). Whether the ledger was ever pruned is
    not known from its size: a history_limit raised since leaves it below the new limit. An
    empty ledger is a job that never recorded a tick: nothing was pruned."""
    return bool(recorded) and tick < min(recorded)


@dataclass(frozen=True)
class BackfillPlan:
    """What a backfill of a range would do: the ticks it runs, oldest first, and those it
    skips, each with why."""

    run: tuple[datetime, ...]
    skipped: tuple[tuple[datetime, str], ...]
    crowded: bool = False  # the range holds more than MAX_TICKS ticks: the rest not looked at


@dataclass(frozen=True)
class BackfillLedger:
    """What the job's ledger says, for a backfill: its records by tick."""

    records: Mapping[datetime, TickRecord]


def instant(flag: str, text: str) -> datetime:
    """The instant `--from`/`--to` names (pure): an ISO 8601 time with its zone (Z or an offset);
    InputError naming the flag otherwise."""
    moment = _moment(text)  # None without a zone: a local time would mean another instant
    if moment is None:
        raise InputError(f"{flag} {text!r} is not an instant such as 2026-12-07T02:00:00Z")
    return moment


def range_problem(start: datetime, end: datetime, now: datetime) -> str | None:
    """Why `--from start --to end` is refused (None: fine), naming the flag (pure)."""
    if start >= end:
        return f"--from {timestamp(start)} is not before --to {timestamp(end)}"
    if end > now:
        return f"--to {timestamp(end)} is in the future (Consul's clock: {timestamp(now)})"
    return None


def plan_backfill(
    schedule: Schedule,
    span: tuple[datetime, datetime],
    closed: datetime,
    ledger: BackfillLedger,
    held: Callable[[datetime], str | None],
) -> BackfillPlan:
    """The schedule's ticks in `span` (both ends included) that a backfill runs: those whose
    claim window closed by `closed` (a later one is still its own turn's), nobody ran
    (`may_backfill`), no blackout window held (`held(tick)`: the window's name, or None), and,
    when retention may have pruned the ledger, no older than its oldest record (whether it ran
    is not known any more); the rest skipped, each with why."""
    start, end = span
    run: list[datetime] = []
    skipped: list[tuple[datetime, str]] = []
    ticks = _ticks_in(schedule, start, end)
    for tick in ticks:
        record, window = ledger.records.get(tick), held(tick)
        if tick > closed:
            skipped.append((tick, "its claim window is still open: its own turn runs it"))
        elif record is not None and not may_backfill(record):
            skipped.append((tick, f"already recorded {record.outcome.value}"))
        elif window is not None:
            skipped.append((tick, f"in blackout window {window}"))
        elif beyond_ledger(tick, ledger.records.keys()):
            skipped.append((tick, "older than the ledger's oldest record: whether it ran is lost"))
        else:
            run.append(tick)
    return BackfillPlan(tuple(run), tuple(skipped), len(ticks) > MAX_TICKS)


def _ticks_in(schedule: Schedule, start: datetime, end: datetime) -> list[datetime]:
    """The schedule's ticks in [start, end], oldest first; at most MAX_TICKS + 1 of them (one
    more than a backfill may hold: enough to refuse the range)."""
    found: list[datetime] = []
    first = schedule.next_ticks(start - timedelta(microseconds=1), 1)[0]
    while first <= end and len(found) <= MAX_TICKS:
        found.append(first)
        first = schedule.next_ticks(first, 1)[0]
    return found


def limit_problem(plan: BackfillPlan, limit: int, yes: bool) -> str | None:
    """Why the backfill is refused for its size (None: fine): more ticks than MAX_TICKS, ever;
    more than the job's catchup_limit without --yes."""
    count = len(plan.run)
    if plan.crowded:  # ticks past the first MAX_TICKS were not looked at: never half a range
        return f"more than {MAX_TICKS} ticks in the range: backfill a shorter one at a time"
    if count > MAX_TICKS:
        return f"more than {MAX_TICKS} ticks to run: backfill a shorter range at a time"
    if count > limit and not yes:
        return f"{count} ticks to run, over the job's catchup_limit ({limit}): confirm with --yes"
    return None


def pending(note: BackfillNote, records: Mapping[datetime, TickRecord], now: datetime) -> bool:
    """Whether the backfill `note` still waits for a replica (pure): within BACKFILL_WINDOW of
    when it was asked, and one of its ticks is still not run (`records`: the job's ledger)."""
    assert note.at is not None
    if (now - note.at).total_seconds() > BACKFILL_WINDOW:
        return False
    return any(may_backfill(records.get(tick)) for tick in note.ticks)


def listed(ticks: Sequence[datetime]) -> str:
    """`2026-12-07T09:00:00Z, 2026-12-07T09:00:05Z` (the first 5, then how many more)."""
    names = [tick_name(tick) for tick in ticks[:5]]
    more = f" and {len(ticks) - 5} more" if len(ticks) > 5 else ""
    return ", ".join(names) + more
