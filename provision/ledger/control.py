"""The operators' control keys of a job (pause, trigger): what they hold, pure.

    lockctl/control/<job>/paused    {"format": 1, "by": ..., "reason": ..., "at": ..., "ends": ...}
    lockctl/control/<job>/trigger   {"format": 1, "by": ..., "reason": ..., "at": ..., "id": ...}
    lockctl/control/<job>/pauses    {"format": 1, "pauses": [{"by": ..., "at": ..., "until": ...}]}

`pauses` keeps the newest PAUSES_KEPT pauses `lockctl resume` ended: a tick nobody ran is
recorded `paused` when a pause held it (`holding_pause`), even when it is noticed after the
resume (every replica was down meanwhile), not `missed`.

They live outside every job's prefix (spec/names.py CONTROL_ROOT): the job's workers may read
them (the rendered lock policy) and not write them, so only an operator's token pauses, resumes
or triggers. A worker still decodes them as untrusted text: every field is checked, bounded and
made printable, and a value that is not a note still pauses (its key exists), by "unknown".

A time-boxed pause (`lockctl pause --for/--until`) carries `ends`: the ticks at or after it run
(`pause_holds`), judged against the tick's instant, which the core reaches on Consul's clock; the
key stays until `lockctl resume` (a worker may not delete it). A replica of a release before
`ends` treats any paused key as a pause, so it keeps refusing the ticks it claims past `ends`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Any

from provision.blackouts import Blackout
from provision.errors import InputError
from provision.ledger.records import TickRecord, believable, timestamp
from provision.outcomes import Outcome
from provision.system.text import printable

NOTE_FORMAT = 1
BY_LIMIT = 128  # characters of who asked (an operator token's description)
REASON_LIMIT = 200  # characters of why
NOTE_MAX_BYTES = 4096  # a note lockctl writes is well under 1 KB
UNKNOWN = "unknown"
PAUSES_KEPT = 16  # resumed pauses kept: a few outages' worth of pause and resume
PAUSES_MAX_BYTES = PAUSES_KEPT * NOTE_MAX_BYTES


@dataclass(frozen=True)
class ControlNote:
    """Who asked for a pause or a trigger, when and why (`id`: a trigger's, to take it once)."""

    by: str
    at: datetime | None
    reason: str | None = None
    id: str | None = None
    until: datetime | None = None  # a pause's: when `lockctl resume` ended it
    ends: datetime | None = None  # a time-boxed pause's: its ticks from this instant on run

    def encode(self) -> bytes:
        return _json(self.fields())

    def fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"format": NOTE_FORMAT, "by": self.by}
        for name, moment in (("at", self.at), ("until", self.until), ("ends", self.ends)):
            if moment is not None:
                fields[name] = timestamp(moment)
        if self.reason:
            fields["reason"] = self.reason
        if self.id:
            fields["id"] = self.id
        return fields

    def said(self) -> str:
        """`by alice@ops at 2026-12-04T22:00:00.000Z: disk swap`, for a table or a message."""
        when = "" if self.at is None else f" at {timestamp(self.at)}"
        why = f": {self.reason}" if self.reason else ""
        ends = "" if self.ends is None else f" until {timestamp(self.ends)}"
        return f"by {self.by}{when}{ends}{why}"


def decode_note(value: bytes | None) -> ControlNote:
    """The note a control key holds; anything else is a note by UNKNOWN (the key still counts)."""
    raw = note_fields(value, NOTE_MAX_BYTES)
    return ControlNote(UNKNOWN, None) if raw is None else note_of(raw)


def note_fields(value: bytes | None, limit: int) -> dict[str, Any] | None:
    """The fields of a note lockctl wrote (a JSON object of its format, `limit` bytes at most);
    None for anything else. Untrusted: each field is checked by whoever reads it."""
    raw = _load(value, limit)
    return raw if isinstance(raw, dict) and raw.get("format") == NOTE_FORMAT else None


def note_of(raw: dict[str, Any]) -> ControlNote:
    """Who, when, why and the id of a note's fields, each checked and bounded."""
    return ControlNote(
        by=_text(raw.get("by"), BY_LIMIT) or UNKNOWN,
        at=_moment(raw.get("at")),
        reason=_text(raw.get("reason"), REASON_LIMIT),
        id=_text(raw.get("id"), 64),
        until=_moment(raw.get("until")),
        ends=_moment(raw.get("ends")),
    )


# --- the pauses a resume ended ------------------------------------------------------------------


def encode_pauses(pauses: Sequence[ControlNote]) -> bytes:
    """The `pauses` key's value: the newest PAUSES_KEPT of `pauses` (given newest first)."""
    kept = [{k: v for k, v in p.fields().items() if k != "format"} for p in pauses[:PAUSES_KEPT]]
    return _json({"format": NOTE_FORMAT, "pauses": kept})


def decode_pauses(value: bytes | None) -> tuple[ControlNote, ...]:
    """The pauses the `pauses` key holds that bound a time (`at` and `until` both read), newest
    first; anything else holds none (a tick it might have held is recorded missed: it pages)."""
    raw = _load(value, PAUSES_MAX_BYTES)
    if not isinstance(raw, dict) or raw.get("format") != NOTE_FORMAT:
        return ()
    listed = raw.get("pauses")
    entries = listed[:PAUSES_KEPT] if isinstance(listed, list) else []
    notes = [note_of(entry) for entry in entries if isinstance(entry, dict)]
    return tuple(n for n in notes if n.at is not None and n.until is not None and n.at < n.until)


def ended(pause: ControlNote, until: datetime, earlier: Sequence[ControlNote]) -> bytes:
    """The `pauses` value after `lockctl resume` ends `pause` at `until`: it, then `earlier`."""
    return encode_pauses([replace(pause, until=until), *earlier])


@dataclass(frozen=True)
class Pauses:
    """A job's pause now (None: not paused) and the pauses `lockctl resume` ended, newest
    first: what decides whether a tick nobody ran is recorded `paused` or `missed`."""

    paused: ControlNote | None = None
    resumed: tuple[ControlNote, ...] = ()

    def holding(self, tick: datetime) -> ControlNote | None:
        return holding_pause(tick, self.paused, self.resumed)


NO_PAUSES = Pauses()


def holding_pause(
    tick: datetime, paused: ControlNote | None, resumed: Sequence[ControlNote]
) -> ControlNote | None:
    """The pause that held `tick` (pure): the job's pause now, if it began at or before the
    tick, else a resumed one whose time holds it ([at, until)). None: no pause held it, or
    none says when it began (a note not lockctl's: the tick is missed, and pages)."""
    if paused is not None and paused.at is not None and paused.at <= tick:
        return paused if pause_holds(paused, tick) else None
    return next((p for p in resumed if _held(tick, p.at, p.until)), None)


def pause_holds(pause: ControlNote, tick: datetime) -> bool:
    """Whether the job's pause `pause` (its key exists) holds `tick` (pure): always, unless it is
    time-boxed and `tick` is at or after its end."""
    return pause.ends is None or tick < pause.ends


def _held(tick: datetime, start: datetime | None, end: datetime | None) -> bool:
    return start is not None and end is not None and start <= tick < end


def unrun_record(
    tick: datetime,
    worker: str,
    finished_at: datetime,
    pause: ControlNote | None,
    window: Blackout | None = None,
    **fields: Any,
) -> TickRecord:
    """The record of a tick nobody ran (pure): `blackout`, naming the window, when one of the
    job's blackout windows held it (`holding_window`: the spec's word outranks a pause's);
    `paused`, by whom and why, when a pause held it (`holding_pause`); `missed` otherwise."""
    if window is not None:
        fields.update(window=window.name)
        return TickRecord(tick, Outcome.BLACKOUT, worker=worker, finished_at=finished_at, **fields)
    if pause is not None:
        fields.update(by=pause.by, reason=pause.reason, asked_at=pause.at)
    outcome = Outcome.MISSED if pause is None else Outcome.PAUSED
    return TickRecord(tick, outcome, worker=worker, finished_at=finished_at, **fields)


def _json(fields: dict[str, Any]) -> bytes:
    return json.dumps(fields, separators=(",", ":"), ensure_ascii=False).encode()


def _load(value: bytes | None, limit: int) -> Any:
    if value is None or len(value) > limit:
        return None
    try:
        return json.loads(value)
    except (ValueError, RecursionError):
        return None


def reason_problem(reason: str | None) -> str | None:
    """Why `--reason` is refused (None: it is fine): one line, printable, bounded."""
    if reason is None:
        return None
    if not reason.strip():
        return "is empty"
    if len(reason) > REASON_LIMIT:
        return f"is longer than {REASON_LIMIT} characters"
    if printable(reason, REASON_LIMIT) != reason:
        return "has a control character or a character that is not printable"
    return None


DURATION = re.compile(r"(?:(\d{1,6})([smhd]))")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
LONGEST_PAUSE = timedelta(days=366)


def parse_duration(text: str) -> timedelta | None:
    """`90s`, `15m`, `2h`, `1h30m`, `7d` (pure): None when it is not one, or is zero."""
    parts = DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    seconds = sum(int(n) * UNITS[u] for n, u in parts)
    return timedelta(seconds=seconds) if seconds else None


def pause_end(duration: str | None, until: str | None, now: datetime) -> datetime | None:
    """When a pause asked with `--for duration` or `--until instant` ends (pure; None: never,
    neither given), `now` being Consul's clock. InputError, naming the flag, when it is not one,
    both are given, or it is not after `now` or more than LONGEST_PAUSE after it."""
    if duration is not None and until is not None:
        raise InputError("--for and --until: give one of them, not both")
    if duration is not None:
        length = parse_duration(duration)
        if length is None:
            raise InputError(
                f"--for {duration!r} is not a duration such as 90s, 15m, 2h, 1h30m, 7d"
            )
        ends, flag = now + length, "--for"
    elif until is not None:
        moment = _moment(until)
        if moment is None:
            raise InputError(f"--until {until!r} is not an instant such as 2026-12-24T00:00:00Z")
        ends, flag = moment, "--until"
    else:
        return None
    if ends <= now:
        raise InputError(
            f"{flag}: {timestamp(ends)} is not after Consul's clock ({timestamp(now)})"
        )
    if ends - now > LONGEST_PAUSE:
        raise InputError(f"{flag}: {timestamp(ends)} is more than 366 days away")
    return ends


def _text(value: Any, limit: int) -> str | None:
    return printable(value, limit) if isinstance(value, str) and value else None


def _moment(value: Any) -> datetime | None:
    if not isinstance(value, str) or len(value) > 40:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        utc = moment.astimezone(timezone.utc) if moment.tzinfo is not None else None
    except (ValueError, OverflowError):
        return None
    return utc if utc is not None and believable(utc) else None


TAKEN = "trigger-taken"  # in the job's own prefix, beside its ledger: the last trigger taken


def taken_key(lock_key: str) -> str:
    """`locks/job/.lock` -> `locks/job/trigger-taken`: the id of the last trigger a replica
    took, written in the claim of its run (the job's workers may write there; retention never
    deletes it, so a trigger whose run's record was pruned is still known as taken)."""
    return lock_key.rsplit("/", 1)[0] + "/" + TAKEN


def manual_tick(asked_at: datetime) -> datetime:
    """The instant a manual run is recorded at: when it was asked, to the millisecond, never a
    whole second (a scheduled tick's name), so its record has a key of its own in the ledger."""
    at = asked_at.astimezone(timezone.utc)
    at = at.replace(microsecond=at.microsecond // 1000 * 1000)
    return at if at.microsecond else at.replace(microsecond=1000)
