"""Catch-up (`catchup = "latest"`): after a time nobody ran a job (an outage, every replica
stopped, Consul unreachable), the newest tick nobody ran is run once, late, if it is still
within the job's start_deadline. Pure rules (table-tested in tests/unit/test_ledger_catchup.py).

A tick's normal claim window is its start deadline cut at the next tick (ticks.py): a run
within it is a late run of that tick, not a catch-up. A catch-up is for the newest tick whose
window closed unclaimed while now - tick is still within the start deadline, which the next
tick does not cut. So only a job whose start_deadline is above its interval can catch up.
Older ticks stay missed. Exactly once holds as for any tick: the catch-up's claim is the
claim transaction, over no record or over the tick's `missed` record at the index it was read
at (ledger/store.py), so a catch-up and the recording of the tick as missed cannot both win.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from datetime import datetime

from provision.ledger.records import TickRecord
from provision.outcomes import Outcome
from provision.schedule import Schedule
from provision.timings import CATCHUP_ALL, CatchupReach

LATEST = "latest"
ALL = CATCHUP_ALL
# ticks looked at, newest first: the current one (its window may still be open) and the one
# before it (its window closed at the current tick), whatever the schedule's spacing
_WALK = 3


def catchup_tick(
    schedule: Schedule, now: datetime, start_deadline: float, recorded: Collection[datetime]
) -> datetime | None:
    """The tick a catch-up at `now` would run: the newest whose claim window has closed, if
    `now` is still within its start deadline and the ledger (`recorded`: its ticks) has a
    record older than it, as the missed-tick rule asks (ticks.py: before the oldest record
    the job may not have existed); else None."""
    if not recorded:
        return None
    candidate = _newest_closed(schedule, now, start_deadline)
    return candidate if candidate is not None and min(recorded) < candidate else None


def _newest_closed(schedule: Schedule, now: datetime, start_deadline: float) -> datetime | None:
    walk = schedule.ticks_at_or_before(now)
    tick = next(walk)
    following = schedule.next_ticks(tick, 1)[0]
    for _ in range(_WALK):
        lag = (now - tick).total_seconds()
        if lag > start_deadline:
            return None  # this one and every older one are past their deadline
        window = min(start_deadline, (following - tick).total_seconds())
        if lag > window or following <= now:  # a later tick has come: this one is not current
            return tick
        following, tick = tick, next(walk)
    return None


def may_catch_up(record: TickRecord | None) -> bool:
    """Whether a tick with this record (None: no record) may be run as a catch-up: nobody ran
    it, whether or not someone has recorded it missed yet."""
    return record is None or record.outcome is Outcome.MISSED


def ticks_to_catch_up(
    schedule: Schedule,
    now: datetime,
    start_deadline: float,
    reach: CatchupReach,
    records: Mapping[datetime, TickRecord],
    held: Callable[[datetime], bool],
) -> list[datetime]:
    """The ticks `catchup = "all"` runs at `now`, oldest first: those whose claim window has
    closed, within `reach.window` of now, after the ledger's oldest record (`records`: the
    ledger, by tick), that nobody ran (no record, or `missed`) and no pause or blackout window
    held (`held`: it was not due); the newest of them, `reach.limit` at most, counting those
    in the window caught up already (so a look again, after another replica's catch-ups,
    does not reach further back: at most `limit` catch-ups in any window). Unlike "latest",
    the start deadline does not bound it: the window does."""
    if not records:
        return []
    oldest = min(records)
    found: list[datetime] = []
    counted = 0  # toward the limit: the ticks found, and those caught up already
    for tick in _closed_ticks(schedule, now, start_deadline):
        if counted >= reach.limit or (now - tick).total_seconds() > reach.window:
            break
        if tick <= oldest:
            break
        record = records.get(tick)
        if record is not None and record.catchup:
            counted += 1
        elif may_catch_up(record) and not held(tick):
            found.append(tick)
            counted += 1
    return found[::-1]


def _closed_ticks(schedule: Schedule, now: datetime, start_deadline: float) -> Iterator[datetime]:
    """The ticks whose claim window closed by `now`, newest first (the current tick's window
    may be open still: a late run of it is no catch-up)."""
    walk = schedule.ticks_at_or_before(now)
    tick = next(walk)
    following = schedule.next_ticks(tick, 1)[0]
    window = min(start_deadline, (following - tick).total_seconds())
    if (now - tick).total_seconds() > window or following <= now:
        yield tick
    yield from walk
