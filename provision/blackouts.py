"""Blackout windows: spans of time a job's ticks are not run (a freeze, a maintenance night).

    blackout "freeze" { schedule = "0 22 * * 5", duration = "60h", timezone = "Europe/Berlin" }

A window opens at each tick of its `schedule` (a job's schedule syntax, read in its own
`timezone`: schedule.py, DST rules included) and lasts `duration` of real time: [opens,
opens + duration). A tick inside one is not run: it is recorded `blackout`, naming the window,
never `missed`, and never caught up. Pure: `holding_window` is the one decision.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from provision.schedule import Schedule

LONGEST_WINDOW = 366 * 86400.0  # seconds: a window over a year is a typo, not a freeze


@dataclass(frozen=True)
class Blackout:
    """One window: its name (the record's `window`), when it opens, and how long it lasts."""

    name: str
    schedule: Schedule
    duration: float  # seconds, 0 < duration <= LONGEST_WINDOW (spec/blackout_block.py)
    line: int = 0  # where the spec declares it (its defaults' or its job's block)

    def opening(self, tick: datetime) -> datetime | None:
        """The opening of this window that holds `tick`, or None. The latest opening at or
        before the tick is the one to look at: an earlier one ends earlier still."""
        opened = _latest_opening(self.schedule, tick)
        return opened if tick < opened + timedelta(seconds=self.duration) else None


@functools.lru_cache(maxsize=4096)
def _latest_opening(schedule: Schedule, tick: datetime) -> datetime:
    """Cached: every replica in a process (a simulation), the turn, the fate look and the
    catch-up ask of the same tick, and a cron walk back costs about half a millisecond."""
    return schedule.latest_tick_at_or_before(tick)


def window_problem(seconds: float) -> str | None:
    """What is wrong with a window of `seconds` (None: nothing): above zero, at most a year."""
    if seconds <= 0:
        return "must be above zero"
    if seconds > LONGEST_WINDOW:
        return "must be at most a year (8784h)"
    return None


def holding_window(windows: Iterable[Blackout], tick: datetime) -> Blackout | None:
    """The window that holds `tick` (pure): the first of `windows` (spec order: the defaults',
    then the job's own) one of whose openings is at or before the tick and ends after it."""
    return next((window for window in windows if window.opening(tick) is not None), None)
