"""The worker config format (lockctl.json): built from the spec here, and loaded and validated here.

The file names the agent to talk to, the token FILE (the secret stays in its 0600 file), the
TLS files when the agent speaks HTTPS (the CA and the worker's client certificate pair), and per
job the lock key, timings, schedule, tick-ledger settings and the command `lockctl schedule`
runs (one job's entry: provision.workers.job_config). Loading checks timings and counts with
the same functions as the spec validator (provision.timings), plus the fencing bound, and
reports every problem at once as `FILE: path.to.field: message`. A field added after format 1
(timezone, start_deadline, history_limit, command, timeout) gets its default when an older
lockctl left it out. This module imports no spec parser: `lockctl run` loads it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from provision.consul.settings import GivenSettings
from provision.errors import InputError
from provision.system.files import UnreadableFile, read_regular_file

# JobConfig and JobTimings are re-exported: the runner, the scheduler and the CLI take them here.
from provision.timings import JobTimings as JobTimings
from provision.timings import capacity_problem
from provision.workers.job_config import JobConfig as JobConfig
from provision.workers.job_config import job_record, read_job, read_text, unknown_fields

if TYPE_CHECKING:
    from provision.spec import Spec

CONFIG_FORMAT = 1
CONFIG_NAME = "lockctl.json"
# written only when the spec's worker sets it: a lockctl from before the field refuses it
CAPACITY_FIELD = "max_concurrent_runs"
MAX_CONFIG_BYTES = 1024 * 1024


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
class WorkerLogin:
    """`consul.login`: log in through `auth_method` with the JWT the platform keeps in
    `bearer_token_file` (docs/identity.md), instead of reading a token file."""

    auth_method: str
    bearer_token_file: Path

    def record(self) -> dict[str, str]:
        return {"auth_method": self.auth_method, "bearer_token_file": str(self.bearer_token_file)}


# Consul's own token variables: a worker that logs in must not send one of them instead
TOKEN_ENV = ("CONSUL_HTTP_TOKEN", "CONSUL_HTTP_TOKEN_FILE")


@dataclass(frozen=True)
class WorkerConfig:
    path: Path
    worker: str  # the Consul node name of the local agent
    address: str  # that agent's HTTP address
    token_file: Path | None  # None: the worker logs in (`login`)
    jobs: tuple[JobConfig, ...]
    tls: WorkerTLS = WorkerTLS()
    login: WorkerLogin | None = None
    # no local agent (a pod): `address` is a server's; lockctl registers `worker` as a catalog
    # node and makes TTL-only sessions on it (provision/sessions.py)
    agentless: bool = False
    max_concurrent_runs: int | None = None  # the scheduler's cap of runs at once; None: none

    def connection(self) -> dict[str, Any]:
        """The arguments of `provision.consul.resolve_settings` for this worker's agent: what the
        config names (`given`) wins over Consul's environment variables, as a flag would. A
        worker that logs in starts with no token (Consul's token variables are not read for
        it: `env` leaves them out)."""
        given = GivenSettings(
            address=self.address,
            token_file=self.token_file,
            ca_cert=self.tls.ca_file,
            client_cert=self.tls.cert_file,
            client_key=self.tls.key_file,
            bearer_token_file=None if self.login is None else self.login.bearer_token_file,
            given_by=(
                ("token_file", f"{self.path}: consul.token_file"),
                ("ca_cert", f"{self.path}: consul.ca_file"),
                ("client_cert", f"{self.path}: consul.cert_file"),
                ("client_key", f"{self.path}: consul.key_file"),
            ),
        )
        if self.login is None:
            return {"given": given}
        return {"given": given, "env": {k: v for k, v in os.environ.items() if k not in TOKEN_ENV}}

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
    spec: Spec,
    worker: str,
    token_file: Path,
    tls: WorkerTLS = WorkerTLS(),
    bearer_token_file: Path | None = None,
) -> dict[str, Any]:
    """The runner's config for one worker, as the JSON object written to lockctl.json: a worker
    with an `identity` in the spec logs in with the JWT in `bearer_token_file` (when given)
    instead of naming a token file."""
    jobs = {job.name: job_record(job) for job in spec.jobs_for(worker)}
    identity = spec.worker(worker).identity
    credential: dict[str, Any] = {"token_file": str(token_file)}
    if identity is not None and bearer_token_file is not None:
        credential = {"login": WorkerLogin(identity.auth_method, bearer_token_file).record()}
    consul = {"address": spec.worker(worker).address, **credential}
    # only when set: a lockctl from before the field refuses it, and the files of workers with
    # an agent stay as they were
    agentless = {"agentless": True} if spec.worker(worker).agentless else {}
    cap = spec.worker(worker).max_concurrent_runs
    capacity = {} if cap is None else {CAPACITY_FIELD: cap}
    return {
        "format": CONFIG_FORMAT,
        "worker": worker,
        **agentless,
        **capacity,
        "consul": {**consul, **tls.record()},
        "jobs": jobs,
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
    known = {"format", "worker", "agentless", CAPACITY_FIELD, "consul", "jobs"}
    unknown_fields(raw, known, "", problems)
    if type(raw.get("format")) is not int or raw["format"] != CONFIG_FORMAT:  # not True, not 1.0
        problems.append(f"format: must be {CONFIG_FORMAT} (this lockctl reads format 1)")
    worker = read_text(raw, "worker", "", problems)
    agentless = raw.get("agentless", False)
    if type(agentless) is not bool:
        problems.append("agentless: must be true or false")
    capacity = raw.get(CAPACITY_FIELD)
    if capacity is not None and (problem := capacity_problem(capacity)) is not None:
        problems.append(f"{CAPACITY_FIELD}: {problem}")
    consul: dict[str, Any] = {}
    if isinstance(raw.get("consul"), dict):
        consul = raw["consul"]
    else:
        problems.append("consul: must be an object with address and token_file")
    unknown_fields(consul, {"address", "token_file", "login", *TLS_FIELDS}, "consul.", problems)
    address = read_text(consul, "address", "consul.", problems)
    login = _login(consul, problems)
    token_file = None if login else read_text(consul, "token_file", "consul.", problems)
    tls = _tls(consul, address, problems)
    jobs_raw = raw.get("jobs")
    jobs: list[JobConfig] = []
    if not isinstance(jobs_raw, dict) or not jobs_raw:
        problems.append("jobs: must be a non-empty object of job name -> settings")
    else:
        for name in sorted(jobs_raw):
            job = read_job(name, jobs_raw[name], allow_unsafe, problems)
            if job is not None:
                jobs.append(job)
    if problems:
        raise ConfigError(path, problems)
    token_path = None if token_file is None else Path(token_file)
    return WorkerConfig(
        path,
        worker,
        address,
        token_path,
        tuple(jobs),
        tls,
        login,
        agentless=agentless,
        max_concurrent_runs=capacity,
    )


_METHOD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def _login(consul: dict[str, Any], problems: list[str]) -> WorkerLogin | None:
    """`consul.login` (docs/identity.md): the auth method and an absolute bearer-token file;
    it takes the token file's place, so the two are never given together."""
    raw = consul.get("login")
    if raw is None:
        return None
    if "token_file" in consul:
        problems.append("consul.login: give token_file or login, not both")
    if not isinstance(raw, dict):
        problems.append("consul.login: must be an object with auth_method and bearer_token_file")
        return None
    unknown_fields(raw, {"auth_method", "bearer_token_file"}, "consul.login.", problems)
    method = read_text(raw, "auth_method", "consul.login.", problems)
    bearer = read_text(raw, "bearer_token_file", "consul.login.", problems)
    if method and not _METHOD_NAME.fullmatch(method):
        problems.append(f"consul.login.auth_method: {method[:80]!r} is not an auth method name")
    if bearer and not bearer.startswith("/"):
        problems.append("consul.login.bearer_token_file: must be an absolute path")
    return WorkerLogin(method, Path(bearer))


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
