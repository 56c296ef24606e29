"""A job's timings and counts from the spec: each duration as set (and where), the job's own over
the defaults, checked against the bounds and the fencing rule in `provision.timings`, settled
into the `JobTimings` (seconds) that the job and its workers' configs carry."""

from __future__ import annotations

from dataclasses import dataclass, replace

from provision.durations import Duration, DurationSyntaxError, parse_duration
from provision.spec.hcl import Attribute
from provision.spec.models import Defaults
from provision.spec.problems import Problems
from provision.spec.values import read_count, read_string
from provision.timings import (
    COUNT_DEFAULTS,
    COUNT_FIELDS,
    DEFAULTS,
    FIELDS,
    FLAG_DEFAULTS,
    FLAG_FIELDS,
    JobTimings,
    bound_problem,
    default_renew_interval,
    fencing_problem,
    jitter_problem,
    renew_problem,
    retry_problem,
)

DURATION_KEYS = FIELDS
COUNT_KEYS = (*COUNT_FIELDS, *FLAG_FIELDS)  # read alike: a flag is a count of true or false


@dataclass(frozen=True)
class Setting:
    """A duration plus where it was set, so cross-checks point at the right line."""

    value: Duration
    line: int
    where: str


Settings = dict[str, Setting | None]  # by duration key; None where the value was invalid
Counts = dict[str, int]  # by count key; a flag's value is a bool


def builtin_settings() -> Settings:
    """The settings before any defaults block: the built-in defaults, the rest unset."""
    settings: Settings = {key: None for key in DURATION_KEYS}
    for key, text in DEFAULTS.items():
        settings[key] = Setting(parse_duration(text), 1, f"built-in {key}")
    return settings


def read_duration(
    attributes: dict[str, Attribute], key: str, where: str, problems: Problems
) -> Setting | None:
    attribute = attributes.get(key)
    if attribute is None:
        return None
    label = f"{where}.{key}"
    text = read_string(attribute, label, problems)
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
    return Setting(duration, attribute.line, label)


def read_counts(
    attributes: dict[str, Attribute], where: str, defaults: Counts, problems: Problems
) -> Counts | None:
    """The block's own counts over `defaults`; None when one it sets is invalid."""
    counts = dict(defaults)
    valid = True
    for key in COUNT_KEYS:
        attribute = attributes.get(key)
        if attribute is None:
            continue
        read = read_flag if key in FLAG_FIELDS else read_count
        value = read(attribute, key, f"{where}.{key}", problems)
        if value is None:
            valid = False
        else:
            counts[key] = value
    return counts if valid else None


def _builtin(key: str) -> Setting:
    return Setting(parse_duration(DEFAULTS[key]), 1, f"built-in {key}")


def builtin_counts() -> Counts:
    return {**COUNT_DEFAULTS, **FLAG_DEFAULTS}


def read_flag(attribute: Attribute, field: str, where: str, problems: Problems) -> bool | None:
    """true or false (unquoted), or None after saying what it is instead."""
    if isinstance(attribute.value, bool):
        return attribute.value
    problems.add(attribute.line, where, "must be true or false (unquoted)")
    return None


def with_retries(
    timings: JobTimings,
    counts: Counts,
    every: int | None,
    attributes: dict[str, Attribute],
    where: str,
    problems: Problems,
) -> JobTimings | None:
    """The job's timings with its retry counts (the job's own over the defaults') added; None
    when its retry_delay cannot fit between two of its `@every` ticks (`every` seconds)."""
    retries = counts["retries"]
    problem = retry_problem(timings.retry_delay, retries, every)
    if problem:
        keys = ("retry_delay", "retries", "schedule")  # the job's own, else its schedule
        own = next(attributes[key] for key in keys if key in attributes)
        problems.add(own.line, f"{where}.{own.name}", problem)
        return None
    on_timeout = bool(counts["retry_on_timeout"])
    return replace(timings, retries=retries, retry_on_timeout=on_timeout)


def final_defaults(settings: Settings, counts: Counts) -> Defaults:
    def get(key: str) -> Duration:
        setting = settings[key]
        return setting.value if setting else parse_duration(DEFAULTS[key])

    renew, min_hold, timeout = (settings[k] for k in ("renew_interval", "min_hold", "timeout"))
    return Defaults(
        ttl=get("ttl"),
        lock_delay=get("lock_delay"),
        renew_interval=renew.value if renew else None,
        kill_grace=get("kill_grace"),
        min_hold=min_hold.value if min_hold else None,
        start_deadline=get("start_deadline"),
        history_limit=counts["history_limit"],
        jitter=get("jitter"),
        timeout=timeout.value if timeout else None,
        retries=counts["retries"],
        retry_delay=get("retry_delay"),
        retry_on_timeout=bool(counts["retry_on_timeout"]),
    )


def job_timings(
    attributes: dict[str, Attribute], where: str, defaults: Settings, problems: Problems
) -> JobTimings | None:
    """The job's own durations over the defaults; None when one is invalid."""
    own = {key: read_duration(attributes, key, where, problems) for key in DURATION_KEYS}
    if any(key in attributes and own[key] is None for key in DURATION_KEYS):
        return None
    chosen = {key: own[key] or defaults[key] for key in DURATION_KEYS}
    ttl, lock_delay, kill_grace = chosen["ttl"], chosen["lock_delay"], chosen["kill_grace"]
    deadline, jitter = chosen["start_deadline"], chosen["jitter"]
    if ttl is None or lock_delay is None or kill_grace is None or deadline is None:
        return None  # the defaults block had an invalid value, already reported there
    if jitter is None:
        return None
    renew = _renew_interval(ttl, chosen["renew_interval"], where, problems)
    if renew is None:
        return None
    fencing = fencing_problem(lock_delay.value.seconds, renew, kill_grace.value.seconds)
    if fencing:
        problems.add(lock_delay.line, f"{where}.lock_delay", fencing)
        return None
    late = jitter_problem(jitter.value.seconds, deadline.value.seconds)
    if late:  # blame the job's own setting, the jitter when both are the job's or the defaults'
        own_deadline = deadline.where.startswith(where) and not jitter.where.startswith(where)
        culprit = deadline if own_deadline else jitter
        problems.add(culprit.line, culprit.where, late)
        return None
    min_hold, timeout, retry_delay = chosen["min_hold"], chosen["timeout"], chosen["retry_delay"]
    return JobTimings(
        ttl=ttl.value.seconds,
        lock_delay=lock_delay.value.seconds,
        renew_interval=renew,
        kill_grace=kill_grace.value.seconds,
        min_hold=min_hold.value.seconds if min_hold else 0.0,
        start_deadline=deadline.value.seconds,
        jitter=jitter.value.seconds,
        timeout=timeout.value.seconds if timeout else None,
        retry_delay=(retry_delay or _builtin("retry_delay")).value.seconds,
    )


def _renew_interval(
    ttl: Setting, renew: Setting | None, where: str, problems: Problems
) -> float | None:
    """The renew interval in seconds (default TTL/3); it must stay below TTL/2 so one failed
    renewal can be retried before the session expires."""
    if renew is None:
        return default_renew_interval(ttl.value.seconds)
    problem = renew_problem(renew.value.seconds, ttl.value.seconds)
    if problem is None:
        return renew.value.seconds
    own_renew, own_ttl = renew.where.startswith(where), ttl.where.startswith(where)
    culprit = renew if own_renew or not own_ttl else ttl
    problems.add(culprit.line, culprit.where, f"renew_interval {renew.value.text} {problem}")
    return None
