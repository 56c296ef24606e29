"""`lockctl check`'s rules: a job's health from its history, in the Nagios convention (pure;
table-tested in tests/unit/test_ledger_health.py).

The last K ticks whose claim window has closed (K = --max-intervals, default 2) are the job's
recent ticks; a tick still inside its window (or running) is not judged yet.

    CRITICAL  a recent tick was missed (recorded or not), or no run succeeded in the recent
              ticks (the last success is older than K intervals), or none ever did while the
              ledger already holds K closed ticks since its first record
    WARNING   the last finished run did not succeed: failed, lost, interrupted, timed-out
              (stopped at its timeout), abandoned (its runner died) or unreadable (a record
              that is not one); or the ledger holds
              suspect records, dated in the future (ledger/ticks.py); or a record read was
              too large to decode (over RECORD_MAX_BYTES: not lockctl's, never decoded)
    OK        otherwise, and for a job with no record at all: "no ticks recorded yet" (the
              ledger starts with a job's first run; before it nothing says the job exists)

Each state lists every reason that applies, worst first. Suspect records are named and make it
at least a WARNING, nothing more: the rules above judge the other records, as if the suspect
ones were not there (a record of 2099 saying `succeeded` would be the last success for ever).
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from provision.ledger.history import ABANDONED, Enough, JobHistory, TickRow
from provision.ledger.records import RecordProblem, TickRecord, tick_name
from provision.ledger.ticks import MISSED_GRACE
from provision.outcomes import OPERATOR_STOPS, POLICY_STOPS, Outcome
from provision.schedule import Schedule

DEFAULT_MAX_INTERVALS = 2
SUSPECT_NAMED = 3  # suspect ticks named in check's line; the rest are counted
_SETTLED = {
    Outcome.SUCCEEDED.value,
    Outcome.FAILED.value,
    Outcome.LOST.value,
    Outcome.INTERRUPTED.value,
    Outcome.TIMED_OUT.value,
    Outcome.UNREADABLE.value,
    ABANDONED,
}


class State(enum.IntEnum):
    """Nagios's plugin return codes, in order of severity."""

    OK = 0
    WARNING = 1
    CRITICAL = 2
    UNKNOWN = 3


@dataclass(frozen=True)
class JobHealth:
    job: str
    state: State
    reasons: tuple[str, ...]  # why it is not OK, worst first (empty when OK)
    last_success: datetime | None
    next_tick: datetime | None
    now: datetime
    note: str | None = None  # said instead of the last success (no records, no schedule)

    def line(self) -> str:
        """`OK nightly-ingest: last success 2026-12-01T02:00:00Z (4h ago), next ...`; text
        from records is already printable; a `|` would start Nagios's performance data."""
        facts = [*self.reasons]
        if self.note is not None:
            facts.append(self.note)
        elif self.last_success is not None:
            ago = _ago((self.now - self.last_success).total_seconds())
            facts.append(f"last success {tick_name(self.last_success)} ({ago} ago)")
        else:
            facts.append("no success recorded")
        if self.next_tick is not None:
            facts.append(f"next {tick_name(self.next_tick)}")
        text = f"{self.state.name} {self.job}: " + ", ".join(facts)
        return text.replace("|", "\\x7c")

    def to_record(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "state": self.state.name,
            "code": int(self.state),
            "reasons": list(self.reasons),
            "last_success": None if self.last_success is None else tick_name(self.last_success),
            "next_tick": None if self.next_tick is None else tick_name(self.next_tick),
        }


def closed_ticks(
    schedule: Schedule,
    now: datetime,
    start_deadline: float,
    count: int,
    paused: Collection[datetime] = (),
) -> list[datetime]:
    """The newest `count` ticks whose claim window (plus the grace a missed tick gets) closed
    before `now`, newest first; ticks recorded `paused` do not count (an operator held the job:
    no run was due, so none is missing)."""
    walk = schedule.ticks_at_or_before(now)  # one walk back: a cron step a tick
    tick = next(walk)
    following = schedule.next_ticks(tick, 1)[0]
    found: list[datetime] = []
    while len(found) < count:
        window = min(start_deadline, (following - tick).total_seconds()) + MISSED_GRACE
        if tick + timedelta(seconds=window) < now and tick not in paused:
            found.append(tick)
        following, tick = tick, next(walk)
    return found


def assess(
    history: JobHistory, start_deadline: float, max_intervals: int = DEFAULT_MAX_INTERVALS
) -> JobHealth:
    """The job's state by the rules above, as of `history.now`."""
    now, rows = history.now, history.runs
    suspect = _suspect_problem(history.suspect, history.suspect_count)
    too_large = _too_large_problem(history.problems)
    success = next((r.tick for r in rows if r.outcome == Outcome.SUCCEEDED.value), None)
    if not rows:  # no record, or suspect ones only: no run to judge
        if suspect is None:
            note = "no ticks recorded yet"
            return JobHealth(history.job, State.OK, (), None, history.next_tick, now, note)
        note = "no run recorded yet"
        return JobHealth(history.job, State.WARNING, (suspect,), None, history.next_tick, now, note)
    held = {row.tick for row in rows if row.outcome in _NOT_JUDGED}
    recent = closed_ticks(history.schedule, now, start_deadline, max_intervals, held)
    oldest_recent = recent[-1]
    critical = [_missed(row) for row in rows if row.missed and row.tick >= oldest_recent]
    critical += [_stuck(row) for row in rows if _buffered_past(row, now, start_deadline)]
    if success is not None and success < oldest_recent:
        critical.append(f"no success in the last {max_intervals} ticks")
    elif success is None and rows[-1].tick <= oldest_recent:
        critical.append(f"no success since the first record ({tick_name(rows[-1].tick)})")
    warnings = [w for w in (_last_finished_problem(rows), suspect, too_large) if w]
    reasons = tuple(critical + warnings)
    state = State.CRITICAL if critical else State.WARNING if warnings else State.OK
    return JobHealth(history.job, state, reasons, success, history.next_tick, now)


# Nagios's codes are not its severities: a CRITICAL that was judged outranks an UNKNOWN (a
# datacenter that could not be read must not hide a missed tick in another), and an UNKNOWN
# outranks a WARNING (what could not be read may be worse).
_SEVERITY = (State.OK, State.WARNING, State.UNKNOWN, State.CRITICAL)


def worst(states: list[State]) -> State:
    return max(states, key=_SEVERITY.index, default=State.OK)


def _missed(row: TickRow) -> str:
    return f"missed {tick_name(row.tick)}" + ("" if row.recorded else " (not recorded yet)")


def _buffered_past(row: TickRow, now: datetime, start_deadline: float) -> bool:
    """A tick still `buffered` (overlap = "buffer_one") past its start deadline and the grace
    a missed tick gets: whoever looked first would have run it or recorded it missed, so
    nobody is left to (every replica down since, or a release that reads it `unreadable`)."""
    late = row.tick + timedelta(seconds=start_deadline + MISSED_GRACE)
    return row.outcome == Outcome.BUFFERED.value and late < now


def _stuck(row: TickRow) -> str:
    return f"missed {tick_name(row.tick)} (buffered, never run)"


def _last_finished_problem(rows: tuple[TickRow, ...]) -> str | None:
    """Why the newest settled run is a warning, if it did not succeed."""
    last = next((row for row in rows if row.outcome in _SETTLED), None)
    if last is None or last.outcome == Outcome.SUCCEEDED.value:
        return None
    record = last.record
    detail = []
    if record is not None and record.exit_status is not None:
        detail.append(f"exit {record.exit_status}")
    if record is not None and record.worker is not None:
        detail.append(f"on {record.worker}")
    said = f" ({', '.join(detail)})" if detail else ""
    return f"last run {tick_name(last.tick)} {last.outcome}{said}"


def _suspect_problem(rows: tuple[TickRow, ...], count: int) -> str | None:
    """`1 suspect record, dated in the future (2099-01-01T00:00:00Z)`: tick names lockctl
    formats itself from the keys it parsed, the newest few, so the line stays short; `count`:
    all of them, read or not."""
    count = max(count, len(rows))
    if not count:
        return None
    named = ", ".join(tick_name(row.tick) for row in rows[:SUSPECT_NAMED])
    shown = min(len(rows), SUSPECT_NAMED)
    more = f" and {count - shown} more" if count > shown else ""
    records = "record" if count == 1 else "records"
    return f"{count} suspect {records}, dated in the future ({named}{more})"


def _too_large_problem(problems: tuple[RecordProblem, ...]) -> str | None:
    """`1 record too large to read (locks/x/ticks/2026-12-01T02:00:00Z: value: ...)`: the
    newest one's line (keys lockctl listed and parsed as tick names), the rest counted."""
    if not problems:
        return None
    newest = max(problems, key=lambda problem: problem.key)
    records = "record" if len(problems) == 1 else "records"
    return f"{len(problems)} {records} too large to read ({newest.line()})"


# a tick nobody was to run: a pause or a blackout window held it (not a miss)
_HELD = frozenset({Outcome.PAUSED, Outcome.BLACKOUT})
_HELD_WORDS = frozenset(outcome.value for outcome in _HELD)
# ...and a run an operator stopped (`lockctl abort`) or its overlap = "cancel" did: neither a
# success nor a failure, so the window of ticks judged reaches back past it, as past a paused
# tick; it never warns or pages
_NOT_JUDGED = _HELD_WORDS | frozenset(o.value for o in OPERATOR_STOPS | POLICY_STOPS)


def read_enough(schedule: Schedule, start_deadline: float, max_intervals: int) -> Enough:
    """When check has read enough of a ledger, newest first (pure): back to a success, and
    back to the oldest of the last `max_intervals` closed ticks (a missed record among them is
    CRITICAL), all that `assess` looks at; older records change nothing it says."""

    def enough(records: Sequence[TickRecord], now: datetime) -> bool:
        if not any(record.outcome is Outcome.SUCCEEDED for record in records):
            return False
        held = {r.tick for r in records if r.outcome in _HELD}
        oldest_recent = closed_ticks(schedule, now, start_deadline, max_intervals, held)[-1]
        return records[-1].tick <= oldest_recent

    return enough


def _ago(seconds: float) -> str:
    """`4h`, `2d4h`, `35m10s`, `12s`: the largest unit and, when not zero, the next one."""
    whole = max(0, int(seconds))
    sizes = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
    for index, (unit, size) in enumerate(sizes):
        if whole >= size or unit == "s":
            count, rest = divmod(whole, size)
            if unit == "s":
                return f"{count}s"
            smaller, next_size = sizes[index + 1]
            return f"{count}{unit}" + (f"{rest // next_size}{smaller}" if rest // next_size else "")
    return "0s"
