"""`history --timeline`: a job's recent ticks as one strip of characters per worker (pure).

    nightly-ingest: */1 * * * * (UTC), 12 ticks 2026-12-01T02:00:00Z .. 2026-12-01T02:11:00Z
      worker-1  ##..F# .##.
      worker-2  ..##..#....

One column per tick, oldest on the left. A worker's strip shows the ticks it ran by how they
ended, and a dot where another worker ran it; a tick nobody ran (missed) is blank in every
strip: a gap. Only who ran ticks has a strip (a record's worker is its writer's word; `lockctl
check`, which records missed ticks, runs nothing and has none).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from provision.ledger.history import ABANDONED, JobHistory, TickRow
from provision.outcomes import Outcome
from provision.system.text import printable

# Outcome -> its character in the strip of the worker that ran the tick.
RAN = {
    Outcome.SUCCEEDED.value: "#",
    Outcome.FAILED.value: "F",
    Outcome.TIMED_OUT.value: "T",
    Outcome.LOST.value: "L",
    Outcome.INTERRUPTED.value: "I",
    Outcome.ABORTED.value: "X",
    Outcome.CANCELLED.value: "C",
    Outcome.RUNNING.value: ">",
    ABANDONED: "A",
}
OTHERS = "."  # another worker ran it: this one skipped it
MISSED = " "  # nobody ran it
PAUSED = "-"  # an operator paused the job (lockctl pause): nobody was to run it
BUFFERED = "+"  # it came while the run before it ran (overlap = buffer_one): runs when it ends
UNKNOWN = "?"  # a record that is not one (unreadable), or one dated in the future (suspect)
LEGEND = (
    ("#", "succeeded"),
    ("F", "failed"),
    ("T", "timed-out"),
    ("L", "lost (fenced)"),
    ("I", "interrupted"),
    ("X", "aborted (lockctl abort)"),
    ("C", "cancelled (the next tick came: overlap = cancel)"),
    (">", "running"),
    ("A", "abandoned"),
    (".", "skipped: another worker ran it"),
    ("' '", "missed: nobody ran it"),
    ("-", "paused"),
    ("+", "buffered: runs when the run before it ends"),
    ("?", "unreadable or suspect"),
)
NAME_WIDTH = 24  # characters of a worker's name shown
MIN_TICKS = 8


@dataclass(frozen=True)
class Strip:
    worker: str  # printable, at most NAME_WIDTH characters
    ticks: str  # one character per tick, oldest first


@dataclass(frozen=True)
class Timeline:
    job: str
    first: datetime | None  # the oldest tick shown
    last: datetime | None
    count: int
    strips: tuple[Strip, ...]


def timeline(history: JobHistory, width: int) -> Timeline:
    """The newest ticks that fit in `width` columns (the name column included), one strip per
    worker that ran any of them, sorted by name; with no runner, one strip of the gaps."""
    name_width = min(NAME_WIDTH, max((len(_name(r)) for r in _runs(history.rows)), default=8))
    columns = max(MIN_TICKS, width - name_width - 4)
    rows = sorted(history.rows[:columns], key=lambda row: row.tick)
    workers = sorted({_name(row) for row in _runs(rows)})
    strips = tuple(Strip(w, "".join(_cell(row, w) for row in rows)) for w in workers)
    if not strips:
        strips = (Strip("(nobody ran)", "".join(_cell(row, None) for row in rows)),)
    first = rows[0].tick if rows else None
    last = rows[-1].tick if rows else None
    return Timeline(history.job, first, last, len(rows), strips)


def _runs(rows: tuple[TickRow, ...] | list[TickRow]) -> list[TickRow]:
    return [row for row in rows if row.outcome in RAN and row.record is not None]


def _name(row: TickRow) -> str:
    worker = row.record.worker if row.record is not None else None
    return printable(worker or "(unnamed)", NAME_WIDTH)


def _cell(row: TickRow, worker: str | None) -> str:
    if row.outcome == Outcome.MISSED.value:
        return MISSED
    if row.outcome == Outcome.PAUSED.value:
        return PAUSED
    if row.outcome == Outcome.BUFFERED.value:
        return BUFFERED
    if row.outcome not in RAN:
        return UNKNOWN
    return RAN[row.outcome] if _name(row) == worker else OTHERS
