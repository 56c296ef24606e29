"""One JSON line per lock event on stderr: what happened, to which lock, and how long it took.

Fields: time (UTC, ISO 8601), event, job, worker, and whatever the event adds (session,
lock_index, durations in ms). A token never appears: nothing secret is ever passed in.

Writing an event never fails the caller: the renewer and the watcher emit events, and a closed
pipe or a full disk behind stderr must not stop renewals, fence a healthy job or change the exit
status. The first failed write is remembered (`broken`); later events are dropped.
"""

from __future__ import annotations

import json
import sys
import threading
from datetime import datetime, timezone
from typing import Any, TextIO

EVENTS = (
    "acquired",
    "renewed",
    "renew-failed",
    "lost",
    "fenced",
    "released",
    "skipped",
    "waiting",
    "timed-out",  # the job ran past its timeout
    "aborted",  # `lockctl abort` stopped the run
    "abort-ignored",  # an abort note naming this tick under another session
    "gave-up",  # --wait ran out of waiting for the lock
    "interrupted",
    "missed",
    "clock-skew",
    "clock-step",
    "housekeeping",
    "housekeeping-failed",
)
# json.dumps with any option builds a new encoder per call: one, made once, writes the same
# text (a scheduler emits several events per run of each of its jobs)
_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str)


class EventLog:
    """Writes events for one job on one worker; safe to call from several threads."""

    def __init__(
        self, job: str, worker: str, stream: TextIO | None = None, key: str | None = None
    ) -> None:
        self.job = job
        self.worker = worker
        self.key = key  # a keyed run's: in every event, after the job
        self._stream = stream
        self._lock = threading.Lock()
        self.broken: str | None = None  # why the stream failed, once it has
        self.dropped = 0  # events not written since

    def emit(self, event: str, **fields: Any) -> None:
        record = {
            "time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            "event": event,
            "job": self.job,
            **({} if self.key is None else {"key": self.key}),
            "worker": self.worker,
            **{key: value for key, value in fields.items() if value is not None},
        }
        line = _ENCODER.encode(record)
        with self._lock:
            if self.broken is not None:
                self.dropped += 1
                return
            stream = self._stream or sys.stderr
            try:
                stream.write(line + "\n")
                stream.flush()
            except (OSError, ValueError) as exc:  # EPIPE, ENOSPC, EIO; ValueError: closed file
                self.broken = f"{type(exc).__name__}: {exc}"
                self.dropped += 1


def ms(seconds: float) -> float:
    """Seconds as milliseconds, rounded for humans."""
    return round(seconds * 1000, 1)
