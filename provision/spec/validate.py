"""Turn spec text into a validated `Spec`, or report every problem in it at once.

Strictness is the point: an unknown attribute is an error (a typo must not fall back to a default),
and a value that could not be written into an ACL policy verbatim is refused, never escaped.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from provision.durations import Duration, DurationSyntaxError, format_duration, parse_duration
from provision.errors import InputError
from provision.spec.hcl import Attribute, Block, Body, HclSyntaxError, Unsupported, Value, parse_hcl
from provision.spec.models import DEFAULT_ADDRESS, Defaults, Job, Spec, Worker
from provision.spec.names import NAME_RULE, is_valid_name
from provision.spec.problems import Problem, SpecError
from provision.timings import (
    DEFAULTS,
    FIELDS,
    bound_problem,
    default_renew_interval,
    fencing_problem,
    renew_problem,
)

MAX_SPEC_BYTES = 1024 * 1024
DURATION_KEYS = FIELDS
JOB_KEYS = ("prefix", "workers", "schedule", "command", *DURATION_KEYS)
WORKER_KEYS = ("address",)
BLOCK_TYPES = ("defaults", "worker", "job")
PREFIX_PATTERN = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*/$")
MAX_PREFIX = 256
MAX_SCHEDULE = 256
MAX_COMMAND_ARGS = 256
MAX_ARGUMENT = 4096


@dataclass(frozen=True)
class _Setting:
    """A duration plus where it was set, so cross-checks point at the right line."""

    value: Duration
    line: int
    where: str


class _Problems:
    """Collects problems (deduplicated, in order) for one file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.found: dict[Problem, None] = {}

    def add(self, line: int, where: str, message: str, column: int | None = None) -> None:
        self.found[Problem(self.path, line, where, message, column)] = None

    def raise_if_any(self) -> None:
        if self.found:
            ordered = sorted(self.found, key=lambda p: (p.line, p.column or 0))
            raise SpecError(self.path, tuple(ordered))


def load_spec(path: Path) -> Spec:
    """Read, parse and validate the spec file at `path`."""
    shown = str(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"spec {shown}: cannot read: {exc.strerror or exc}") from None
    return parse_spec(_decode(data, shown), shown)


def _decode(data: bytes, path: str) -> str:
    problems = _Problems(path)
    if len(data) > MAX_SPEC_BYTES:
        problems.add(1, "file", f"is {len(data)} bytes; a spec may be at most {MAX_SPEC_BYTES}")
        problems.raise_if_any()
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        problems.add(line, "file", f"is not UTF-8 (byte {data[exc.start]:#04x})")
        problems.raise_if_any()
        raise AssertionError("unreachable") from None


def parse_spec(text: str, path: str) -> Spec:
    """Validate spec `text` (read from `path`, used in messages) into a `Spec`."""
    problems = _Problems(path)
    if not text.strip():
        problems.add(1, "file", "is empty: declare at least one worker and one job")
        problems.raise_if_any()
    try:
        body = parse_hcl(text)
    except HclSyntaxError as exc:
        problems.add(exc.line, "syntax", exc.message, exc.column)
        problems.raise_if_any()
        raise AssertionError("unreachable") from None
    spec = _build(body, problems)
    problems.raise_if_any()
    return spec


def _build(body: Body, problems: _Problems) -> Spec:
    for attribute in body.attributes:
        problems.add(
            attribute.line,
            attribute.name,
            "unknown top-level attribute; expected blocks defaults, worker and job",
        )
    blocks = _known_blocks(body.blocks, problems)
    _check_duplicates(blocks["worker"], "worker", problems)
    _check_duplicates(blocks["job"], "job", problems)
    defaults = _defaults(blocks["defaults"], problems)
    workers = _workers(blocks["worker"], problems)
    declared = {worker.name for worker in workers}
    jobs = [_job(block, defaults, declared, problems) for block in blocks["job"]]
    named_jobs = [job for job in jobs if job is not None]
    _check_overlaps(_job_prefixes(blocks["job"]), problems)
    _check_not_empty(blocks["worker"], blocks["job"], problems)
    return Spec(
        path=problems.path,
        defaults=_final_defaults(defaults),
        workers=tuple(sorted(workers, key=lambda w: w.name)),
        jobs=tuple(sorted(named_jobs, key=lambda j: j.name)),
    )


def _known_blocks(blocks: Iterable[Block], problems: _Problems) -> dict[str, list[Block]]:
    known: dict[str, list[Block]] = {kind: [] for kind in BLOCK_TYPES}
    for block in blocks:
        if block.type in known:
            known[block.type].append(block)
        else:
            hint = _did_you_mean(block.type, BLOCK_TYPES)
            problems.add(
                block.line, block.type, f"unknown block; expected defaults, worker or job{hint}"
            )
    for extra in known["defaults"][1:]:
        first = known["defaults"][0].line
        problems.add(extra.line, "defaults", f"duplicate block; the first is on line {first}")
    return known


def _check_duplicates(blocks: list[Block], kind: str, problems: _Problems) -> None:
    first: dict[str, int] = {}
    for block in blocks:
        label = block.labels[0].text if block.labels else None
        if label is None:
            continue
        if label in first:
            where = _display(block, kind)
            problems.add(
                block.line, where, f"duplicate {kind}; the first is on line {first[label]}"
            )
        else:
            first[label] = block.line


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _check_not_empty(workers: list[Block], jobs: list[Block], problems: _Problems) -> None:
    if not workers:
        problems.add(1, "file", "declares no worker block")
    if not jobs:
        problems.add(1, "file", "declares no job block")


# --- attributes -----------------------------------------------------------------------------


def _attributes(
    block: Block, where: str, allowed: tuple[str, ...], problems: _Problems
) -> dict[str, Attribute]:
    """The block's attributes by name, reporting unknown and duplicate ones and nested blocks."""
    found: dict[str, Attribute] = {}
    for attribute in block.body.attributes:
        if attribute.name not in allowed:
            hint = _did_you_mean(attribute.name, allowed)
            problems.add(
                attribute.line,
                f"{where}.{attribute.name}",
                f"unknown attribute{hint}; expected one of: {', '.join(allowed)}",
            )
        elif attribute.name in found:
            first = found[attribute.name].line
            problems.add(
                attribute.line,
                f"{where}.{attribute.name}",
                f"set twice; the first is on line {first}",
            )
        else:
            found[attribute.name] = attribute
    for nested in block.body.blocks:
        problems.add(nested.line, f"{where}.{nested.type}", "unexpected block inside " + where)
    return found


def _string(attribute: Attribute, where: str, problems: _Problems) -> str | None:
    value = attribute.value
    if isinstance(value, str):
        return value
    problems.add(attribute.line, where, f"must be a quoted string, not {_kind(value)}")
    return None


def _checked_string(
    attribute: Attribute, where: str, problems: _Problems, problem_of: Callable[[str], str | None]
) -> str | None:
    """The attribute's string if `problem_of` finds nothing wrong with it; else None, and the
    problem (not a string, or what `problem_of` says) is recorded."""
    text = _string(attribute, where, problems)
    message = None if text is None else problem_of(text)
    if message:
        problems.add(attribute.line, where, message)
        return None
    return text


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


def _duration(
    attributes: dict[str, Attribute], key: str, where: str, problems: _Problems
) -> _Setting | None:
    attribute = attributes.get(key)
    if attribute is None:
        return None
    label = f"{where}.{key}"
    text = _string(attribute, label, problems)
    if text is None:
        return None
    try:
        duration = parse_duration(text)
    except DurationSyntaxError as exc:
        problems.add(attribute.line, label, str(exc))
        return None
    outside = bound_problem(key, duration.seconds)
    if outside:
        problems.add(attribute.line, label, f"{text} {outside}")
        return None
    return _Setting(duration, attribute.line, label)


# --- defaults -------------------------------------------------------------------------------


def _defaults(blocks: list[Block], problems: _Problems) -> dict[str, _Setting | None]:
    settings: dict[str, _Setting | None] = {key: None for key in DURATION_KEYS}
    for key, text in DEFAULTS.items():
        settings[key] = _Setting(parse_duration(text), 1, f"built-in {key}")
    if not blocks:
        return settings
    block = blocks[0]
    _labels(block, "defaults", 0, problems)
    attributes = _attributes(block, "defaults", DURATION_KEYS, problems)
    for key in DURATION_KEYS:
        if key in attributes:
            settings[key] = _duration(attributes, key, "defaults", problems)
    return settings


def _final_defaults(settings: dict[str, _Setting | None]) -> Defaults:
    def get(key: str) -> Duration:
        setting = settings[key]
        return setting.value if setting else parse_duration(DEFAULTS[key])

    renew, min_hold = settings["renew_interval"], settings["min_hold"]
    return Defaults(
        ttl=get("ttl"),
        lock_delay=get("lock_delay"),
        renew_interval=renew.value if renew else None,
        kill_grace=get("kill_grace"),
        min_hold=min_hold.value if min_hold else None,
    )


def _labels(block: Block, kind: str, count: int, problems: _Problems) -> str | None:
    """The block's one label (its name), or None after reporting why it is unusable."""
    if len(block.labels) != count:
        expected = "no label" if count == 0 else f'one label: {kind} "NAME" {{ ... }}'
        found = f"{len(block.labels)} label{'' if len(block.labels) == 1 else 's'}"
        problems.add(block.line, kind, f"has {found}; expected {expected}")
        return None
    if count == 0:
        return None
    label = block.labels[0]
    if label.text is None or not label.quoted:
        problems.add(block.line, kind, 'the name must be a plain quoted string: "NAME"')
        return None
    if not is_valid_name(label.text):
        problems.add(block.line, f'{kind} "{_shown(label.text)}"', f"invalid name: {NAME_RULE}")
        return None
    return label.text


def _shown(text: str) -> str:
    """`text` made safe for a one-line message (escapes control and non-ASCII characters)."""
    return text.encode("unicode_escape").decode("ascii").replace('"', '\\"')


# --- workers --------------------------------------------------------------------------------


def _workers(blocks: list[Block], problems: _Problems) -> list[Worker]:
    workers: dict[str, Worker] = {}
    for block in blocks:
        name = _labels(block, "worker", 1, problems)
        where = _display(block, "worker")
        attributes = _attributes(block, where, WORKER_KEYS, problems)
        if name is None:
            continue
        address = _address(attributes.get("address"), f"{where}.address", problems)
        if name in workers:
            continue  # reported by _check_duplicates
        workers[name] = Worker(name, address, block.line)
    return list(workers.values())


def _address(attribute: Attribute | None, where: str, problems: _Problems) -> str:
    if attribute is None:
        return DEFAULT_ADDRESS
    text = _checked_string(attribute, where, problems, _address_problem)
    return DEFAULT_ADDRESS if text is None else text.rstrip("/")


def _address_problem(text: str) -> str | None:
    if not text.isascii() or not text.isprintable() or any(c.isspace() for c in text):
        return f'"{_shown(text)}" must be printable ASCII without spaces'
    parts = urlsplit(text)
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


# --- jobs -----------------------------------------------------------------------------------


def _job(
    block: Block,
    defaults: dict[str, _Setting | None],
    declared: set[str],
    problems: _Problems,
) -> Job | None:
    name = _labels(block, "job", 1, problems)
    where = _display(block, "job")
    attributes = _attributes(block, where, JOB_KEYS, problems)
    prefix = _prefix(attributes.get("prefix"), f"{where}.prefix", block.line, problems)
    workers = _job_workers(attributes.get("workers"), where, block.line, declared, problems)
    schedule = _schedule(attributes.get("schedule"), f"{where}.schedule", problems)
    command = _command(attributes.get("command"), f"{where}.command", problems)
    timings = _timings(attributes, where, defaults, problems)
    if name is None or prefix is None or workers is None or timings is None:
        return None
    return Job(
        name=name,
        prefix=prefix,
        workers=workers,
        ttl=timings.ttl,
        lock_delay=timings.lock_delay,
        renew_interval=timings.renew_interval,
        kill_grace=timings.kill_grace,
        min_hold=timings.min_hold,
        schedule=schedule,
        command=command,
        line=block.line,
    )


def _display(block: Block, kind: str) -> str:
    """How a block is named in messages, even when its label is invalid."""
    if block.labels and block.labels[0].text is not None:
        return f'{kind} "{_shown(block.labels[0].text)}"'
    return kind


@dataclass(frozen=True)
class _Timings:
    ttl: Duration
    lock_delay: Duration
    renew_interval: Duration
    kill_grace: Duration
    min_hold: Duration | None


def _timings(
    attributes: dict[str, Attribute],
    where: str,
    defaults: dict[str, _Setting | None],
    problems: _Problems,
) -> _Timings | None:
    """The job's own durations over the defaults; None when one is invalid."""
    own = {key: _duration(attributes, key, where, problems) for key in DURATION_KEYS}
    if any(key in attributes and own[key] is None for key in DURATION_KEYS):
        return None
    chosen = {key: own[key] or defaults[key] for key in DURATION_KEYS}
    ttl, lock_delay, kill_grace = chosen["ttl"], chosen["lock_delay"], chosen["kill_grace"]
    if ttl is None or lock_delay is None or kill_grace is None:
        return None  # the defaults block had an invalid value, already reported there
    renew = _renew_interval(ttl, chosen["renew_interval"], where, problems)
    if renew is None:
        return None
    fencing = fencing_problem(lock_delay.value.seconds, renew.seconds, kill_grace.value.seconds)
    if fencing:
        problems.add(lock_delay.line, f"{where}.lock_delay", fencing)
        return None
    min_hold = chosen["min_hold"]
    return _Timings(
        ttl.value, lock_delay.value, renew, kill_grace.value, min_hold.value if min_hold else None
    )


def _renew_interval(
    ttl: _Setting, renew: _Setting | None, where: str, problems: _Problems
) -> Duration | None:
    """The renew interval (default TTL/3); it must stay below TTL/2 so one failed renewal can be
    retried before the session expires."""
    if renew is None:
        third = default_renew_interval(ttl.value.seconds)
        return Duration(third, format_duration(third))
    problem = renew_problem(renew.value.seconds, ttl.value.seconds)
    if problem is None:
        return renew.value
    own_renew, own_ttl = renew.where.startswith(where), ttl.where.startswith(where)
    culprit = renew if own_renew or not own_ttl else ttl
    problems.add(culprit.line, culprit.where, f"renew_interval {renew.value.text} {problem}")
    return None


def _prefix(attribute: Attribute | None, where: str, line: int, problems: _Problems) -> str | None:
    if attribute is None:
        problems.add(line, where, 'missing: every job needs its lock prefix, like "locks/NAME/"')
        return None
    return _checked_string(attribute, where, problems, prefix_problem)


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
    (lambda p: len(p) > MAX_PREFIX, f"must be at most {MAX_PREFIX} characters"),
    (
        lambda p: not p.endswith("/"),
        "must end with '/': without it, the grant also covers every key that merely starts "
        "with it (locks/a would cover locks/ab/)",
    ),
    (
        lambda p: PREFIX_PATTERN.fullmatch(p) is None,
        "may contain only letters, digits, '.', '_', '-' and '/' (no empty segment)",
    ),
)


def prefix_problem(prefix: str) -> str | None:
    """Why `prefix` cannot be a job's lock prefix, or None when it can."""
    for broken, message in _PREFIX_RULES:
        if broken(prefix):
            return f'"{_shown(prefix)}" {message}'
    return None


def _job_workers(
    attribute: Attribute | None, where: str, line: int, declared: set[str], problems: _Problems
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
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        return f"names {', '.join(twice)} more than once"
    unknown = [name for name in names if name not in declared]
    if unknown:
        shown = ", ".join(f'"{_shown(name)}"' for name in unknown)
        known = ", ".join(sorted(declared)) or "none"
        return f"{shown}: not a declared worker (declared: {known})"
    return None


def _schedule(attribute: Attribute | None, where: str, problems: _Problems) -> str | None:
    if attribute is None:
        return None
    text = _string(attribute, where, problems)
    if text is None:
        return None
    if not text.strip():
        problems.add(attribute.line, where, "must not be empty (or leave it out)")
    elif not text.isascii() or not text.isprintable() or any(c in text for c in "\"'`\\"):
        problems.add(attribute.line, where, "must be printable ASCII without quotes or backslashes")
    elif len(text) > MAX_SCHEDULE:
        problems.add(attribute.line, where, f"must be at most {MAX_SCHEDULE} characters")
    else:
        return text
    return None


def _command(
    attribute: Attribute | None, where: str, problems: _Problems
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


@dataclass(frozen=True)
class _JobPrefix:
    name: str
    prefix: str
    line: int


def _job_prefixes(blocks: list[Block]) -> list[_JobPrefix]:
    """Each named job's valid prefix, even when the job has other problems."""
    found: list[_JobPrefix] = []
    for block in blocks:
        name = block.labels[0].text if len(block.labels) == 1 else None
        values = [a.value for a in block.body.attributes if a.name == "prefix"]
        prefix = values[0] if values else None
        if name and isinstance(prefix, str) and prefix_problem(prefix) is None:
            found.append(_JobPrefix(name, prefix, block.line))
    return found


def _check_overlaps(jobs: list[_JobPrefix], problems: _Problems) -> None:
    """No job's prefix may contain, or lie inside, another's: that would share a lock."""
    seen: dict[str, _JobPrefix] = {}
    for job in jobs:
        if job.name in seen:
            continue  # reported by _check_duplicates
        for other in seen.values():
            relation = _relation(job.prefix, other.prefix)
            if relation:
                problems.add(
                    job.line,
                    f'job "{job.name}".prefix',
                    f'"{job.prefix}" {relation} job "{other.name}"\'s prefix "{other.prefix}"',
                )
        seen[job.name] = job


def _relation(prefix: str, other: str) -> str | None:
    if prefix == other:
        return "is the same as"
    if prefix.startswith(other):
        return "is inside"
    if other.startswith(prefix):
        return "contains"
    return None
