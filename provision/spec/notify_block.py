"""A job's (or `defaults`') `notify "NAME" { url_file, on }` blocks and `ping_url_file`: who is
told of the job's outcomes (provision/system/notify_rules.py says what each means). The spec
holds the paths of the files the URLs are kept in on the workers, never a URL: the files are
read, and their modes checked, where the URLs are used (`lockctl schedule`'s start and reload).
"""

from __future__ import annotations

from dataclasses import replace

from provision.spec.hcl import Attribute, Block
from provision.spec.labelled import Kind, Named, named_blocks, read_attributes
from provision.spec.problems import Problems
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

NOTIFY = Kind(
    type="notify",
    duplicate="notify block",
    usage='needs one quoted name: notify "NAME" { ... }',
    keys=("url_file", "on", "repeat_after"),
    unknown=" (the URL itself never goes in the spec: put it in the file url_file names)",
)
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
    own = [
        target
        for named in named_blocks(block, where, NOTIFY, {}, problems)
        if (target := _target(named, problems)) is not None
    ]
    names = {target.name for target in own}
    kept = [target for target in inherited.targets if target.name not in names]
    targets = tuple(sorted([*kept, *own], key=lambda target: target.name))
    if len(targets) > MAX_TARGETS:
        problems.add(block.line, f"{where}.notify", f"more than {MAX_TARGETS} notify blocks")
    ping_file = inherited.ping_url_file
    if ping is not None:
        ping_file = read_checked_string(ping, f"{where}.{PING_KEY}", problems, url_file_problem)
    return replace(inherited, targets=targets, ping_url_file=ping_file)


def _target(named: Named, problems: Problems) -> NotifyTarget | None:
    name, here = named.name, named.here
    if name == PING:
        problems.add(named.block.line, here, PING_TAKEN)
        return None
    before = len(problems.found)
    attributes = read_attributes(named, NOTIFY, problems)
    url_file = None
    if "url_file" not in attributes:
        message = "is required: the absolute path of the file on each worker that holds the URL"
        problems.add(named.block.line, f"{here}.url_file", message)
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
