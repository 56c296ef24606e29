"""Go duration strings ("15s", "1m30s", "500ms"), the syntax Consul and its users already know."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
# Go's own limit (an int64 of nanoseconds, about 292 years): a longer text is refused as Go
# refuses it, not turned into inf, which every later comparison and sleep would trip over.
MAX_SECONDS = (2**63 - 1) / 1e9
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


@dataclass(frozen=True)
class Duration:
    """A duration in seconds plus the text it came from (kept for messages and configs)."""

    seconds: float
    text: str


class DurationSyntaxError(ValueError):
    """The text is not a Go duration."""


def parse_duration(text: str) -> Duration:
    """Parse Go's `time.ParseDuration` syntax: an optional sign, then number+unit pairs."""
    body = text[1:] if text[:1] in "+-" else text
    sign = -1.0 if text.startswith("-") else 1.0
    if body == "0":
        return Duration(0.0, text)
    if not body:
        raise DurationSyntaxError(f'{_clip(text)} is not a duration (like "15s", "1m30s", "500ms")')
    seconds, position = 0.0, 0
    while position < len(body):
        match = _PART.match(body, position)
        if match is None:
            raise DurationSyntaxError(
                f'{_clip(text)} is not a duration (like "15s", "1m30s", "500ms"; units: '
                "ns, us, ms, s, m, h)"
            )
        seconds += float(match.group(1)) * _UNITS[match.group(2)]
        position = match.end()
    if not (math.isfinite(seconds) and seconds <= MAX_SECONDS):
        raise DurationSyntaxError(f"{_clip(text)} is out of range (a duration is at most 2562047h)")
    return Duration(sign * seconds, text)


def _clip(text: str) -> str:
    """`text` quoted for a message, cut short: a hostile value may be a megabyte of digits."""
    return repr(text) if len(text) <= 40 else repr(text[:40]) + "..."


def format_duration(seconds: float) -> str:
    """The shortest Go duration for `seconds`, e.g. 90 -> "1m30s", 0.5 -> "500ms"."""
    if not math.isfinite(seconds):  # no duration parses to these; shown, never raised on
        return str(seconds)
    millis = round(seconds * 1000)
    if millis == 0:
        return "0s"
    sign, millis = ("-", -millis) if millis < 0 else ("", millis)
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs, millis = divmod(rest, 1000)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else ""]
    if secs and millis:
        parts.append(f"{secs}.{millis:03d}".rstrip("0") + "s")
    elif secs:
        parts.append(f"{secs}s")
    elif millis:
        parts.append(f"{millis}ms")
    return sign + "".join(parts)
