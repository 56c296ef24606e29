"""A job's (or `defaults`') `blackout "NAME" { schedule, duration, timezone }` blocks: the
windows its ticks are not run in (provision/blackouts.py says what each means). A job has the
windows of `defaults` and its own; two windows of one name in one job are refused.
"""

from __future__ import annotations

from provision.blackouts import Blackout, window_problem
from provision.schedule import ScheduleError, parse_schedule
from provision.spec.hcl import Attribute, Block
from provision.spec.labelled import Kind, Named, named_blocks, read_attributes
from provision.spec.problems import Problems
from provision.spec.values import read_seconds, read_string, read_timezone

BLACKOUT = Kind(
    type="blackout",
    duplicate="blackout window",
    usage='needs one quoted name: blackout "NAME" { schedule = ..., duration = ... }',
    keys=("schedule", "duration", "timezone"),
)


def read_blackouts(
    block: Block, where: str, inherited: tuple[Blackout, ...], problems: Problems
) -> tuple[Blackout, ...]:
    """The windows of `inherited` (`defaults`') and the block's own, in that order; a name
    used twice (the job's own, or one of the job's and one of `defaults`') is reported."""
    first = {window.name: window.line for window in inherited}
    found = list(inherited)
    for named in named_blocks(block, where, BLACKOUT, first, problems):
        window = _window(named, problems)
        if window is not None:
            found.append(window)
    return tuple(found)


def _window(named: Named, problems: Problems) -> Blackout | None:
    here, before = named.here, len(problems.found)
    attributes = read_attributes(named, BLACKOUT, problems)
    for required in ("schedule", "duration"):
        if required not in attributes:
            problems.add(named.block.line, f"{here}.{required}", "is required")
    zone = _zone(attributes.get("timezone"), f"{here}.timezone", problems)
    schedule_text = _text(attributes.get("schedule"), f"{here}.schedule", problems)
    duration = _duration(attributes.get("duration"), f"{here}.duration", problems)
    schedule = None
    if schedule_text is not None:  # checked even beside other problems (in UTC if need be)
        try:
            schedule = parse_schedule(schedule_text, zone)
        except ScheduleError as exc:
            problems.add(attributes["schedule"].line, f"{here}.schedule", str(exc))
    if schedule is None or duration is None or len(problems.found) > before:
        return None
    return Blackout(named.name, schedule, duration, named.block.line)


def _text(attribute: Attribute | None, where: str, problems: Problems) -> str | None:
    if attribute is None:
        return None
    text = read_string(attribute, where, problems)
    if text is not None and not text.strip():
        problems.add(attribute.line, where, "must not be empty")
        return None
    return text


def _zone(attribute: Attribute | None, where: str, problems: Problems) -> str | None:
    """The window's IANA timezone (None: UTC), as a job's, but never empty."""
    if attribute is None or _text(attribute, where, problems) is None:
        return None
    return read_timezone(attribute, where, problems)


def _duration(attribute: Attribute | None, where: str, problems: Problems) -> float | None:
    """The window's length in seconds: above zero, at most a year."""
    text = _text(attribute, where, problems)
    if attribute is None or text is None:
        return None
    seconds = read_seconds(attribute, text, where, problems)
    if seconds is None:
        return None
    problem = window_problem(seconds)
    if problem:
        problems.add(attribute.line, where, problem)
        return None
    return seconds
