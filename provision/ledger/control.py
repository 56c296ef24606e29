"""The operators' control keys of a job (pause, trigger): what they hold, pure.

    lockctl/control/<job>/paused    {"format": 1, "by": ..., "reason": ..., "at": ...}
    lockctl/control/<job>/trigger   {"format": 1, "by": ..., "reason": ..., "at": ..., "id": ...}

They live outside every job's prefix (spec/names.py CONTROL_ROOT): the job's workers may read
them (the rendered lock policy) and not write them, so only an operator's token pauses, resumes
or triggers. A worker still decodes them as untrusted text: every field is checked, bounded and
made printable, and a value that is not a note still pauses (its key exists), by "unknown".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from provision.ledger.records import believable, timestamp
from provision.system.text import printable

NOTE_FORMAT = 1
BY_LIMIT = 128  # characters of who asked (an operator token's description)
REASON_LIMIT = 200  # characters of why
NOTE_MAX_BYTES = 4096  # a note lockctl writes is well under 1 KB
UNKNOWN = "unknown"


@dataclass(frozen=True)
class ControlNote:
    """Who asked for a pause or a trigger, when and why (`id`: a trigger's, to take it once)."""

    by: str
    at: datetime | None
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
        return json.dumps(fields, separators=(",", ":"), ensure_ascii=False).encode()

    def said(self) -> str:
        """`by alice@ops at 2026-12-04T22:00:00.000Z: disk swap`, for a table or a message."""
        when = "" if self.at is None else f" at {timestamp(self.at)}"
        why = f": {self.reason}" if self.reason else ""
        return f"by {self.by}{when}{why}"


def decode_note(value: bytes | None) -> ControlNote:
    """The note a control key holds; anything else is a note by UNKNOWN (the key still counts)."""
    raw: Any = None
    if value is not None and len(value) <= NOTE_MAX_BYTES:
        try:
            raw = json.loads(value)
        except (ValueError, RecursionError):
            raw = None
    if not isinstance(raw, dict) or raw.get("format") != NOTE_FORMAT:
        return ControlNote(UNKNOWN, None)
    return ControlNote(
        by=_text(raw.get("by"), BY_LIMIT) or UNKNOWN,
        at=_moment(raw.get("at")),
        reason=_text(raw.get("reason"), REASON_LIMIT),
        id=_text(raw.get("id"), 64),
    )


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
