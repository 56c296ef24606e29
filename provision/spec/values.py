"""Single spec values checked one at a time: strings, counts, addresses, lock prefixes, worker
lists, schedules and commands. Each `read_*` returns the value, or None after recording why not."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from provision.durations import DurationSyntaxError, parse_duration
from provision.keyed import keys_problem
from provision.schedule import ScheduleError, check_zone, parse_schedule
from provision.spec.hcl import Attribute, Unsupported, Value
from provision.spec.models import DEFAULT_ADDRESS
from provision.spec.problems import Problems, shown
from provision.timings import (
    CATCHUP_ALL,
    CatchupReach,
    capacity_problem,
    catchup_limit_problem,
    catchup_problem,
    catchup_window_problem,
    count_problem,
    overlap_problem,
)

PREFIX_PATTERN = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*/$")
MAX_PREFIX = 256
MAX_SCHEDULE = 256
MAX_COMMAND_ARGS = 256
MAX_ARGUMENT = 4096
CHOICE_KEYS = ("catchup", "overlap")  # keys whose value is one word of a few (provision.timings)
CATCHUP_REACH_KEYS = ("catchup_limit", "catchup_window")  # how far catchup = "all" goes


# --- strings --------------------------------------------------------------------------------


def read_string(attribute: Attribute, where: str, problems: Problems) -> str | None:
    value = attribute.value
    if isinstance(value, str):
        return value
    problems.add(attribute.line, where, f"must be a quoted string, not {_kind(value)}")
    return None


def read_checked_string(
    attribute: Attribute, where: str, problems: Problems, problem_of: Callable[[str], str | None]
) -> str | None:
    """The attribute's string if `problem_of` finds nothing wrong with it; else None, and the
    problem (not a string, or what `problem_of` says) is recorded."""
    text = read_string(attribute, where, problems)
    message = None if text is None else problem_of(text)
    if message:
        problems.add(attribute.line, where, message)
        return None
    return text


def read_bool(attribute: Attribute | None, where: str, problems: Problems) -> bool:
    """The attribute's true or false (False when absent); anything else is a problem."""
    if attribute is None:
        return False
    if isinstance(attribute.value, bool):
        return attribute.value
    problems.add(attribute.line, where, f"must be true or false, not {_kind(attribute.value)}")
    return False


def read_count(attribute: Attribute, field: str, where: str, problems: Problems) -> int | None:
    """A whole number within the field's bounds (`provision.timings.COUNT_BOUNDS`), or None."""
    return _whole(attribute, count_problem(field, attribute.value), where, problems)


def read_capacity(attribute: Attribute | None, where: str, problems: Problems) -> int | None:
    """A worker's max_concurrent_runs: a whole number, 1 or more (None when absent: no cap)."""
    if attribute is None:
        return None
    return _whole(attribute, capacity_problem(attribute.value), where, problems)


def _whole(attribute: Attribute, problem: str | None, where: str, problems: Problems) -> int | None:
    """The attribute's whole number when `problem` (its bounds' check) is None; else None, and
    the problem recorded with what the value is when it is no whole number."""
    value = attribute.value
    if problem is None and isinstance(value, int):
        return value
    if type(value) is not int:  # say what it is: a quoted "200", 200.0, true
        kind = "a decimal number" if isinstance(value, float) else _kind(value)
        problem = f"{problem}, not {kind}"
    problems.add(attribute.line, where, str(problem))
    return None


def read_catchup(
    attribute: Attribute | None, where: str, default: str, problems: Problems
) -> str | None:
    """The block's catchup, `default` when it sets none; None after recording why not."""
    if attribute is None:
        return default
    return read_checked_string(
        attribute, where, problems, lambda text: _quoted(text, catchup_problem(text))
    )


def read_overlap(
    attribute: Attribute | None, where: str, default: str, problems: Problems
) -> str | None:
    """The block's overlap, `default` when it sets none; None after recording why not."""
    if attribute is None:
        return default
    return read_checked_string(
        attribute, where, problems, lambda text: _quoted(text, overlap_problem(text))
    )


def read_keys(
    attribute: Attribute | None, where: str, has_schedule: bool, problems: Problems
) -> tuple[str, ...]:
    """A job's keys (provision/keyed.py): `lockctl schedule` runs the job once per tick for
    each, under its own lock and ledger; () when it lists none. Refused on a job without a
    schedule (a run names its key with `lockctl run --key`)."""
    if attribute is None:
        return ()
    problem = keys_problem(attribute.value)
    if problem is None and not has_schedule:
        problem = "has no effect: the job has no schedule (a run names its key: lockctl run --key)"
    if problem is not None:
        problems.add(attribute.line, where, problem)
        return ()
    value = attribute.value
    return tuple(key for key in value if isinstance(key, str)) if isinstance(value, tuple) else ()


def refuse_unscheduled_overlap(
    attributes: dict[str, Attribute], where: str, problems: Problems
) -> None:
    """A job's own overlap says what its next tick does to a run still going on: a job with no
    schedule (a plain lock, `lockctl run`) has no next tick, so it is refused at its line
    rather than ignored (defaults may set it for the scheduled jobs)."""
    overlap = attributes.get("overlap")
    if overlap is not None and "schedule" not in attributes:
        problems.add(
            overlap.line,
            f"{where}.overlap",
            "has no effect: the job has no schedule, so no next tick comes while it runs",
        )


def read_catchup_reach(
    attributes: dict[str, Attribute], where: str, default: CatchupReach, problems: Problems
) -> CatchupReach | None:
    """The block's catchup_limit and catchup_window over `default`; None after recording why
    one (or both) is not valid."""
    limit, window = attributes.get("catchup_limit"), attributes.get("catchup_window")
    count = default.limit if limit is None else _limit(limit, f"{where}.catchup_limit", problems)
    seconds = (
        default.window
        if window is None
        else _window_seconds(window, f"{where}.catchup_window", problems)
    )
    if count is None or seconds is None:
        return None
    return CatchupReach(seconds, count)


def refuse_idle_reach(
    attributes: dict[str, Attribute], catchup: str | None, where: str, problems: Problems
) -> None:
    """A job's own catchup_limit or catchup_window says how far catchup = "all" reaches: under
    another catchup it would do nothing, so it is refused at its line rather than ignored
    (defaults may set them for the jobs that use "all")."""
    if catchup is None or catchup == CATCHUP_ALL:
        return
    for key in CATCHUP_REACH_KEYS:
        attribute = attributes.get(key)
        if attribute is not None:
            message = (
                f'has no effect: it is how far catchup = "all" reaches, and this job\'s catchup '
                f'is "{catchup}"'
            )
            problems.add(attribute.line, f"{where}.{key}", message)


def _limit(attribute: Attribute, where: str, problems: Problems) -> int | None:
    return _whole(attribute, catchup_limit_problem(attribute.value), where, problems)


def read_seconds(attribute: Attribute, text: str, where: str, problems: Problems) -> float | None:
    """`text` (the attribute's string) as a duration in seconds; None after recording why not."""
    try:
        return parse_duration(text).seconds
    except DurationSyntaxError as exc:
        problems.add(attribute.line, where, str(exc))
        return None


def _window_seconds(attribute: Attribute, where: str, problems: Problems) -> float | None:
    text = read_string(attribute, where, problems)
    seconds = None if text is None else read_seconds(attribute, text, where, problems)
    if text is None or seconds is None:
        return None
    problem = catchup_window_problem(seconds)
    if problem:
        problems.add(attribute.line, where, f"{shown(text)} {problem}")
        return None
    return seconds


def _quoted(text: str, problem: str | None) -> str | None:
    return None if problem is None else f'"{shown(text)}" {problem}'


def _kind(value: Value) -> str:
    if isinstance(value, Unsupported):
        return value.what
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, tuple):
        return "a list"
    return "null" if value is None else "a string"


# --- worker address -------------------------------------------------------------------------


def read_address(attribute: Attribute | None, where: str, problems: Problems) -> str:
    if attribute is None:
        return DEFAULT_ADDRESS
    text = read_checked_string(attribute, where, problems, _address_problem)
    return DEFAULT_ADDRESS if text is None else text.rstrip("/")


def _address_problem(text: str) -> str | None:
    if not text.isascii() or not text.isprintable() or any(c.isspace() for c in text):
        return f'"{shown(text)}" must be printable ASCII without spaces'
    try:
        parts = urlsplit(text)
        parts.hostname  # noqa: B018 - raises ValueError on a broken [IPv6] literal
    except ValueError as exc:
        return f'"{text}" is not a URL ({exc})'
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f'"{text}" must be an http:// or https:// URL, like "{DEFAULT_ADDRESS}"'
    if parts.username or parts.password or parts.query or parts.fragment:
        return f'"{text}" must not carry credentials, a query or a fragment'
    if parts.path not in ("", "/"):
        return f'"{text}" must be the agent address only, without a path'
    try:
        parts.port  # noqa: B018 - urlsplit validates the port lazily
    except ValueError:
        return f'"{text}" has an invalid port'
    return None


# --- job prefix -----------------------------------------------------------------------------


def read_prefix(
    attribute: Attribute | None, where: str, line: int, problems: Problems
) -> str | None:
    if attribute is None:
        problems.add(line, where, 'missing: every job needs its lock prefix, like "locks/NAME/"')
        return None
    return read_checked_string(attribute, where, problems, prefix_problem)


_PREFIX_RULES: tuple[tuple[Callable[[str], bool], str], ...] = (
    (lambda p: p == "", "must not be empty: an empty prefix is the whole KV store"),
    (lambda p: not p.isascii(), "must be ASCII"),
    (lambda p: not p.isprintable(), "must not contain control characters"),
    (lambda p: any(c.isspace() for c in p), "must not contain whitespace"),
    (lambda p: any(c in p for c in "\"'`"), "must not contain quotes"),
    (lambda p: "\\" in p, "must not contain a backslash"),
    (lambda p: "${" in p or "%{" in p, "must not contain '${' or '%{' (template syntax)"),
    (lambda p: any(c in p for c in "{}"), "must not contain braces"),
    (lambda p: p.startswith("/"), "must be relative: Consul keys have no leading '/'"),
    (lambda p: ".." in p, "must not contain '..'"),
    (
        lambda p: "." in _segments(p),
        "must not have a '.' segment: HTTP clients drop it (locks/./a/ is sent as locks/a/), "
        "so the lock would be taken on one key and released on another",
    ),
    (
        lambda p: "" in _segments(p),
        "must not have an empty segment ('//'): Consul's HTTP server redirects '//' to '/', "
        "so the key it sees would not be this one",
    ),
    (lambda p: len(p) > MAX_PREFIX, f"must be at most {MAX_PREFIX} characters"),
    (
        lambda p: not p.endswith("/"),
        "must end with '/': without it, the grant also covers every key that merely starts "
        "with it (locks/a would cover locks/ab/)",
    ),
    (
        lambda p: PREFIX_PATTERN.fullmatch(p) is None,
        "may contain only letters, digits, '.', '_', '-' and '/'",
    ),
)


def _plainly_valid(prefix: str) -> bool:
    """A prefix no rule above refuses, in four checks: the pattern alone excludes everything
    but '..', a '.' segment and the length."""
    return (
        len(prefix) <= MAX_PREFIX
        and PREFIX_PATTERN.fullmatch(prefix) is not None
        and ".." not in prefix
        and "." not in _segments(prefix)
    )


def _segments(prefix: str) -> list[str]:
    """The prefix's segments; the empty one after its trailing '/' is not one."""
    return prefix.removesuffix("/").split("/")


def prefix_problem(prefix: str) -> str | None:
    """Why `prefix` cannot be a job's lock prefix, or None when it can."""
    if _plainly_valid(prefix):
        return None
    for broken, message in _PREFIX_RULES:
        if broken(prefix):
            return f'"{shown(prefix)}" {message}'
    return None


def prefix_relation(prefix: str, other: str) -> str | None:
    """How `prefix` stands to `other` when they would share keys: the same, inside, contains."""
    if prefix == other:
        return "is the same as"
    if prefix.startswith(other):
        return "is inside"
    if other.startswith(prefix):
        return "contains"
    return None


def prefix_overlaps(jobs: Sequence[tuple[str, str]]) -> list[tuple[int, int, str]]:
    """Every pair of jobs whose prefixes would share keys, from (name, prefix) in spec order:
    (later, earlier, relation of the later's prefix to the earlier's), ordered by later, then
    earlier, as comparing each job with every earlier one would give. A name seen before is
    left out (a duplicate job, reported on its own).

    Sorted, the prefixes that start with a prefix follow it at once, so each prefix is compared
    only with those: O(n log n) plus one step per overlap, where comparing all pairs took
    50 million steps for 10,000 jobs.
    """
    first: dict[str, int] = {}
    for index, (name, _) in enumerate(jobs):
        first.setdefault(name, index)
    kept = sorted(first.values(), key=lambda index: jobs[index][1])
    found: list[tuple[int, int, str]] = []
    for position, index in enumerate(kept):
        prefix = jobs[index][1]
        for next_position in range(position + 1, len(kept)):
            other = kept[next_position]
            if not jobs[other][1].startswith(prefix):
                break
            later, earlier = max(index, other), min(index, other)
            relation = prefix_relation(jobs[later][1], jobs[earlier][1])
            assert relation is not None  # one starts with the other
            found.append((later, earlier, relation))
    found.sort()
    return found


# --- job workers, schedule, command ---------------------------------------------------------


def read_job_workers(
    attribute: Attribute | None, where: str, line: int, declared: set[str], problems: Problems
) -> tuple[str, ...] | None:
    label = f"{where}.workers"
    if attribute is None:
        problems.add(
            line, label, 'missing: list the workers that may run the job, like ["worker-1"]'
        )
        return None
    value = attribute.value
    if not isinstance(value, tuple) or not all(isinstance(item, str) for item in value):
        problems.add(attribute.line, label, "must be a list of quoted worker names")
        return None
    names = tuple(item for item in value if isinstance(item, str))
    message = _workers_problem(names, declared)
    if message:
        problems.add(attribute.line, label, message)
        return None
    return tuple(sorted(names))


def _workers_problem(names: tuple[str, ...], declared: set[str]) -> str | None:
    if not names:
        return "must name at least one worker"
    twice = sorted(name for name, count in Counter(names).items() if count > 1)
    if twice:
        return f"names {', '.join(twice)} more than once"
    unknown = [name for name in names if name not in declared]
    if unknown:
        listed = ", ".join(f'"{shown(name)}"' for name in unknown)
        known = ", ".join(sorted(declared)) or "none"
        return f"{listed}: not a declared worker (declared: {known})"
    return None


def read_timezone(attribute: Attribute | None, where: str, problems: Problems) -> str | None:
    """The job's IANA timezone for its cron schedule, or None (UTC) when absent or refused."""
    if attribute is None:
        return None
    text = read_string(attribute, where, problems)
    if text is None:
        return None
    try:
        return check_zone(text)
    except ScheduleError as exc:
        problems.add(attribute.line, where, str(exc))
        return None


def read_schedule(
    attribute: Attribute | None, where: str, zone: str | None, problems: Problems
) -> str | None:
    """The schedule's text once lockctl can compute its ticks and systemd can fire on them."""
    if attribute is None:
        return None
    text = read_string(attribute, where, problems)
    if text is None:
        return None
    if not text.strip():
        problems.add(attribute.line, where, "must not be empty (or leave it out)")
    elif not text.isascii() or not text.isprintable() or any(c in text for c in "\"'`\\"):
        problems.add(attribute.line, where, "must be printable ASCII without quotes or backslashes")
    elif "%" in text:
        # systemd expands %-specifiers in OnCalendar=; no calendar expression needs a '%'
        problems.add(attribute.line, where, "must not contain '%' (systemd would expand it)")
    elif len(text) > MAX_SCHEDULE:
        problems.add(attribute.line, where, f"must be at most {MAX_SCHEDULE} characters")
    else:
        try:
            parse_schedule(text, zone)
        except ScheduleError as exc:
            problems.add(attribute.line, where, str(exc))
            return None
        return text
    return None


def read_command(
    attribute: Attribute | None, where: str, problems: Problems
) -> tuple[str, ...] | None:
    """The job's command as an argv list (never a shell string: nothing is re-parsed)."""
    if attribute is None:
        return None
    value = attribute.value
    if not isinstance(value, tuple) or not value or not all(isinstance(v, str) for v in value):
        problems.add(
            attribute.line, where, 'must be a non-empty list of strings, like ["/usr/bin/x"]'
        )
        return None
    argv = tuple(str(v) for v in value)
    if len(argv) > MAX_COMMAND_ARGS or any(len(arg) > MAX_ARGUMENT for arg in argv):
        problems.add(attribute.line, where, "is too long")
    elif not argv[0].startswith("/"):
        problems.add(attribute.line, where, f"{argv[0]!r}: the program must be an absolute path")
    elif any(not arg.isprintable() for arg in argv):
        problems.add(attribute.line, where, "arguments must be printable (no newlines or controls)")
    else:
        return argv
    return None
