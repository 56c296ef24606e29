"""A job's (or `defaults`') `blackout "NAME" { schedule, duration, timezone }` blocks: the
windows its ticks are not run in (provision/blackouts.py says what each means). A job has the
windows of `defaults` and its own; two windows of one name in one job are refused.
"""

from __future__ import annotations

from provision.blackouts import Blackout, window_problem
from provision.durations import DurationSyntaxError, parse_duration
from provision.schedule import ScheduleError, check_zone, parse_schedule
from provision.spec.hcl import Attribute, Block
from provision.spec.names import NAME_RULE, is_valid_name
from provision.spec.problems import Problems, shown
from provision.spec.values import read_string

BLACKOUT_KEYS = ("schedule", "duration", "timezone")


def read_blackouts(
    block: Block, where: str, inherited: tuple[Blackout, ...], problems: Problems
) -> tuple[Blackout, ...]:
    """The windows of `inherited` (`defaults`') and the block's own, in that order; a name
    used twice (the job's own, or one of the job's and one of `defaults`') is reported."""
    lines = {window.name: window.line for window in inherited}
    found = list(inherited)
    for nested in (b for b in block.body.blocks if b.type == "blackout"):
        label = nested.labels[0].text if len(nested.labels) == 1 else None
        if label is not None and label in lines:
            message = f"duplicate blackout window; the first is on line {lines[label]}"
            problems.add(nested.line, f'{where}.blackout "{shown(label)}"', message)
            continue
        if label is not None:
            lines[label] = nested.line
        window = _window(nested, where, problems)
        if window is not None:
            found.append(window)
    return tuple(found)


def _window(block: Block, where: str, problems: Problems) -> Blackout | None:
    label = block.labels[0] if len(block.labels) == 1 else None
    if label is None or label.text is None or not label.quoted:
        message = 'needs one quoted name: blackout "NAME" { schedule = ..., duration = ... }'
        problems.add(block.line, f"{where}.blackout", message)
        return None
    here = f'{where}.blackout "{shown(label.text)}"'
    if not is_valid_name(label.text):
        problems.add(block.line, here, f"invalid name: {NAME_RULE}")
        return None
    before = len(problems.found)
    attributes = _attributes(block, here, problems)
    for required in ("schedule", "duration"):
        if required not in attributes:
            problems.add(block.line, f"{here}.{required}", "is required")
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
    return Blackout(label.text, schedule, duration, block.line)


def _attributes(block: Block, here: str, problems: Problems) -> dict[str, Attribute]:
    found: dict[str, Attribute] = {}
    for attribute in block.body.attributes:
        if attribute.name not in BLACKOUT_KEYS:
            expected = ", ".join(BLACKOUT_KEYS)
            message = f"unknown attribute; expected one of: {expected}"
            problems.add(attribute.line, f"{here}.{attribute.name}", message)
        elif attribute.name in found:
            first = found[attribute.name].line
            message = f"set twice; the first is on line {first}"
            problems.add(attribute.line, f"{here}.{attribute.name}", message)
        else:
            found[attribute.name] = attribute
    for nested in block.body.blocks:
        message = "unexpected block inside a blackout block"
        problems.add(nested.line, f"{here}.{nested.type}", message)
    return found


def _text(attribute: Attribute | None, where: str, problems: Problems) -> str | None:
    if attribute is None:
        return None
    text = read_string(attribute, where, problems)
    if text is not None and not text.strip():
        problems.add(attribute.line, where, "must not be empty")
        return None
    return text


def _zone(attribute: Attribute | None, where: str, problems: Problems) -> str | None:
    """The window's IANA timezone (None: UTC)."""
    text = _text(attribute, where, problems)
    if attribute is None or text is None:
        return None
    try:
        return check_zone(text)
    except ScheduleError as exc:
        problems.add(attribute.line, where, str(exc))
        return None


def _duration(attribute: Attribute | None, where: str, problems: Problems) -> float | None:
    """The window's length in seconds: above zero, at most a year."""
    text = _text(attribute, where, problems)
    if attribute is None or text is None:
        return None
    try:
        seconds = parse_duration(text).seconds
    except DurationSyntaxError as exc:
        problems.add(attribute.line, where, str(exc))
        return None
    problem = window_problem(seconds)
    if problem:
        problems.add(attribute.line, where, problem)
        return None
    return seconds
