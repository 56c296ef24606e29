"""One job's entry in the worker config (lockctl.json): written from the spec's Job, and read
back into the JobConfig the runner and the scheduler use, checked as the spec checks it (bounds,
renew interval, fencing bound, jitter, schedule, command), each problem as `path.to.field:
message`. The field readers here serve the file's top level too (provision.workers.config).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from provision.durations import DurationSyntaxError, format_duration, parse_duration
from provision.keyed import keyed_lock_key, keys_problem
from provision.system.http_call import (
    RETRY_ON_TIMEOUT_REFUSED,
    HttpCall,
    method_problem,
    url_problem,
)
from provision.system.notify_rules import (
    NO_NOTIFICATIONS,
    PING,
    PING_TAKEN,
    Notifications,
    NotifyTarget,
    on_problem,
    ordered_on,
    repeat_problem,
    url_file_problem,
)
from provision.timings import (
    COUNT_DEFAULTS,
    DEFAULT_CATCHUP,
    DEFAULT_CATCHUP_REACH,
    DEFAULT_OVERLAP,
    DEFAULTS,
    FLAG_DEFAULTS,
    CatchupReach,
    JobTimings,
    bound_problem,
    catchup_limit_problem,
    catchup_problem,
    catchup_window_problem,
    count_problem,
    fencing_problem,
    jitter_problem,
    overlap_problem,
    renew_problem,
)

if TYPE_CHECKING:
    from provision.blackouts import Blackout
    from provision.spec import Job

MAX_COMMAND_ARGS = 256  # as the spec bounds a job's command
MAX_ARGUMENT = 4096


@dataclass(frozen=True)
class JobConfig:
    name: str
    lock_key: str
    timings: JobTimings  # the one the spec settled, read back from the file
    schedule: str | None
    timezone: str = "UTC"  # the IANA zone of `schedule`; configs before it lack it (UTC)
    history_limit: int = 50  # tick records the ledger keeps for this job (timings.COUNT_DEFAULTS)
    command: tuple[str, ...] | None = None  # the argv `lockctl schedule` runs; None: it has none
    workers: tuple[str, ...] = ()  # every worker of the job, for the claim order; (): unknown
    http: HttpCall | None = None  # an HTTP job's call, instead of `command` (runner/http_job.py)
    catchup: str = DEFAULT_CATCHUP  # "latest": run the newest tick nobody ran (ledger/catchup.py)
    catchup_reach: CatchupReach = DEFAULT_CATCHUP_REACH  # "all": how far back, how many
    notifications: Notifications = NO_NOTIFICATIONS  # the URL files only (system/notify_rules.py)
    blackouts: tuple[Blackout, ...] = ()  # its ticks are not run in these (provision/blackouts.py)
    overlap: str = (
        DEFAULT_OVERLAP  # "cancel": a tick stops the run still going on (tick/overlap.py)
    )
    key: str | None = None  # a keyed run's key: its lock and ledger under <prefix>keys/<key>/
    keys: tuple[str, ...] = ()  # the keys `lockctl schedule` runs it for (the spec's `keys`)

    @property
    def unit(self) -> str:
        """The job, or one key of it (`report/tenant-1`): what a scheduler runs on its own."""
        return self.name if self.key is None else f"{self.name}/{self.key}"

    def units(self) -> list[JobConfig]:
        """What `lockctl schedule` runs of the job: the job, or each of its keys (never the
        job itself then: a keyed job's ticks are its keys')."""
        return [self.keyed(key) for key in self.keys] if self.keys else [self]

    def keyed(self, key: str) -> JobConfig:
        """The job as a run for `key` sees it (a key that passed spec/names.py key_problem):
        its own lock and ledger under the job's prefix, its name, control keys and timings
        the job's."""
        return replace(self, lock_key=keyed_lock_key(self.lock_key, key), key=key, keys=())


def job_record(job: Job) -> dict[str, Any]:
    """The job's entry as written to lockctl.json (read_job reads it back)."""
    return {
        "lock_key": job.lock_key,
        **timings_record(job.timings),
        "schedule": job.schedule,
        "timezone": job.timezone,
        "history_limit": job.history_limit,
        "command": list(job.command) if job.command else None,
        "workers": list(job.workers),
        **http_record(job.http),
        # only when set: a lockctl from before it refuses the field; without it, "skip"
        **({"catchup": job.catchup} if job.catchup != DEFAULT_CATCHUP else {}),
        **catchup_reach_record(job.catchup, job.catchup_reach),
        # only when set, as catchup: a lockctl from before it refuses the field
        **({"overlap": job.overlap} if job.overlap != DEFAULT_OVERLAP else {}),
        **notify_record(job.notifications),
        **blackout_record(job.blackouts),
        **({"keys": list(job.keys)} if job.keys else {}),  # as overlap: only when set
    }


def catchup_reach_record(catchup: str, reach: CatchupReach) -> dict[str, Any]:
    """A catchup = "all" job's catchup_window and catchup_limit (only for one: a lockctl from
    before them refuses the fields, and refuses "all" anyway)."""
    if catchup != "all":
        return {}
    return {"catchup_window": format_duration(reach.window), "catchup_limit": reach.limit}


def blackout_record(windows: tuple[Blackout, ...]) -> dict[str, Any]:
    """The job's blackout windows, in order, only when it has them (a lockctl from before
    them refuses the field)."""
    if not windows:
        return {}
    entries = {
        w.name: {
            "schedule": w.schedule.text,
            "duration": format_duration(w.duration),
            "timezone": w.schedule.zone,
        }
        for w in windows
    }
    return {"blackout": entries}


def notify_record(notifications: Notifications) -> dict[str, Any]:
    """The job's notify blocks and ping file, only when it has them (a lockctl from before
    them refuses the fields): the files' paths, never a URL."""
    record: dict[str, Any] = {}
    if notifications.targets:
        record["notify"] = {t.name: _target_record(t) for t in notifications.targets}
    if notifications.ping_url_file:
        record["ping_url_file"] = notifications.ping_url_file
    return record


def _target_record(target: NotifyTarget) -> dict[str, Any]:
    """One notify block's entry; `repeat_after` only when it has one (an older lockctl's)."""
    record: dict[str, Any] = {"url_file": target.url_file, "on": list(target.on)}
    if target.repeat_after is not None:
        record["repeat_after"] = target.repeat_after
    return record


def http_record(http: HttpCall | None) -> dict[str, dict[str, str]]:
    """An HTTP job's call, only for one (a lockctl from before it refuses the field); its
    timeout is the job's `timeout`, written with the timings."""
    return {} if http is None else {"http": {"url": http.url, "method": http.method}}


def timings_record(timings: JobTimings) -> dict[str, str | int | bool | None]:
    """The job's timings as the config's duration strings (`_job` reads them back)."""
    # `timeout` only when set: a lockctl from before it refuses the field, and without one the
    # config means the same to it.
    timeout = {"timeout": format_duration(timings.timeout)} if timings.timeout else {}
    return {
        "ttl": format_duration(timings.ttl),
        "lock_delay": format_duration(timings.lock_delay),
        "renew_interval": format_duration(timings.renew_interval),
        "kill_grace": format_duration(timings.kill_grace),
        "min_hold": format_duration(timings.min_hold) if timings.min_hold else None,
        "start_deadline": format_duration(timings.start_deadline),
        "jitter": format_duration(timings.jitter),
        **timeout,
        **retries_record(timings),
    }


def retries_record(timings: JobTimings) -> dict[str, str | int | bool]:
    """The retry settings, only when the job retries: a lockctl from before them refuses the
    fields, and without retries the config means the same to it."""
    if not timings.retries:
        return {}
    return {
        "retries": timings.retries,
        "retry_delay": format_duration(timings.retry_delay),
        "retry_on_timeout": timings.retry_on_timeout,
    }


JOB_FIELDS = {
    "lock_key",
    "ttl",
    "lock_delay",
    "renew_interval",
    "kill_grace",
    "min_hold",
    "schedule",
    "timezone",
    "start_deadline",
    "history_limit",
    "command",
    "jitter",
    "workers",
    "timeout",
    "retries",
    "retry_delay",
    "retry_on_timeout",
    "http",
    "catchup",
    "catchup_window",
    "catchup_limit",
    "overlap",
    "notify",
    "ping_url_file",
    "blackout",
    "keys",
}


def read_job(name: str, raw: Any, allow_unsafe: bool, problems: list[str]) -> JobConfig | None:
    where = f"jobs.{name}."
    if not isinstance(raw, dict):
        problems.append(f"jobs.{name}: must be an object")
        return None
    before = len(problems)
    unknown_fields(raw, JOB_FIELDS, where, problems)
    key = read_text(raw, "lock_key", where, problems)
    ttl = _seconds(raw, "ttl", where, problems)
    delay = _seconds(raw, "lock_delay", where, problems)
    renew = _seconds(raw, "renew_interval", where, problems)
    grace = _seconds(raw, "kill_grace", where, problems)
    min_hold = _seconds(raw, "min_hold", where, problems, optional=True)
    schedule, zone = _schedule(raw, where, problems)
    deadline = _seconds(raw, "start_deadline", where, problems, default=DEFAULTS["start_deadline"])
    history_limit = _count(raw, "history_limit", where, problems)
    command = _command(raw, where, problems)
    jitter = _seconds(raw, "jitter", where, problems, default=DEFAULTS["jitter"])
    workers = _workers(raw, where, problems)
    timeout = _timeout(raw, where, problems)
    retries = _count(raw, "retries", where, problems)
    retry_delay = _seconds(raw, "retry_delay", where, problems, default=DEFAULTS["retry_delay"])
    on_timeout = _flag(raw, "retry_on_timeout", where, problems)
    http = _http(raw, where, command, timeout, problems)
    # the spec refuses it too: this catches a config edited by hand, or written before the rule
    if http is not None and on_timeout:
        problems.append(
            f"{where}retry_on_timeout: true is refused for a job with http: "
            + RETRY_ON_TIMEOUT_REFUSED
        )
    catchup = raw.get("catchup", DEFAULT_CATCHUP)
    if catchup_problem(catchup):
        problems.append(f"{where}catchup: {catchup_problem(catchup)}")
    reach = _catchup_reach(raw, where, problems)
    overlap = raw.get("overlap", DEFAULT_OVERLAP)
    if overlap_problem(overlap):
        problems.append(f"{where}overlap: {overlap_problem(overlap)}")
    notifications = _notifications(raw, where, problems)
    blackouts = _blackouts(raw, where, problems)
    keys = raw.get("keys", [])
    if "keys" in raw and keys_problem(keys):
        problems.append(f"{where}keys: {keys_problem(keys)}")
    late = None if len(problems) > before else jitter_problem(jitter, deadline)
    if late:
        problems.append(f"{where}jitter: {late}")
    if len(problems) > before:
        return None
    renew_wrong = renew_problem(renew, ttl)
    if renew_wrong:  # as the spec validator: the fencing bound is judged on a valid renewal
        problems.append(f"{where}renew_interval: {raw['renew_interval']} {renew_wrong}")
        return None
    fencing = fencing_problem(delay, renew, grace)
    if fencing and not allow_unsafe:
        problems.append(f"{where}lock_delay: {fencing}; --allow-unsafe runs anyway")
        return None
    timings = JobTimings(ttl, delay, renew, grace, min_hold, deadline, jitter, timeout)
    timings = replace(
        timings, retries=retries, retry_delay=retry_delay, retry_on_timeout=on_timeout
    )
    return JobConfig(
        name,
        key,
        timings,
        schedule,
        zone,
        history_limit,
        command,
        workers,
        http,
        catchup,
        reach,
        notifications,
        blackouts,
        overlap,
        keys=tuple(keys),
    )


def _catchup_reach(raw: dict[str, Any], where: str, problems: list[str]) -> CatchupReach:
    """The job's catchup_window and catchup_limit, checked as the spec checks them; the
    defaults when the config has none (an older lockctl's, or a job not catching up "all")."""
    window = DEFAULT_CATCHUP_REACH.window
    text = raw.get("catchup_window", format_duration(window))
    try:
        window = parse_duration(text).seconds if isinstance(text, str) else -1.0
        wrong = catchup_window_problem(window)
    except DurationSyntaxError as exc:
        wrong = str(exc)
    if wrong:
        problems.append(f'{where}catchup_window: must be a duration such as "1h": {wrong}')
    limit = raw.get("catchup_limit", DEFAULT_CATCHUP_REACH.limit)
    limit_wrong = catchup_limit_problem(limit)
    if limit_wrong:
        problems.append(f"{where}catchup_limit: {limit_wrong}")
        limit = DEFAULT_CATCHUP_REACH.limit
    return CatchupReach(window, limit)


def _blackouts(raw: dict[str, Any], where: str, problems: list[str]) -> tuple[Blackout, ...]:
    """The job's blackout windows, checked as the spec checks them; none when the config has
    none (an older lockctl's, or a job without). The schedule rules load only for a job with
    windows (`lockctl run` of a plain lock loads none)."""
    entries = raw.get("blackout", {})
    if not entries:
        return ()
    from provision.blackouts import Blackout, window_problem
    from provision.schedule import ScheduleError, parse_schedule

    shape = '{"NAME": {"schedule": "...", "duration": "...", "timezone": "..."}}'
    if not isinstance(entries, dict):
        problems.append(f"{where}blackout: must be {shape}")
        return ()
    windows = []
    for name, entry in entries.items():
        here = f"{where}blackout.{name}"
        keys = set(entry) if isinstance(entry, dict) else set()
        texts = keys == {"schedule", "duration", "timezone"} and all(
            isinstance(v, str) for v in entry.values()
        )
        if not texts:
            problems.append(f"{here}: must be {shape[9:-1]}")
            continue
        try:
            schedule = parse_schedule(entry["schedule"], entry["timezone"])
            seconds = parse_duration(entry["duration"]).seconds
        except (ScheduleError, DurationSyntaxError) as exc:
            problems.append(f"{here}: {exc}")
            continue
        problem = window_problem(seconds)
        if problem:
            problems.append(f"{here}.duration: {problem}")
            continue
        windows.append(Blackout(name, schedule, seconds))
    return tuple(windows)


def _notifications(raw: dict[str, Any], where: str, problems: list[str]) -> Notifications:
    """The job's notify blocks and ping file, checked as the spec checks them; none when the
    config has none (an older lockctl's)."""
    blocks, ping = raw.get("notify", {}), raw.get("ping_url_file")
    if not isinstance(blocks, dict):
        problems.append(f'{where}notify: must be {{"NAME": {{"url_file": "/...", "on": [...]}}}}')
        return Notifications()
    targets = []
    for name in sorted(blocks):
        block, here = blocks[name], f"{where}notify.{name}."
        if name == PING:
            problems.append(f"{here[:-1]}: {PING_TAKEN}")
            continue
        keys = set(block) if isinstance(block, dict) else set()
        if not {"url_file", "on"} <= keys <= {"url_file", "on", "repeat_after"}:
            problems.append(f'{here[:-1]}: must be {{"url_file": "/...", "on": [...]}}')
            continue
        problem = url_file_problem(block["url_file"])
        if problem:
            problems.append(f"{here}url_file: {problem}")
        wrong_on = on_problem(block["on"])
        if wrong_on:
            problems.append(f"{here}on: {wrong_on}")
        repeat = block.get("repeat_after")
        wrong_repeat = None if repeat is None else repeat_problem(repeat)
        if wrong_repeat:
            problems.append(f"{here}repeat_after: {wrong_repeat}")
        if not problem and not wrong_on and not wrong_repeat:
            on = ordered_on(block["on"])
            targets.append(NotifyTarget(name, block["url_file"], on, repeat))
    if ping is not None and (problem := url_file_problem(ping)):
        problems.append(f"{where}ping_url_file: {problem}")
        ping = None
    return Notifications(tuple(targets), ping)


def _http(
    raw: dict[str, Any],
    where: str,
    command: tuple[str, ...] | None,
    timeout: float | None,
    problems: list[str],
) -> HttpCall | None:
    """An HTTP job's call, checked as the spec checks it (system/http_call.py); its timeout is
    the job's, which it must have."""
    value = raw.get("http")
    if value is None:
        return None
    url, method = (value.get(k) if isinstance(value, dict) else None for k in ("url", "method"))
    if not isinstance(url, str) or not isinstance(method, str) or len(value) != 2:
        problems.append(f'{where}http: must be {{"url": "...", "method": "POST"}} or left out')
        return None
    problem = url_problem(url) or method_problem(method)
    if command is not None or timeout is None:
        problem = "a job with http has no command and has a timeout"
    if problem or timeout is None:
        problems.append(f"{where}http: {problem}")
        return None
    return HttpCall(url, method, timeout)


def _timeout(raw: dict[str, Any], where: str, problems: list[str]) -> float | None:
    """The job's timeout in seconds; None (no limit) when null or left out (an older lockctl)."""
    if raw.get("timeout") is None:
        return None
    return _seconds(raw, "timeout", where, problems)


def _schedule(raw: dict[str, Any], where: str, problems: list[str]) -> tuple[str | None, str]:
    """The job's schedule and timezone, checked as the spec checks them."""
    schedule, zone = raw.get("schedule"), raw.get("timezone", "UTC")
    if not isinstance(zone, str):
        problems.append(f"{where}timezone: must be a string")
        return None, "UTC"
    if schedule is None and zone == "UTC":
        return None, zone  # a plain lock's, the default: `lockctl run` loads no schedule rules
    # Here, not at the top: the schedule's rules load the timezone database and cronsim.
    from provision.schedule import ScheduleError, check_zone, parse_schedule

    try:
        check_zone(zone)
    except ScheduleError as exc:
        problems.append(f"{where}timezone: {exc}")
        return None, "UTC"
    if schedule is None:
        return None, zone
    if not isinstance(schedule, str):
        problems.append(f"{where}schedule: must be a string or null")
        return None, zone
    try:
        parse_schedule(schedule, zone)
    except ScheduleError as exc:
        problems.append(f"{where}schedule: {exc}")
    return schedule, zone


MAX_JOB_WORKERS = 1000


def _workers(raw: dict[str, Any], where: str, problems: list[str]) -> tuple[str, ...]:
    """The job's workers (the claim order is computed over them); () from an older lockctl."""
    value = raw.get("workers", [])
    if (
        not isinstance(value, list)
        or len(value) > MAX_JOB_WORKERS
        or not all(isinstance(v, str) and v and len(v) <= 128 for v in value)
    ):
        problems.append(f"{where}workers: must be a list of up to {MAX_JOB_WORKERS} worker names")
        return ()
    return tuple(value)


def _command(raw: dict[str, Any], where: str, problems: list[str]) -> tuple[str, ...] | None:
    """The job's argv, or None when it has none (a config from before the field, or a job run
    only by hand). Checked for what exec needs; the spec checked the rest (absolute, printable)."""
    value = raw.get("command")
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        problems.append(
            f'{where}command: must be a non-empty list of strings, like ["/bin/x"], or null'
        )
        return None
    problem = _argv_problem(value)
    if problem:
        problems.append(f"{where}command: {problem}")
        return None
    return tuple(value)


def _argv_problem(argv: list[str]) -> str | None:
    if len(argv) > MAX_COMMAND_ARGS:
        return f"has {len(argv)} arguments, at most {MAX_COMMAND_ARGS} allowed"
    if not argv[0]:
        return "the program (its first item) must not be empty"
    for number, argument in enumerate(argv):
        if len(argument) > MAX_ARGUMENT:
            return f"item {number} is longer than {MAX_ARGUMENT} characters"
        if "\0" in argument:
            return f"item {number} contains a NUL character (exec cannot pass it)"
        try:
            os.fsencode(argument)
        except UnicodeEncodeError:  # a lone surrogate such as "\ud800" from a JSON escape
            return f"item {number} is not valid text (a lone surrogate)"
    return None


def unknown_fields(raw: dict[str, Any], known: set[str], where: str, problems: list[str]) -> None:
    for field in sorted(set(raw) - known):
        problems.append(f"{where}{field}: unknown field (known: {', '.join(sorted(known))})")


def read_text(raw: dict[str, Any], field: str, where: str, problems: list[str]) -> str:
    value = raw.get(field)
    if not isinstance(value, str) or not value:
        problems.append(f"{where}{field}: must be a non-empty string")
        return ""
    return value


def _seconds(
    raw: dict[str, Any],
    field: str,
    where: str,
    problems: list[str],
    *,
    optional: bool = False,
    default: str | None = None,
) -> float:
    """The field's duration in seconds; a missing field is 0 when `optional`, `default` if given."""
    value = raw.get(field)
    if value is None and optional:
        return 0.0
    if field not in raw and default is not None:
        value = default
    if not isinstance(value, str):
        problems.append(f'{where}{field}: must be a duration string such as "15s"')
        return 0.0
    try:
        seconds = parse_duration(value).seconds
    except DurationSyntaxError as exc:
        problems.append(f"{where}{field}: {exc}")
        return 0.0
    outside = bound_problem(field, seconds)
    if outside:
        problems.append(f"{where}{field}: {value} {outside}")
    return seconds


def _flag(raw: dict[str, Any], field: str, where: str, problems: list[str]) -> bool:
    """The field's true or false, its default when missing (a config from an older lockctl)."""
    value = raw.get(field, FLAG_DEFAULTS[field])
    if not isinstance(value, bool):
        problems.append(f"{where}{field}: must be true or false")
        return FLAG_DEFAULTS[field]
    return value


def _count(raw: dict[str, Any], field: str, where: str, problems: list[str]) -> int:
    """The field's whole number, its default when missing (a config from an older lockctl)."""
    value = raw.get(field, COUNT_DEFAULTS[field])
    problem = count_problem(field, value)
    if problem:
        problems.append(f"{where}{field}: {problem}")
        return COUNT_DEFAULTS[field]
    return int(value)
