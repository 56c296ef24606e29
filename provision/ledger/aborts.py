"""`lockctl abort JOB`: the note an operator leaves in the job's `abort` control key, and which
run it stops (pure).

    lockctl/control/<job>/abort   {"format": 1, "by": ..., "at": ..., "reason": ..., "id": ...,
                                   "tick": ..., "session": ...}

The note names the run it was aimed at: the tick and the session the job's lock held when
`lockctl abort` read it. A replica stops its run only when that run is the one named (`stops`),
so a note heard late (a replica started after it, a watch answered again) never stops a later
run of the job, and the key may stay: a worker may only read it (the rendered policy).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from provision.keyed import key_problem
from provision.ledger.control import ControlNote, note_fields, note_of
from provision.ledger.holder import CLAIM_LIMIT
from provision.ledger.records import parse_tick_name, tick_name
from provision.system.text import printable

ABORT_MAX_BYTES = 4096


@dataclass(frozen=True)
class AbortNote:
    """Who asked for a run's end, when, why (`note`), and the run: its tick and session."""

    note: ControlNote
    tick: datetime
    session: str
    key: str | None = None  # a keyed job's key whose run it names (provision/keyed.py)

    def encode(self) -> bytes:
        fields = self.note.fields()
        fields.update(tick=tick_name(self.tick), session=self.session)
        if self.key is not None:
            fields.update(key=self.key)
        return json.dumps(fields, separators=(",", ":"), ensure_ascii=False).encode()

    def said(self) -> str:
        return f"{self.note.said()} (tick {tick_name(self.tick)})"


def decode_abort(value: bytes | None) -> AbortNote | None:
    """The abort note a key holds, or None when it is not one lockctl wrote (no id, no time,
    no tick or no session): such a note stops nothing."""
    raw = note_fields(value, ABORT_MAX_BYTES)
    if raw is None:
        return None
    note, tick_text, session = note_of(raw), raw.get("tick"), raw.get("session")
    tick = parse_tick_name(tick_text) if isinstance(tick_text, str) else None
    if note.id is None or note.at is None or tick is None or not isinstance(session, str):
        return None
    key = raw.get("key")
    if key is not None and key_problem(key) is not None:
        return None  # names no key lockctl would run: stops nothing
    return AbortNote(note, tick, printable(session, CLAIM_LIMIT), key)


def stops(abort: AbortNote, tick: datetime, session: str) -> bool:
    """Whether `abort` stops the run of `tick` held under `session` (pure): only the run it
    names. Ticks are unique in a job's ledger (a tick is claimed once), and the session tells
    apart a retried claim of the same tick after a lost lock (Consul gives a new holder a new
    session)."""
    return abort.tick == tick and abort.session == session
