"""A job's `http { url, method, timeout }` block: the call an HTTP job makes instead of a
command (provision/system/http_call.py says what is refused and why)."""

from __future__ import annotations

from dataclasses import dataclass

from provision.durations import DurationSyntaxError, parse_duration
from provision.spec.hcl import Block
from provision.spec.problems import Problems
from provision.system.http_call import (
    DEFAULT_METHOD,
    DEFAULT_TIMEOUT,
    HttpCall,
    Target,
    judge_target,
    method_problem,
    timeout_problem,
    url_problem,
)

HTTP_KEYS = ("url", "method", "timeout")
METADATA_REFUSED = (
    "names a link-local or cloud metadata target: the answer's first 2 KB would go into the "
    "tick record, which every reader of the job's prefix can read; call the app on 127.0.0.1 "
    "or localhost, or set allow_remote_target = true on the job if this target is meant"
)


@dataclass(frozen=True)
class HttpBlock:
    """A valid `http` block: the call, and the line of its url (lint's findings point there)."""

    call: HttpCall
    url_line: int


def read_http(
    blocks: list[Block],
    where: str,
    every: float | None,
    allow_remote: bool,
    problems: Problems,
) -> HttpBlock | None:
    """The job's one `http` block; None when there is none or after recording why it is
    unusable (`every`: the schedule's interval, which the timeout must stay below;
    `allow_remote`: the job's allow_remote_target, which lets it call a metadata target)."""
    if not blocks:
        return None
    for extra in blocks[1:]:
        problems.add(
            extra.line, f"{where}.http", f"set twice; the first is on line {blocks[0].line}"
        )
    block, where = blocks[0], f"{where}.http"
    before = len(problems.found)
    values: dict[str, tuple[str, int]] = {}
    for attribute in block.body.attributes:
        if attribute.name not in HTTP_KEYS:
            expected = ", ".join(HTTP_KEYS)
            problems.add(
                attribute.line, f"{where}.{attribute.name}", f"unknown; expected {expected}"
            )
        elif not isinstance(attribute.value, str):
            problems.add(attribute.line, f"{where}.{attribute.name}", "must be a string")
        else:
            values[attribute.name] = (attribute.value, attribute.line)
    for nested in block.body.blocks:
        problems.add(nested.line, f"{where}.{nested.type}", "unexpected block inside " + where)
    if "url" not in values and len(problems.found) == before:
        problems.add(block.line, f"{where}.url", "is required (like http://127.0.0.1:8080/jobs/x)")
    url, url_line = values.get("url", ("", block.line))
    method, method_line = values.get("method", (DEFAULT_METHOD, block.line))
    timeout_text, timeout_line = values.get("timeout", (f"{DEFAULT_TIMEOUT}", block.line))
    if "url" in values and (problem := url_problem(url)):
        problems.add(url_line, f"{where}.url", problem)
    elif "url" in values and judge_target(url) is Target.METADATA and not allow_remote:
        problems.add(url_line, f"{where}.url", METADATA_REFUSED)
    if problem := method_problem(method):
        problems.add(method_line, f"{where}.method", problem)
    timeout = _timeout(timeout_text, timeout_line, f"{where}.timeout", every, problems)
    if len(problems.found) > before or timeout is None:
        return None
    return HttpBlock(HttpCall(url, method, timeout), url_line)


def _timeout(
    text: str, line: int, where: str, every: float | None, problems: Problems
) -> float | None:
    try:
        seconds = parse_duration(text).seconds
    except DurationSyntaxError as exc:
        problems.add(line, where, str(exc))
        return None
    problem = timeout_problem(seconds, every)
    if problem:
        default = " (the default)" if text == DEFAULT_TIMEOUT else ""
        problems.add(line, where, f"{text}{default} {problem}")
        return None
    return seconds
