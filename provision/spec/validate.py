"""Turn spec text into a validated `Spec`, or report every problem in it at once: the walk over
the blocks (defaults, workers, jobs) and the rules across jobs; single values are in `values`.

Strictness is the point: an unknown attribute is an error (a typo must not fall back to a default),
and a value that could not be written into an ACL policy verbatim is refused, never escaped.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from provision.blackouts import Blackout
from provision.errors import InputError
from provision.schedule import parse_schedule
from provision.spec.blackout_block import read_blackouts
from provision.spec.datacenters import (
    DATACENTER_KEY,
    HOME_KEY,
    JOB_DATACENTER_KEYS,
    SCOPE_KEY,
    check_datacenters,
    read_datacenter,
    read_scope,
    refuse_home,
)
from provision.spec.hcl import Attribute, Block, Body, HclSyntaxError
from provision.spec.hcl_parse import parse_hcl
from provision.spec.http_block import HttpBlock, read_http
from provision.spec.identity import read_auth_methods, read_identity
from provision.spec.job_timings import (
    COUNT_KEYS,
    DURATION_KEYS,
    Counts,
    Settings,
    builtin_counts,
    builtin_settings,
    final_defaults,
    job_timings,
    read_counts,
    read_duration,
    with_retries,
)
from provision.spec.models import AuthMethod, Job, Spec, Worker
from provision.spec.names import DEFAULT_OWNER, NAME_RULE, is_valid_name
from provision.spec.notify_block import PING_KEY, read_notifications
from provision.spec.prefixes import check_job_prefixes
from provision.spec.problems import Problems, shown
from provision.spec.values import (
    CATCHUP_REACH_KEYS,
    CHOICE_KEYS,
    read_address,
    read_bool,
    read_capacity,
    read_catchup,
    read_catchup_reach,
    read_command,
    read_job_workers,
    read_keys,
    read_overlap,
    read_prefix,
    read_schedule,
    read_string,
    read_timezone,
    refuse_idle_reach,
    refuse_unscheduled_overlap,
)
from provision.system.files import UnreadableFile, read_regular_file
from provision.system.http_call import RETRY_ON_TIMEOUT_REFUSED
from provision.system.notify_rules import Notifications
from provision.timings import (
    DEFAULT_CATCHUP,
    DEFAULT_CATCHUP_REACH,
    DEFAULT_OVERLAP,
    CatchupReach,
)

MAX_SPEC_BYTES = 16 * 1024 * 1024  # a 10,000-job spec is about 3 MB
DEFAULTS_KEYS = (*DURATION_KEYS, *COUNT_KEYS, *CHOICE_KEYS, *CATCHUP_REACH_KEYS, PING_KEY)
# allow_remote_target: a job's own decision (an HTTP job's target), never a default
JOB_KEYS = (
    "prefix",
    "workers",
    "schedule",
    "timezone",
    "command",
    "keys",
    *DEFAULTS_KEYS,
    "allow_remote_target",
    *JOB_DATACENTER_KEYS,
)
CAPACITY_KEY = "max_concurrent_runs"
WORKER_KEYS = ("address", "agentless", DATACENTER_KEY, CAPACITY_KEY)
BLOCK_TYPES = ("defaults", "worker", "job", "auth_method")


def load_spec(path: Path) -> Spec:
    """Read, parse and validate the spec file at `path`."""
    shown = str(path)
    try:
        data = read_regular_file(path, MAX_SPEC_BYTES)
    except UnreadableFile as exc:
        raise InputError(f"spec {shown}: cannot read: {exc}") from None
    return parse_spec(_decode(data, shown), shown)


def _decode(data: bytes, path: str) -> str:
    problems = Problems(path)
    if len(data) > MAX_SPEC_BYTES:
        problems.add(
            1, "file", f"is over {MAX_SPEC_BYTES} bytes; a spec may be at most {MAX_SPEC_BYTES}"
        )
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
    problems = Problems(path)
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


TOP_LEVEL_KEYS = ("owner",)
_INNER = ("notify", "blackout")  # the blocks both `defaults` and a job may hold


def _build(body: Body, problems: Problems) -> Spec:
    owner = _owner(body, problems)
    blocks = _known_blocks(body.blocks, problems)
    _check_duplicates(blocks["worker"], "worker", problems)
    _check_duplicates(blocks["job"], "job", problems)
    catchup = _default_catchup(blocks["defaults"], problems)
    reach = _default_catchup_reach(blocks["defaults"], problems)
    overlap = _default_overlap(blocks["defaults"], problems)
    defaults, counts = _defaults(blocks["defaults"], problems)
    notifications = _default_notifications(blocks["defaults"], problems)
    blackouts = _default_blackouts(blocks["defaults"], problems)
    methods = read_auth_methods(blocks["auth_method"], problems)
    workers = _workers(blocks["worker"], methods, _method_names(blocks), problems)
    declared = {worker.name for worker in workers}
    inherited = _Inherited(
        defaults, counts, (catchup, reach), notifications, blackouts, overlap=overlap
    )
    jobs = [_job(block, inherited, declared, problems) for block in blocks["job"]]
    named_jobs = [job for job in jobs if job is not None]
    check_job_prefixes(blocks["job"], problems)
    check_datacenters(workers, named_jobs, problems)
    _check_not_empty(blocks["worker"], blocks["job"], problems)
    return Spec(
        path=problems.path,
        defaults=replace(
            final_defaults(defaults, counts),
            catchup=catchup,
            catchup_reach=reach,
            overlap=overlap,
            notifications=notifications,
            blackouts=blackouts,
        ),
        workers=tuple(sorted(workers, key=lambda w: w.name)),
        jobs=tuple(sorted(named_jobs, key=lambda j: j.name)),
        auth_methods=tuple(methods[name] for name in sorted(methods)),
        owner=owner,
    )


def _owner(body: Body, problems: Problems) -> str:
    """The spec's `owner = "NAME"` (a name like a job's; DEFAULT_OWNER when absent), reporting
    every other top-level attribute and a second `owner`."""
    found: Attribute | None = None
    for attribute in body.attributes:
        if attribute.name not in TOP_LEVEL_KEYS:
            hint = _did_you_mean(attribute.name, TOP_LEVEL_KEYS)
            problems.add(
                attribute.line,
                attribute.name,
                f"unknown top-level attribute{hint}; expected owner, and blocks defaults, "
                "worker, job and auth_method",
            )
        elif found is not None:
            problems.add(attribute.line, "owner", f"set twice; the first is on line {found.line}")
        else:
            found = attribute
    if found is None:
        return DEFAULT_OWNER
    owner = read_string(found, "owner", problems)
    if owner is not None and not is_valid_name(owner):
        problems.add(found.line, "owner", f'"{shown(owner)}": invalid name: {NAME_RULE}')
        return DEFAULT_OWNER
    return owner or DEFAULT_OWNER


def _known_blocks(blocks: Iterable[Block], problems: Problems) -> dict[str, list[Block]]:
    known: dict[str, list[Block]] = {kind: [] for kind in BLOCK_TYPES}
    for block in blocks:
        if block.type in known:
            known[block.type].append(block)
        else:
            hint = _did_you_mean(block.type, BLOCK_TYPES)
            problems.add(
                block.line,
                block.type,
                f"unknown block; expected defaults, worker, job or auth_method{hint}",
            )
    for extra in known["defaults"][1:]:
        first = known["defaults"][0].line
        problems.add(extra.line, "defaults", f"duplicate block; the first is on line {first}")
    return known


def _check_duplicates(blocks: list[Block], kind: str, problems: Problems) -> None:
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


def _check_not_empty(workers: list[Block], jobs: list[Block], problems: Problems) -> None:
    if not workers:
        problems.add(1, "file", "declares no worker block")
    if not jobs:
        problems.add(1, "file", "declares no job block")


# --- attributes and labels ------------------------------------------------------------------


def _attributes(
    block: Block,
    where: str,
    allowed: tuple[str, ...],
    problems: Problems,
    blocks: tuple[str, ...] = (),
) -> dict[str, Attribute]:
    """The block's attributes by name, reporting unknown and duplicate ones and nested blocks
    (but those of a type in `blocks`, which the caller reads)."""
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
        if nested.type not in blocks:
            problems.add(nested.line, f"{where}.{nested.type}", "unexpected block inside " + where)
    return found


def _labels(block: Block, kind: str, count: int, problems: Problems) -> str | None:
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
        problems.add(block.line, f'{kind} "{shown(label.text)}"', f"invalid name: {NAME_RULE}")
        return None
    return label.text


def _display(block: Block, kind: str) -> str:
    """How a block is named in messages, even when its label is invalid."""
    if block.labels and block.labels[0].text is not None:
        return f'{kind} "{shown(block.labels[0].text)}"'
    return kind


# --- defaults -------------------------------------------------------------------------------


def _default_catchup(blocks: list[Block], problems: Problems) -> str:
    """The catchup every job inherits; an invalid one is reported (its block's other problems
    are _defaults'), and the built-in one stands in: the spec is refused anyway."""
    found = [a for block in blocks[:1] for a in block.body.attributes if a.name == "catchup"]
    chosen = read_catchup(
        found[0] if found else None, "defaults.catchup", DEFAULT_CATCHUP, problems
    )
    return chosen or DEFAULT_CATCHUP


def _default_overlap(blocks: list[Block], problems: Problems) -> str:
    """The overlap every scheduled job inherits; an invalid one is reported, and the built-in
    one stands in: the spec is refused anyway."""
    found = [a for block in blocks[:1] for a in block.body.attributes if a.name == "overlap"]
    chosen = read_overlap(
        found[0] if found else None, "defaults.overlap", DEFAULT_OVERLAP, problems
    )
    return chosen or DEFAULT_OVERLAP


def _default_catchup_reach(blocks: list[Block], problems: Problems) -> CatchupReach:
    """The catchup_limit and catchup_window every job inherits; an invalid one is reported,
    and the built-in one stands in: the spec is refused anyway."""
    found = {a.name: a for block in blocks[:1] for a in block.body.attributes}
    reach = read_catchup_reach(found, "defaults", DEFAULT_CATCHUP_REACH, problems)
    return reach or DEFAULT_CATCHUP_REACH


def _defaults(blocks: list[Block], problems: Problems) -> tuple[Settings, Counts]:
    """The durations and counts every job inherits; an invalid count is reported and the
    built-in one stands in (the spec is refused anyway)."""
    settings, counts = builtin_settings(), builtin_counts()
    if not blocks:
        return settings, counts
    block = blocks[0]
    _labels(block, "defaults", 0, problems)
    attributes = _attributes(block, "defaults", DEFAULTS_KEYS, problems, blocks=_INNER)
    for key in DURATION_KEYS:
        if key in attributes:
            settings[key] = read_duration(attributes, key, "defaults", problems)
    own_counts = read_counts(attributes, "defaults", counts, problems)
    return settings, counts if own_counts is None else own_counts


def _default_blackouts(blocks: list[Block], problems: Problems) -> tuple[Blackout, ...]:
    """The blackout windows every job has (spec/blackout_block.py)."""
    return read_blackouts(blocks[0], "defaults", (), problems) if blocks else ()


def _default_notifications(blocks: list[Block], problems: Problems) -> Notifications:
    """The notify blocks and ping file every job inherits (spec/notify_block.py)."""
    if not blocks:
        return Notifications()
    block = blocks[0]
    ping = next((a for a in block.body.attributes if a.name == PING_KEY), None)
    return read_notifications(block, "defaults", ping, Notifications(), problems)


# --- workers --------------------------------------------------------------------------------


def _workers(
    blocks: list[Block], methods: dict[str, AuthMethod], method_names: set[str], problems: Problems
) -> list[Worker]:
    workers: dict[str, Worker] = {}
    for block in blocks:
        name = _labels(block, "worker", 1, problems)
        where = _display(block, "worker")
        plain, identities = _split_identity(block, where, problems)
        attributes = _attributes(plain, where, WORKER_KEYS, problems)
        identity = read_identity(identities, where, methods, method_names, problems)
        if name is None:
            continue
        address = read_address(attributes.get("address"), f"{where}.address", problems)
        agentless = read_bool(attributes.get("agentless"), f"{where}.agentless", problems)
        datacenter = read_datacenter(
            attributes.get(DATACENTER_KEY), f"{where}.{DATACENTER_KEY}", problems
        )
        capacity = read_capacity(attributes.get(CAPACITY_KEY), f"{where}.{CAPACITY_KEY}", problems)
        if name in workers:
            continue  # reported by _check_duplicates
        workers[name] = Worker(name, address, block.line, identity, agentless, datacenter, capacity)
    return list(workers.values())


def _split_identity(block: Block, where: str, problems: Problems) -> tuple[Block, Block | None]:
    """The worker block without its `identity` block (spec.identity reads that), and the block."""
    found = [inner for inner in block.body.blocks if inner.type == "identity"]
    for extra in found[1:]:
        first = found[0].line
        problems.add(
            extra.line, f"{where}.identity", f"duplicate block; the first is on line {first}"
        )
    others = tuple(inner for inner in block.body.blocks if inner.type != "identity")
    plain = replace(block, body=Body(block.body.attributes, others))
    return plain, found[0] if found else None


def _method_names(blocks: dict[str, list[Block]]) -> set[str]:
    """Every auth_method label, valid or not: a worker naming one is not told it is undeclared."""
    return {b.labels[0].text for b in blocks["auth_method"] if b.labels and b.labels[0].text}


# --- jobs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Inherited:
    """What a job takes from `defaults` unless it sets its own."""

    settings: Settings
    counts: Counts
    catchup: tuple[str, CatchupReach]  # catchup, and its catchup_window and catchup_limit
    notifications: Notifications
    blackouts: tuple[Blackout, ...] = ()
    overlap: str = DEFAULT_OVERLAP  # what a tick does to the job's run still going on


def _job(block: Block, inherited: _Inherited, declared: set[str], problems: Problems) -> Job | None:
    defaults, default_counts = inherited.settings, inherited.counts
    name = _labels(block, "job", 1, problems)
    where = _display(block, "job")
    attributes = _attributes(block, where, JOB_KEYS, problems, blocks=("http", *_INNER))
    notifications = read_notifications(
        block, where, attributes.get(PING_KEY), inherited.notifications, problems
    )
    prefix = read_prefix(attributes.get("prefix"), f"{where}.prefix", block.line, problems)
    workers = read_job_workers(attributes.get("workers"), where, block.line, declared, problems)
    zone = read_timezone(attributes.get("timezone"), f"{where}.timezone", problems)
    schedule = read_schedule(attributes.get("schedule"), f"{where}.schedule", zone, problems)
    command = read_command(attributes.get("command"), f"{where}.command", problems)
    timings = job_timings(attributes, where, defaults, problems)
    counts = read_counts(attributes, where, default_counts, problems)
    every = None if schedule is None else parse_schedule(schedule, zone).every
    allow_remote = read_bool(
        attributes.get("allow_remote_target"), f"{where}.allow_remote_target", problems
    )
    http = _http(block, where, attributes, command, every, allow_remote, problems)
    if timings is not None and http is not None:  # the request's timeout is the job's
        timings = replace(timings, timeout=http.call.timeout)
    if timings is not None and counts is not None:
        timings = with_retries(timings, counts, every, attributes, where, problems)
    if http is not None and counts is not None and counts["retry_on_timeout"]:
        _refuse_retry_on_timeout(block, where, attributes, problems)
    default_catchup, default_reach = inherited.catchup
    catchup = read_catchup(attributes.get("catchup"), f"{where}.catchup", default_catchup, problems)
    reach = read_catchup_reach(attributes, where, default_reach, problems)
    refuse_idle_reach(attributes, catchup, where, problems)
    overlap = read_overlap(
        attributes.get("overlap"), f"{where}.overlap", inherited.overlap, problems
    )
    refuse_unscheduled_overlap(attributes, where, problems)
    keys = read_keys(attributes.get("keys"), f"{where}.keys", schedule is not None, problems)
    scope = read_scope(attributes.get(SCOPE_KEY), f"{where}.{SCOPE_KEY}", problems)
    blackouts = read_blackouts(block, where, inherited.blackouts, problems)
    refuse_home(attributes.get(HOME_KEY), f"{where}.{HOME_KEY}", problems)
    if name is None or prefix is None or workers is None or timings is None or counts is None:
        return None
    if catchup is None or reach is None or overlap is None:
        return None
    return Job(
        name=name,
        prefix=prefix,
        workers=workers,
        timings=timings,
        schedule=schedule,
        command=command,
        line=block.line,
        http=None if http is None else http.call,
        timezone=zone or "UTC",
        history_limit=counts["history_limit"],
        catchup=catchup,
        catchup_reach=reach,
        overlap=overlap,
        allow_remote_target=allow_remote,
        http_url_line=None if http is None else http.url_line,
        notifications=notifications,
        scope=scope,
        blackouts=blackouts,
        keys=keys,
    )


def _http(
    block: Block,
    where: str,
    attributes: dict[str, Attribute],
    command: tuple[str, ...] | None,
    every: float | None,
    allow_remote: bool,
    problems: Problems,
) -> HttpBlock | None:
    """The job's `http` block (spec/http_block.py): exactly one of it and `command`, and its
    own `timeout` rather than the job's; allow_remote_target only beside it."""
    blocks = [nested for nested in block.body.blocks if nested.type == "http"]
    http = read_http(blocks, where, every, allow_remote, problems)
    if not blocks and "allow_remote_target" in attributes:
        line = attributes["allow_remote_target"].line
        message = "only a job with an http block has a target to allow; remove it"
        problems.add(line, f"{where}.allow_remote_target", message)
    if blocks and "command" in attributes:
        line = attributes["command"].line
        problems.add(line, f"{where}.command", "a job has a command or an http block, not both")
        return None
    if blocks and "timeout" in attributes:
        line = attributes["timeout"].line
        problems.add(line, f"{where}.timeout", "an HTTP job sets its timeout in http.timeout")
        return None
    return http


def _refuse_retry_on_timeout(
    block: Block, where: str, attributes: dict[str, Attribute], problems: Problems
) -> None:
    """An HTTP job with retry_on_timeout: at the job's own attribute, or at the job when it
    inherits it from defaults (which may well set it for the command jobs)."""
    own = attributes.get("retry_on_timeout")
    if own is not None:
        message = f"true is refused for an HTTP job: {RETRY_ON_TIMEOUT_REFUSED}"
        problems.add(own.line, f"{where}.retry_on_timeout", message)
        return
    message = (
        "inherits retry_on_timeout = true from defaults, which is refused for an HTTP job "
        f"(set retry_on_timeout = false in it): {RETRY_ON_TIMEOUT_REFUSED}"
    )
    problems.add(block.line, where, message)
