"""`history --since`: the earliest tick to show, from a duration back from now or a date.
"Now" is Consul's clock (the Date of the ledger's read), as for every other judgement of the
ledger: a host whose clock is off shows the same ticks as any other."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from provision.durations import DurationSyntaxError, parse_duration

_DAYS = re.compile(r"(\d{1,5})d")


@dataclass(frozen=True)
class Earliest:
    """The earliest tick to show: a moment, or a duration back from a `now` not known yet."""

    moment: datetime | None = None
    back: timedelta | None = None

    def start(self, now: datetime) -> datetime:
        return now - self.back if self.back is not None else self.moment or now


def parse_since(text: str, now: datetime) -> datetime:
    """`read_since(text)`, from `now`."""
    return read_since(text).start(now)


def read_since(text: str) -> Earliest:
    """`24h`, `90m`, `7d` (back from now) or an ISO date or date/time (UTC unless it says
    otherwise): the earliest tick to show. ValueError, in one line, for anything else."""
    back = _duration_back(text)
    if back is not None:
        return Earliest(back=back)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        shown = repr(text) if len(text) <= 40 else repr(text[:40]) + "..."
        raise ValueError(
            f"{shown} is neither a duration back from now (24h, 90m, 7d) nor an ISO date or "
            "date/time (2026-12-01, 2026-12-01T02:00:00Z)"
        ) from None
    return Earliest(moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment)


def _duration_back(text: str) -> timedelta | None:
    days = _DAYS.fullmatch(text)
    if days:
        return timedelta(days=int(days.group(1)))
    if text[:1] in "+-":
        return None  # a sign means a date's offset here, not a duration
    try:
        return timedelta(seconds=parse_duration(text).seconds)
    except (DurationSyntaxError, OverflowError):
        return None
