"""The worker config format (lockctl.json): built from the spec here, and loaded and validated here.

The file names the agent to talk to, the token FILE (the secret stays in its 0600 file), the
TLS files when the agent speaks HTTPS (the CA and the worker's client certificate pair), and per
job the lock key, timings, schedule, tick-ledger settings and the command `lockctl schedule`
runs. Loading checks timings and counts with the same functions as the spec validator
(provision.timings), plus the fencing bound, and reports every problem at once as
`FILE: path.to.field: message`. A field added after format 1 (timezone, start_deadline,
history_limit, command, timeout) gets its default when an older lockctl left it out. This module
imports no spec parser: `lockctl run` loads it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from provision.durations import DurationSyntaxError, format_duration, parse_duration
from provision.errors import InputError
from provision.schedule import ScheduleError, check_zone, parse_schedule
from provision.system.files import UnreadableFile, read_regular_file
from provision.timings import (
    COUNT_DEFAULTS,
    DEFAULTS,
    JobTimings,
    bound_problem,
    count_problem,
    fencing_problem,
    jitter_problem,
    renew_problem,
)

if TYPE_CHECKING:
    from provision.spec import Job, Spec

CONFIG_FORMAT = 1
CONFIG_NAME = "lockctl.json"
MAX_CONFIG_BYTES = 1024 * 1024
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


@dataclass(frozen=True)
class WorkerTLS:
    """The TLS files a worker's lockctl uses to reach its agent, as paths on the worker."""

    ca_file: Path | None = None  # None: the system's CA bundle (or CONSUL_CACERT)
    cert_file: Path | None = None  # the client certificate (verify_incoming); with key_file
    key_file: Path | None = None

    @classmethod
    def in_folder(cls, folder: Path, worker: str) -> WorkerTLS:
        """The names `worker-config --tls-dir` gives them (docs/cluster.md, TLS)."""
        return cls(folder / "ca.pem", folder / f"{worker}.pem", folder / f"{worker}-key.pem")

    def record(self) -> dict[str, str]:
        fields = {"ca_file": self.ca_file, "cert_file": self.cert_file, "key_file": self.key_file}
        return {name: str(path) for name, path in fields.items() if path is not None}


@dataclass(frozen=True)
class WorkerConfig:
    path: Path
    worker: str  # the Consul node name of the local agent
    address: str  # that agent's HTTP address
    token_file: Path
    jobs: tuple[JobConfig, ...]
    tls: WorkerTLS = WorkerTLS()

    def connection(self) -> dict[str, Any]:
        """The arguments of `provision.consul.resolve_settings` for this worker's agent: what the
        config names wins over Consul's environment variables, as a flag would."""
        return {
            "address": self.address,
            "token_file": self.token_file,
            "ca_cert": self.tls.ca_file,
            "client_cert": self.tls.cert_file,
            "client_key": self.tls.key_file,
            "given_by": {
                "token_file": f"{self.path}: consul.token_file",
                "ca_cert": f"{self.path}: consul.ca_file",
                "client_cert": f"{self.path}: consul.cert_file",
                "client_key": f"{self.path}: consul.key_file",
            },
        }

    def job(self, name: str) -> JobConfig:
        for job in self.jobs:
            if job.name == name:
                return job
        known = ", ".join(j.name for j in self.jobs) or "none"
        raise InputError(f"{self.path}: no job {name!r} in this worker's config (jobs: {known})")


class ConfigError(InputError):
    """A worker config with problems; `lines` lists each as `FILE: field: message`.

    One problem is the message itself. With several, the message is a count and `problems` (which
    the CLI's error boundary prints, one a line, before the message) lists them; with one it is
    empty, so the runner's log gets one line, not the same line twice.
    """

    def __init__(self, path: Path, problems: list[str]) -> None:
        self.lines = [f"{path}: {p}" for p in problems]
        self.problems = self.lines if len(self.lines) > 1 else []
        count = f"{len(problems)} problems"
        super().__init__(self.lines[0] if len(problems) == 1 else f"{path}: {count}")


def config_record(
    spec: Spec, worker: str, token_file: Path, tls: WorkerTLS = WorkerTLS()
) -> dict[str, Any]:
    """The runner's config for one worker, as the JSON object written to lockctl.json."""
    jobs = {job.name: _job_record(job) for job in spec.jobs_for(worker)}
    consul = {"address": spec.worker(worker).address, "token_file": str(token_file)}
    return {
        "format": CONFIG_FORMAT,
        "worker": worker,
        "consul": {**consul, **tls.record()},
        "jobs": jobs,
    }


def _job_record(job: Job) -> dict[str, Any]:
    return {
        "lock_key": job.lock_key,
        **timings_record(job.timings),
        "schedule": job.schedule,
        "timezone": job.timezone,
        "history_limit": job.history_limit,
        "command": list(job.command) if job.command else None,
        "workers": list(job.workers),
    }


def timings_record(timings: JobTimings) -> dict[str, str | None]:
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
    }


def load_worker_config(path: Path, *, allow_unsafe: bool = False) -> WorkerConfig:
    """Read and validate a worker config; `allow_unsafe` skips only the fencing-bound check."""
    try:
        data = read_regular_file(path, MAX_CONFIG_BYTES)
    except UnreadableFile as exc:
        raise InputError(f"{path}: cannot read worker config: {exc}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise InputError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes")
    try:
        raw = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:  # ValueError: an int of over 4300 digits
        where = f":{exc.lineno}" if isinstance(exc, json.JSONDecodeError) else ""
        raise InputError(f"{path}{where}: not a JSON worker config ({exc})") from None
    except RecursionError:  # json's decoder recurses per nested list or object
        raise InputError(f"{path}: not a worker config: nested too deep") from None
    return _build(path, raw, allow_unsafe)


def _build(path: Path, raw: Any, allow_unsafe: bool) -> WorkerConfig:
    problems: list[str] = []
    if not isinstance(raw, dict):
        raise ConfigError(path, ["top level must be an object"])
    _unknown(raw, {"format", "worker", "consul", "jobs"}, "", problems)
    if type(raw.get("format")) is not int or raw["format"] != CONFIG_FORMAT:  # not True, not 1.0
        problems.append(f"format: must be {CONFIG_FORMAT} (this lockctl reads format 1)")
    worker = _text(raw, "worker", "", problems)
    consul: dict[str, Any] = {}
    if isinstance(raw.get("consul"), dict):
        consul = raw["consul"]
    else:
        problems.append("consul: must be an object with address and token_file")
    _unknown(consul, {"address", "token_file", *TLS_FIELDS}, "consul.", problems)
    address = _text(consul, "address", "consul.", problems)
    token_file = _text(consul, "token_file", "consul.", problems)
    tls = _tls(consul, address, problems)
    jobs_raw = raw.get("jobs")
    jobs: list[JobConfig] = []
    if not isinstance(jobs_raw, dict) or not jobs_raw:
        problems.append("jobs: must be a non-empty object of job name -> settings")
    else:
        for name in sorted(jobs_raw):
            job = _job(name, jobs_raw[name], allow_unsafe, problems)
            if job is not None:
                jobs.append(job)
    if problems:
        raise ConfigError(path, problems)
    return WorkerConfig(path, worker, address, Path(token_file), tuple(jobs), tls)


TLS_FIELDS = ("ca_file", "cert_file", "key_file")


def _tls(consul: dict[str, Any], address: str, problems: list[str]) -> WorkerTLS:
    """The optional TLS files: absolute paths, the client pair both or neither, only with an
    https:// address (over plain HTTP they would be ignored, and the token sent in clear)."""
    paths: dict[str, Path | None] = {}
    for field in TLS_FIELDS:
        value = consul.get(field)
        paths[field] = None
        if value is None:
            continue
        if not isinstance(value, str) or not value.startswith("/"):
            problems.append(f"consul.{field}: must be an absolute path (a file on this worker)")
            continue
        paths[field] = Path(value)
    if (paths["cert_file"] is None) != (paths["key_file"] is None):
        problems.append(
            "consul.cert_file and consul.key_file: give both (the client pair) or neither"
        )
    given = [field for field in TLS_FIELDS if field in consul]
    if given and address and not address.startswith("https://"):
        problems.append(f"consul.{given[0]}: given, but consul.address {address!r} is not https://")
    return WorkerTLS(paths["ca_file"], paths["cert_file"], paths["key_file"])


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
}


def _job(name: str, raw: Any, allow_unsafe: bool, problems: list[str]) -> JobConfig | None:
    where = f"jobs.{name}."
    if not isinstance(raw, dict):
        problems.append(f"jobs.{name}: must be an object")
        return None
    before = len(problems)
    _unknown(raw, JOB_FIELDS, where, problems)
    key = _text(raw, "lock_key", where, problems)
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
    return JobConfig(name, key, timings, schedule, zone, history_limit, command, workers)


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


def _unknown(raw: dict[str, Any], known: set[str], where: str, problems: list[str]) -> None:
    for field in sorted(set(raw) - known):
        problems.append(f"{where}{field}: unknown field (known: {', '.join(sorted(known))})")


def _text(raw: dict[str, Any], field: str, where: str, problems: list[str]) -> str:
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


def _count(raw: dict[str, Any], field: str, where: str, problems: list[str]) -> int:
    """The field's whole number, its default when missing (a config from an older lockctl)."""
    value = raw.get(field, COUNT_DEFAULTS[field])
    problem = count_problem(field, value)
    if problem:
        problems.append(f"{where}{field}: {problem}")
        return COUNT_DEFAULTS[field]
    return int(value)
