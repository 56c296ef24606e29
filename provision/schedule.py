"""A job's schedule as lockctl itself understands it: its ticks, and the systemd timer for them.

One syntax: a 5-field cron expression (or a macro: @yearly, @monthly, @weekly, @daily, @hourly),
evaluated in the job's IANA timezone by cronsim; or `@every <Go duration>`, a fixed interval
anchored to the Unix epoch, so every worker computes the same ticks without talking to another.

DST: cronsim walks local wall-clock times; lockctl attaches the zone to each one. A wall time
in a skipped hour does not fire that day (02:30 on Europe/Berlin's spring-forward day is no
tick), and a wall time in a repeated hour fires once, at its first occurrence (02:30 CEST, not
02:30 CET), for wildcard minutes and hours as well. That is what systemd's calendar does, so the
timer and lockctl's own ticks agree; cronsim alone (like Debian cron) would move a skipped fixed
time to the end of the gap and fire a wildcard in both copies. tests/unit/test_schedule.py checks
both against `systemd-analyze calendar`.
Pure: no I/O beyond zoneinfo's own reading of the timezone database.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from provision.durations import DurationSyntaxError, parse_duration

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
MIN_EVERY = 1
MAX_EVERY = 86400  # longer intervals cannot divide a day: systemd could not fire them
MAX_TIMER_LINES = 64
_DAY = 86400
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
# Plain cron only: numbers, names, *, ranges, lists, steps. No L, W, #, ? (systemd has no match).
_ATOM = r"(?:\*|[0-9]{1,2}|[A-Za-z]{3})"
_ITEM = re.compile(rf"{_ATOM}(?:-{_ATOM})?(?:/[0-9]{{1,2}})?")
_ZONE = re.compile(r"[A-Za-z][A-Za-z0-9_+\-]*(?:/[A-Za-z0-9_+\-]+)*")
_DOW_NAMES = ("Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat")


class ScheduleError(ValueError):
    """The schedule or its timezone cannot be used; the message says why, in one line."""


@dataclass(frozen=True)
class Schedule:
    """A parsed schedule: `cron` (5 fields, macros expanded) or `every` seconds, in `zone`."""

    text: str
    zone: str
    cron: str | None = None
    every: int | None = None

    @property
    def tz(self) -> ZoneInfo:
        return ZoneInfo(self.zone)

    def next_ticks(self, after: datetime, count: int) -> list[datetime]:
        """The `count` ticks strictly after `after` (an aware datetime), as UTC datetimes."""
        after = after.astimezone(timezone.utc)
        if self.every is not None:
            base = int((after - _EPOCH).total_seconds()) // self.every + 1
            return [_EPOCH + timedelta(seconds=(base + i) * self.every) for i in range(count)]
        return list(itertools.islice(self._cron_ticks(after, reverse=False), count))

    def latest_tick_at_or_before(self, now: datetime) -> datetime:
        """The last tick at or before `now`, in UTC (the tick a run at `now` belongs to)."""
        now = now.astimezone(timezone.utc)
        if self.every is not None:
            seconds = int((now - _EPOCH).total_seconds()) // self.every * self.every
            return _EPOCH + timedelta(seconds=seconds)
        return next(self._cron_ticks(now, reverse=True))

    def ticks_at_or_before(self, moment: datetime) -> Iterator[datetime]:
        """The ticks at or before `moment`, newest first, in UTC: one walk, each step one cron
        step (stepping with `latest_tick_at_or_before(tick - 1 s)` starts each step 3 h ahead,
        180 cron steps a tick for a per-minute job in a zone with DST)."""
        if self.every is None:
            return self._cron_ticks(moment.astimezone(timezone.utc), reverse=True)
        latest = self.latest_tick_at_or_before(moment)
        step = timedelta(seconds=self.every)
        return (latest - step * i for i in itertools.count())

    def _cron_ticks(self, start: datetime, reverse: bool) -> Iterator[datetime]:
        """Ticks after `start` (or at or before it, reversed): every local wall-clock time the
        expression matches, once, at its first occurrence; a time that does not exist is none."""
        assert self.cron is not None
        tz = self.tz
        # Walk naive wall times from a margin past `start` (a repeated hour is at most 1 h,
        # Lord Howe's 30 min included), keeping the instants on the right side of it.
        margin = timedelta(hours=-3 if not reverse else 3)
        wall = (start.astimezone(tz) + margin).replace(tzinfo=None, microsecond=0)
        for naive in CronSim(self.cron, wall, reverse=reverse):
            local = naive.replace(tzinfo=tz, fold=0)
            instant = local.astimezone(timezone.utc)
            if instant.astimezone(tz).replace(tzinfo=None) != naive:
                continue  # in a skipped hour: that wall time does not happen that day
            if (instant <= start) if reverse else (instant > start):
                yield instant

    def on_calendar(self) -> list[str]:
        """systemd OnCalendar= values whose union fires at exactly this schedule's ticks."""
        if self.every is not None:
            return _every_lines(self.every)
        assert self.cron is not None
        return _cron_lines(self.cron, self.zone)


@functools.lru_cache(maxsize=64)
def parse_schedule(text: str, zone: str | None = None) -> Schedule:
    """Parse a spec's `schedule` (and `timezone`, default UTC), or raise ScheduleError.

    Cached: the config loader, the skip path and the engine each ask for the same schedule, and
    checking that systemd can express `@every 1s` walks a whole day of ticks (~20 ms)."""
    zone_name = check_zone(zone or "UTC")
    stripped = " ".join(text.split())
    if stripped.startswith("@every"):
        every = _every_seconds(stripped[len("@every") :].strip())
        schedule = Schedule(text, zone_name, every=every)
    else:
        if stripped.startswith("@"):
            if stripped.lower() not in MACROS:
                known = ", ".join(MACROS)
                raise ScheduleError(f"{stripped!r}: unknown macro (known: {known}, @every)")
            stripped = MACROS[stripped.lower()]
        schedule = Schedule(text, zone_name, cron=_check_cron(stripped))
    schedule.on_calendar()  # refuse here what the timer could not express
    return schedule


def check_zone(zone: str) -> str:
    """`zone` when it names an IANA timezone this machine knows, else ScheduleError."""
    if len(zone) > 64 or not _ZONE.fullmatch(zone) or ".." in zone:
        raise ScheduleError(f"{zone[:64]!r}: not an IANA timezone name (like Europe/Berlin)")
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ScheduleError(f"{zone!r}: unknown timezone (like Europe/Berlin or UTC)") from None
    return zone


def _every_seconds(text: str) -> int:
    try:
        seconds = parse_duration(text).seconds if text else -1.0
    except DurationSyntaxError as exc:
        raise ScheduleError(f"@every: {exc}") from None
    if not (MIN_EVERY <= seconds <= MAX_EVERY) or seconds != int(seconds):
        raise ScheduleError(
            f"@every {text}: must be whole seconds, from {MIN_EVERY}s to {MAX_EVERY // 3600}h "
        )
    if _DAY % int(seconds):
        raise ScheduleError(
            f"@every {text}: must divide a day evenly (like 5m, 90s, 8h), so that systemd's "
            "calendar can fire on the same epoch-anchored ticks on every worker"
        )
    return int(seconds)


def _check_cron(expr: str) -> str:
    fields = expr.split()
    if len(fields) != 5:
        raise ScheduleError(
            f"{expr!r}: a cron expression has 5 fields (minute hour day month weekday), "
            f"not {len(fields)}; or use @hourly, @daily, ..., @every 5m"
        )
    for field in fields:
        if not all(_ITEM.fullmatch(item) for item in field.split(",")):
            raise ScheduleError(f"{expr!r}: {field!r} is not a plain cron field")
    try:
        CronSim(expr, datetime(2000, 1, 1, tzinfo=timezone.utc))
    except (CronSimError, ValueError, KeyError, IndexError) as exc:
        raise ScheduleError(f"{expr!r}: {exc}") from None
    return expr


# --- systemd -------------------------------------------------------------------------------


def _list(values: set[int], full: range, width: int = 2) -> str:
    if set(full) <= values:
        return "*"
    return ",".join(f"{v:0{width}d}" for v in sorted(values))


def _cron_lines(expr: str, zone: str) -> list[str]:
    sim = CronSim(expr, datetime(2000, 1, 1, tzinfo=timezone.utc))
    weekdays = {d % 7 for d in sim.weekdays if isinstance(d, int)}
    time = f"{_list(sim.hours, range(24))}:{_list(sim.minutes, range(60))}:00"
    months = _list(sim.months, range(1, 13))
    days = _list(sim.days, range(1, 32))
    dow = ",".join(_DOW_NAMES[d] for d in sorted(weekdays)) if len(weekdays) < 7 else ""
    by_dom = f"*-{months}-{days} {time} {zone}"
    by_dow = f"{dow} *-{months}-* {time} {zone}".strip()
    if sim.day_and:  # one of the two fields starts with '*': both must match
        return [f"{dow} {by_dom}".strip()]
    return [by_dom, by_dow]  # cron ORs a restricted day-of-month and day-of-week


def _every_lines(every: int) -> list[str]:
    """Epoch-anchored ticks that divide a day: the same seconds of every UTC day."""
    by_second: dict[int, dict[int, set[int]]] = {}
    for tick in range(0, _DAY, every):
        hour, minute, second = tick // 3600, tick // 60 % 60, tick % 60
        by_second.setdefault(second, {}).setdefault(minute, set()).add(hour)
    lines = []
    for second, minutes in sorted(by_second.items()):
        by_hours: dict[frozenset[int], set[int]] = {}
        for minute, hour_set in minutes.items():
            by_hours.setdefault(frozenset(hour_set), set()).add(minute)
        for hours, mins in sorted(by_hours.items(), key=lambda item: min(item[1])):
            hour_text, minute_text = _list(set(hours), range(24)), _list(mins, range(60))
            lines.append(f"*-*-* {hour_text}:{minute_text}:{second:02d} UTC")
    if len(lines) > MAX_TIMER_LINES:
        raise ScheduleError(
            f"@every {every}s: would need {len(lines)} OnCalendar= lines (at most "
            f"{MAX_TIMER_LINES}); choose an interval of whole minutes or one dividing 60s"
        )
    return lines
