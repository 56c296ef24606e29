"""The tick ledger's records: one KV key per scheduled tick of a job, under the job's own prefix.

    <prefix>ticks/2026-12-01T02:00:00Z   {"format": 1, "tick": ..., "outcome": "running", ...}

A record exists once a runner claimed the tick (outcome `running`, in the same transaction as the
lock) or once someone noticed nobody did within its start deadline (`missed`). The runner that
ran it completes it (succeeded, failed, lost, interrupted, timed-out) before it releases the
lock. Keys sort by time (fixed-width UTC names), so the oldest records are the first keys.

Pure: encoding and decoding only. Decoding is for untrusted text: anyone with write on the prefix
writes these keys, so every field is checked, bounded and made printable, and a value that is not
a record still counts as one (its tick is taken) with outcome `unreadable`.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, replace
from dataclasses import fields as dataclass_fields
from datetime import datetime, timezone
from typing import Any

from provision.ledger.attempts import decode_attempts, decode_cut
from provision.outcomes import FINISHED as FINISHED
from provision.outcomes import LEDGER_OUTCOMES, Outcome
from provision.system.tails import newest_lines_within, newest_within, sanitise
from provision.system.text import printable

RECORD_FORMAT = 1
TICKS_DIR = "ticks/"
FIELD_LIMIT = 64  # characters of a name, host or session field
# Bytes of a record's value a reader decodes. A real record is under 1 KB (bench/ledger_size.py:
# ~400 bytes with a 64-character host); anyone who may write the prefix may write 512 KB, and
# 100 of those read whole took 260 MB and 4 s. Larger values are reported, never decoded.
RECORD_MAX_BYTES = 4096
# The ends of the job's stdout and stderr a record keeps, each at most this many bytes as JSON:
# two of them and the other fields (~400 bytes, 1 KB with every field at its bound) stay under
# RECORD_MAX_BYTES, which every reader, of any version, decodes. A longer output's newest part.
OUTPUT_BUDGET = 1536
OUTPUT_STREAMS = ("stdout", "stderr")
# a scheduled tick is a whole second; a manual run's (lockctl trigger) has its milliseconds
_TICK_NAME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{3})?Z")
_MAX_INT = 2**63


# `TickOutcome`: the old name of the record's words, now the one vocabulary's (kept for one
# release: tests and tools import it); a record holds only LEDGER_OUTCOMES.
TickOutcome = Outcome


def ticks_prefix(lock_key: str) -> str:
    """`locks/job/.lock` -> `locks/job/ticks/`: the ledger sits beside the lock, under the
    prefix the job's policy already grants."""
    return lock_key.rsplit("/", 1)[0] + "/" + TICKS_DIR


def tick_name(tick: datetime) -> str:
    if tick.microsecond:  # a manual run's instant (never a whole second: ledger/control.py)
        return timestamp(tick)
    return _second_name(tick.timestamp())


@functools.lru_cache(maxsize=4096)  # a scheduler names each tick several times (keys, events)
def _second_name(seconds: float) -> str:
    """A whole second's name, cached by the instant: not by the datetime, which compares equal
    to another one hour apart in a zone's repeated hour (PEP 495: fold is ignored)."""
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def tick_key(lock_key: str, tick: datetime) -> str:
    return ticks_prefix(lock_key) + tick_name(tick)


# A record is data from anyone who may write the job's prefix: a time outside these bounds is
# not believed (year 9999 overflows the arithmetic of every reader). 1970 is in: `verify`
# races for scratch ticks of 1970, which never collide with a real one.
EARLIEST = datetime(1970, 1, 1, tzinfo=timezone.utc)
LATEST = datetime(2200, 1, 1, tzinfo=timezone.utc)


def believable(moment: datetime) -> bool:
    return EARLIEST <= moment < LATEST


@functools.lru_cache(maxsize=4096)  # a ledger's names are read again at every look at it
def parse_tick_name(name: str) -> datetime | None:
    """The tick a ledger key's last segment names, or None if it names none."""
    if not _TICK_NAME.fullmatch(name):
        return None
    if name.endswith(".000Z"):  # never written: a whole second's name has no milliseconds
        return None
    try:  # the pattern matched: ISO 8601 in UTC (fromisoformat: a tenth of strptime's cost)
        tick = datetime.fromisoformat(name)
    except ValueError:
        return None
    return tick if believable(tick) else None


def timestamp(moment: datetime) -> str:
    """A wall-clock time in a record: UTC, milliseconds."""
    return moment.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class TickRecord:
    """One tick's record. Times are UTC; durations are seconds."""

    tick: datetime
    outcome: Outcome
    worker: str | None = None  # who claimed it (its own word), or who noticed it missed
    session: str | None = None
    host: str | None = None
    pid: int | None = None
    claimed_at: datetime | None = None
    start_lag: float | None = None  # claimed_at - tick
    planned_start: float | None = None  # seconds after the tick its start was planned (jitter)
    lock_index: int | None = None
    finished_at: datetime | None = None
    exit_status: int | None = None
    duration: float | None = None
    # each attempt's exit status when the job was retried (ledger/attempts.py), and why
    # retries it still had were cut; both None for a single attempt with nothing cut
    attempts: tuple[int | None, ...] | None = None
    retries_cut: str | None = None
    stdout: str | None = None  # the end of the job's output (system/tails.py): printable, masked
    stderr: str | None = None
    # an operator's word (ledger/control.py): who paused the job (a `paused` record) or asked
    # for this run (`lockctl trigger`: a manual run, `trigger` its id), when, why
    by: str | None = None
    reason: str | None = None
    asked_at: datetime | None = None
    trigger: str | None = None
    catchup: bool | None = None  # True: run as the catch-up of a tick nobody ran (catchup.py)
    backfill: str | None = None  # the id of the `lockctl backfill` that ran it (backfill.py)
    window: str | None = None  # a `blackout` record's: the blackout window that held the tick
    modify_index: int = 0  # Consul's, when read from Consul (the cas index to complete it at)

    def encode(self) -> bytes:
        fields: dict[str, Any] = {"format": RECORD_FORMAT}
        for name in _RECORD_FIELDS:  # asdict would deep-copy every value: none is nested
            value = getattr(self, name)
            if name == "modify_index" or value is None:
                continue
            if isinstance(value, datetime):
                value = tick_name(value) if name == "tick" else timestamp(value)
            elif isinstance(value, float):
                value = round(value, 3)
            fields[name] = value
        fields["outcome"] = self.outcome.value
        tails = {name: fields.pop(name) for name in OUTPUT_STREAMS if name in fields}
        if tails:  # measured only when there is output to fit in (most records have none)
            fields.update(fit_output(len(json.dumps(fields, separators=(",", ":"))), tails))
        return _COMPACT.encode(fields).encode()

    def completed(self, outcome: Outcome, *, finished_at: datetime, **fields: Any) -> TickRecord:
        return replace(self, outcome=outcome, finished_at=finished_at, **fields)

    @property
    def finished(self) -> bool:
        return self.outcome in FINISHED


# one encoder for every record (json.dumps with these options makes a new one at each call)
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_RECORDED: dict[str, Outcome] = {outcome.value: outcome for outcome in LEDGER_OUTCOMES}
_RECORD_FIELDS = tuple(field.name for field in dataclass_fields(TickRecord))


def decode(tick: datetime, value: bytes | None, modify_index: int = 0) -> TickRecord:
    """The record stored for `tick` (named by its key, which outranks what the value says); a
    value over RECORD_MAX_BYTES is not parsed at all (`unreadable`), whoever read it whole."""
    if value is not None and len(value) > RECORD_MAX_BYTES:
        return TickRecord(tick, Outcome.UNREADABLE, modify_index=modify_index)
    raw = _json_object(value)
    if raw is None or raw.get("format") != RECORD_FORMAT:
        return TickRecord(tick, Outcome.UNREADABLE, modify_index=modify_index)
    word = raw.get("outcome")  # a word of another place (`ran`) is no record's either
    outcome = (
        _RECORDED.get(word, Outcome.UNREADABLE) if isinstance(word, str) else Outcome.UNREADABLE
    )
    return TickRecord(
        tick=tick,
        outcome=outcome,
        worker=_text(raw.get("worker")),
        session=_text(raw.get("session")),
        host=_text(raw.get("host")),
        pid=_int(raw.get("pid")),
        claimed_at=_time(raw.get("claimed_at")),
        start_lag=_number(raw.get("start_lag")),
        planned_start=_number(raw.get("planned_start")),
        lock_index=_int(raw.get("lock_index")),
        finished_at=_time(raw.get("finished_at")),
        exit_status=_int(raw.get("exit_status")),
        duration=_number(raw.get("duration")),
        attempts=decode_attempts(raw.get("attempts")),
        retries_cut=decode_cut(raw.get("retries_cut")),
        stdout=_output(raw.get("stdout")),
        stderr=_output(raw.get("stderr")),
        by=_text(raw.get("by"), 128),
        reason=_text(raw.get("reason"), 200),
        asked_at=_time(raw.get("asked_at")),
        trigger=_text(raw.get("trigger")),
        catchup=True if raw.get("catchup") is True else None,
        backfill=_text(raw.get("backfill")),
        window=_text(raw.get("window")),
        modify_index=modify_index,
    )


def fit_output(others: int, tails: dict[str, str]) -> dict[str, str]:
    """The output tails cut to their budget: each at most OUTPUT_BUDGET bytes as JSON, and less
    when the record's `others` bytes leave less (the whole value stays under RECORD_MAX_BYTES)."""
    keys = sum(len(f',"{name}":') for name in tails)
    room = RECORD_MAX_BYTES - others - keys
    each = min(OUTPUT_BUDGET, room // max(len(tails), 1))
    fitted = {name: newest_lines_within(sanitise(text), each) for name, text in tails.items()}
    return fitted if each > 2 else {}


@dataclass(frozen=True)
class RecordProblem:
    """Why a ledger key was not read as a record, in one line: `key: field: why`."""

    key: str
    field: str
    why: str

    def line(self) -> str:
        return f"{printable(self.key)}: {self.field}: {self.why}"


def oversized(tick: datetime, key: str, size: int | None = None) -> RecordProblem:
    """The problem of a record whose value is over RECORD_MAX_BYTES (`size` when known): it
    still counts as a record (its tick is taken), `unreadable`, and is never decoded."""
    said = f"{size} bytes" if size is not None else f"more than {RECORD_MAX_BYTES} bytes"
    why = f"{said}, over the {RECORD_MAX_BYTES}-byte cap of a tick record: not read"
    return RecordProblem(key, "value", why)


def _json_object(value: bytes | None) -> dict[str, Any] | None:
    try:
        raw = json.loads(value or b"")
    except (ValueError, RecursionError):  # not JSON, not UTF-8, nested too deep
        return None
    return raw if isinstance(raw, dict) else None


def _text(value: Any, limit: int = FIELD_LIMIT) -> str | None:
    return printable(value, limit) if isinstance(value, str) and value else None


def _output(value: Any) -> str | None:
    """A stored output tail: the writer's word, so made printable and bounded again."""
    if not isinstance(value, str) or not value:
        return None
    return newest_within(sanitise(value[-OUTPUT_BUDGET:]), OUTPUT_BUDGET) or None


def _int(value: Any) -> int | None:
    if type(value) is int and -_MAX_INT < value < _MAX_INT:
        return value
    return None


def _number(value: Any) -> float | None:
    if type(value) in (int, float) and 0 <= value < 10**9:
        return float(value)
    return None


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str) or len(value) > 40:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        utc = moment.astimezone(timezone.utc) if moment.tzinfo is not None else None
    except (ValueError, OverflowError):  # 9999-12-31T23:59:59-01:00 is past datetime.max in UTC
        return None
    return utc if utc is not None and believable(utc) else None


def taken_fields(record: TickRecord) -> dict[str, object]:
    """The skipped event's fields for a tick someone else has: who, and how it went."""
    who = record.worker or "an unnamed runner"
    when = tick_name(record.tick)
    if record.outcome is Outcome.MISSED:
        reason = f"tick {when} already recorded missed (noticed by {who})"
    elif record.outcome is Outcome.PAUSED:
        reason = f"tick {when} already recorded paused (the job is paused, by {record.by})"
    elif record.outcome is Outcome.BLACKOUT:
        reason = f"tick {when} already recorded blackout (in window {record.window})"
    elif record.outcome is Outcome.RUNNING:
        reason = f"tick {when} already taken by {who} (running)"
    elif record.outcome is Outcome.BUFFERED:
        reason = f"tick {when} buffered by {who}: runs when the run before it ends"
    elif record.outcome is Outcome.UNREADABLE:
        reason = f"tick {when} already has a record (unreadable): not claimed again"
    else:
        reason = f"tick {when} already run by {who} ({record.outcome.value})"
    return {
        "reason": reason,
        "taken_by": record.worker,
        "taken_outcome": record.outcome.value,
        "taken_lock_index": record.lock_index,
    }
