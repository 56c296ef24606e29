"""A job's (or `defaults`') `notify "NAME" { url_file, on }` blocks and `ping_url_file`: who is
told of the job's outcomes (provision/system/notify_rules.py says what each means). The spec
holds the paths of the files the URLs are kept in on the workers, never a URL: the files are
read, and their modes checked, where the URLs are used (`lockctl schedule`'s start and reload).
"""

from __future__ import annotations

from dataclasses import replace

from provision.spec.hcl import Attribute, Block
from provision.spec.names import NAME_RULE, is_valid_name
from provision.spec.problems import Problems, shown
from provision.spec.values import read_checked_string
from provision.system.notify_rules import (
    MAX_TARGETS,
    PING,
    PING_TAKEN,
    Notifications,
    NotifyTarget,
    on_problem,
    ordered_on,
    repeat_problem,
    url_file_problem,
)

NOTIFY_KEYS = ("url_file", "on", "repeat_after")
PING_KEY = "ping_url_file"


def read_notifications(
    block: Block,
    where: str,
    ping: Attribute | None,
    inherited: Notifications,
    problems: Problems,
) -> Notifications:
    """The block's notify blocks and ping file over those it inherits (`defaults`'): a notify
    block of the same NAME replaces the inherited one, the others add to them; its own
    ping_url_file replaces the inherited one."""
    own = _targets([b for b in block.body.blocks if b.type == "notify"], where, problems)
    names = {target.name for target in own}
    kept = [target for target in inherited.targets if target.name not in names]
    targets = tuple(sorted([*kept, *own], key=lambda target: target.name))
    if len(targets) > MAX_TARGETS:
        problems.add(block.line, f"{where}.notify", f"more than {MAX_TARGETS} notify blocks")
    ping_file = inherited.ping_url_file
    if ping is not None:
        ping_file = read_checked_string(ping, f"{where}.{PING_KEY}", problems, url_file_problem)
    return replace(inherited, targets=targets, ping_url_file=ping_file)


def _targets(blocks: list[Block], where: str, problems: Problems) -> list[NotifyTarget]:
    found: list[NotifyTarget] = []
    lines: dict[str, int] = {}  # each name's first block, valid or not
    for block in blocks:
        label = block.labels[0].text if len(block.labels) == 1 else None
        if label is not None and label in lines:
            message = f"duplicate notify block; the first is on line {lines[label]}"
            problems.add(block.line, f'{where}.notify "{shown(label)}"', message)
            continue
        if label is not None:
            lines[label] = block.line
        target = _target(block, where, problems)
        if target is not None:
            found.append(target)
    return found


def _target(block: Block, where: str, problems: Problems) -> NotifyTarget | None:
    label = block.labels[0] if len(block.labels) == 1 else None
    if label is None or label.text is None or not label.quoted:
        problems.add(block.line, f"{where}.notify", 'needs one quoted name: notify "NAME" { ... }')
        return None
    name, here = label.text, f'{where}.notify "{shown(label.text)}"'
    if not is_valid_name(name):
        problems.add(block.line, here, f"invalid name: {NAME_RULE}")
        return None
    if name == PING:
        problems.add(block.line, here, PING_TAKEN)
        return None
    before = len(problems.found)
    attributes = _attributes(block, here, problems)
    url_file = None
    if "url_file" not in attributes:
        message = "is required: the absolute path of the file on each worker that holds the URL"
        problems.add(block.line, f"{here}.url_file", message)
    else:
        found = attributes["url_file"]
        url_file = read_checked_string(found, f"{here}.url_file", problems, url_file_problem)
    on = _on(attributes.get("on"), f"{here}.on", problems)
    repeat = attributes.get("repeat_after")
    repeat_after = None
    if repeat is not None:
        where = f"{here}.repeat_after"
        repeat_after = read_checked_string(repeat, where, problems, repeat_problem)
    if url_file is None or on is None or len(problems.found) > before:
        return None
    return NotifyTarget(name, url_file, on, repeat_after)


def _attributes(block: Block, here: str, problems: Problems) -> dict[str, Attribute]:
    found: dict[str, Attribute] = {}
    for attribute in block.body.attributes:
        if attribute.name not in NOTIFY_KEYS:
            expected = ", ".join(NOTIFY_KEYS)
            problems.add(
                attribute.line,
                f"{here}.{attribute.name}",
                f"unknown attribute; expected one of: {expected} (the URL itself never goes "
                "in the spec: put it in the file url_file names)",
            )
        elif attribute.name in found:
            first = found[attribute.name].line
            problems.add(
                attribute.line,
                f"{here}.{attribute.name}",
                f"set twice; the first is on line {first}",
            )
        else:
            found[attribute.name] = attribute
    for nested in block.body.blocks:
        problems.add(nested.line, f"{here}.{nested.type}", "unexpected block inside a notify block")
    return found


def _on(attribute: Attribute | None, where: str, problems: Problems) -> tuple[str, ...] | None:
    """The outcomes the block is told of (every one when it says none)."""
    if attribute is None:
        return ordered_on(["failed", "missed", "lost", "recovered"])
    problem = on_problem(attribute.value)
    if problem:
        problems.add(attribute.line, where, problem)
        return None
    assert isinstance(attribute.value, tuple)
    return ordered_on([str(value) for value in attribute.value])
