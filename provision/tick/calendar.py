"""A schedule's ticks, computed in runs and kept: the same ticks as `Schedule`, at a fraction of
the cost where it matters. A cron schedule's every question starts a walk three hours away from
its answer (schedule.py: DST margins), 2-3 ms for `* * * * *`, and a core asks a few per tick
and replica; a `Calendar` answers from the ticks it already walked, shared by every core of
the process (a simulation's replicas ask the same questions)."""

from __future__ import annotations

import bisect
import itertools
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from provision.schedule import Schedule

SPAN = 256  # ticks walked at once: one margin's walk for that many answers
KEPT = 4 * SPAN  # the newest ticks a calendar keeps: it follows time, which only goes on
_STRETCHES = 8  # contiguous extensions before a far question starts a fresh run instead
_INSTANT = timedelta(microseconds=1)


# kept runs of ticks by schedule, every tick between a run's first and last in it; one lock for
# all: a core on a SystemClock asks from several threads
_RUNS: dict[Schedule, list[datetime]] = {}
_GUARD = threading.Lock()


@dataclass(frozen=True)
class Calendar(Schedule):
    """A Schedule whose cron ticks come from walks of SPAN ticks, kept (an `@every` one is
    arithmetic already: it asks the Schedule)."""

    @classmethod
    def of(cls, schedule: Schedule) -> Calendar:
        return cls(schedule.text, schedule.zone, schedule.cron, schedule.every)

    def next_ticks(self, after: datetime, count: int) -> list[datetime]:
        if self.every is not None:
            return super().next_ticks(after, count)
        with _GUARD:
            ticks = self._stretched(after.astimezone(timezone.utc), count)
            start = bisect.bisect_right(ticks, after)
            return ticks[start : start + count]

    def latest_tick_at_or_before(self, now: datetime) -> datetime:
        if self.every is not None:
            return super().latest_tick_at_or_before(now)
        with _GUARD:
            ticks = self._stretched(now.astimezone(timezone.utc), 1)
            return ticks[bisect.bisect_right(ticks, now) - 1]

    def ticks_at_or_before(self, moment: datetime) -> Iterator[datetime]:
        if self.every is not None:
            return super().ticks_at_or_before(moment)
        return self._backwards(moment.astimezone(timezone.utc))

    def _backwards(self, moment: datetime) -> Iterator[datetime]:
        while True:
            with _GUARD:
                ticks = self._stretched(moment, 0)
                earlier = ticks[: bisect.bisect_right(ticks, moment)]
            yield from reversed(earlier)
            moment = earlier[0] - _INSTANT  # the run's first tick was the last: walk on back

    def _stretched(self, moment: datetime, ahead: int) -> list[datetime]:
        """The kept run of ticks (the caller holds _GUARD), stretched so that the latest tick at
        or before `moment` and the `ahead` ticks after it are in it (one far off starts anew)."""
        need = max(ahead, 1)  # one tick after `moment` at least: none is missing before it
        ticks = _RUNS.setdefault(self, [])
        for _ in range(_STRETCHES):
            if not ticks:
                ticks.append(super().latest_tick_at_or_before(moment))
            elif moment < ticks[0]:
                older = super().ticks_at_or_before(ticks[0] - _INSTANT)
                ticks[:0] = reversed(list(itertools.islice(older, SPAN)))
            elif _ahead(ticks, moment) < need:
                ticks.extend(super().next_ticks(ticks[-1], SPAN))
            else:
                break
        else:
            ticks[:] = [super().latest_tick_at_or_before(moment)]
            ticks.extend(super().next_ticks(ticks[0], max(need, SPAN)))
        cut = min(len(ticks) - KEPT, bisect.bisect_right(ticks, moment) - 1)
        if cut > 0:
            del ticks[:cut]
        return ticks


def _ahead(ticks: list[datetime], moment: datetime) -> int:
    """How many kept ticks come after `moment`."""
    return len(ticks) - bisect.bisect_right(ticks, moment)
