"""What a reader (`lockctl check`) does with the ticks nobody ran that it noticed: it records
them, `missed`, or `paused` where a pause held them, once, whoever notices first."""

from __future__ import annotations

import socket
from dataclasses import dataclass

from provision.blackouts import holding_window
from provision.consul import Consul, PermissionDenied
from provision.ledger.control import unrun_record
from provision.ledger.history import NOTICER, JobHistory
from provision.ledger.records import FIELD_LIMIT
from provision.ledger.store import Ledger
from provision.outcomes import Outcome
from provision.system.text import printable


@dataclass(frozen=True)
class MissedRecording:
    written: int
    denied: bool  # the token may read but not write: reported, not recorded
    paused: bool = False  # a pause or a window held some: those are recorded so, not missed

    def said(self) -> str:
        kind = "missed or paused" if self.paused else "missed"
        return f"{self.written} {kind} tick(s) recorded now"


def record_missed(consul: Consul, history: JobHistory) -> MissedRecording:
    """Record the ticks nobody ran that `history` found, `missed` or `paused` (who paused the
    job, when and why), at cas index 0: never twice, and never over a claim that landed
    meanwhile. A read-only token is no error: nothing is written, and the caller says so."""
    ticks = history.unrecorded_missed
    if not ticks:
        return MissedRecording(0, False)
    host = printable(socket.gethostname(), FIELD_LIMIT)
    records = [
        unrun_record(tick, NOTICER, history.now, history.pauses.holding(tick), window, host=host)
        for tick, window in ((t, holding_window(history.blackouts, t)) for t in ticks)
    ]
    paused = any(r.outcome in (Outcome.PAUSED, Outcome.BLACKOUT) for r in records)
    try:
        written = Ledger(consul, history.lock_key).record_missed(records)
    except PermissionDenied:
        return MissedRecording(0, True)
    return MissedRecording(written, False, paused)
