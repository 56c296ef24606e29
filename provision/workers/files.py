"""`lockctl worker-config`: each worker's files, rendered from the spec and templates.

Per worker, in `<out>/<worker>/`: `lockctl.json` (the runner's config: agent address, token FILE
path, per-job lock key and timings), `lockctl.env` (the same for containers) and, for each job
with a schedule and a command, a systemd service and timer that run `lockctl run`; and, when
there is at least one such job, `lockctl-scheduler.service`, which runs `lockctl schedule` for
all of them (the alternative to the timers: one or the other, never both). The secret itself is
never in these files; they name the 0600 token file that `lockctl apply` wrote.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provision.consul.settings import DEFAULT_TIMEOUT
from provision.errors import InputError
from provision.schedule import ScheduleError, parse_schedule
from provision.spec import Job, Spec
from provision.system.files import PUBLIC_MODE, write_all_or_none
from provision.system.templates import make_environment, render_template
from provision.workers.config import (
    CONFIG_NAME,
    ConfigError,
    WorkerTLS,
    config_record,
    load_worker_config,
)

ENV_NAME = "lockctl.env"
# Where a Kubernetes pod's projected service-account token is mounted by convention
# (a volume at /var/run/secrets/tokens, path `consul`): --bearer-token-file changes it
DEFAULT_BEARER_TOKEN_FILE = Path("/var/run/secrets/tokens/consul")
SCHEDULER_UNIT = "lockctl-scheduler.service"
# After the longest kill grace, the stopping scheduler still writes to Consul: the tick records
# of the jobs it stopped (releasing their locks), then the destroy of every session. Each call is
# bounded by the client timeout (retries included); the margin allows one for each of the steps.
SCHEDULER_STOP_MARGIN = 2 * int(DEFAULT_TIMEOUT)


@dataclass(frozen=True)
class Placement:
    """Where things are ON THE WORKER (may differ from where the files are written here)."""

    config_dir: Path | None  # None: the output folder itself (running on this machine)
    token_dir: Path
    lockctl: str  # the lockctl program the systemd units run
    tls_dir: Path | None = None  # ca.pem, <worker>.pem, <worker>-key.pem; None: no TLS files
    # the JWT a worker with an `identity` in the spec logs in with (docs/identity.md)
    bearer_token_file: Path = DEFAULT_BEARER_TOKEN_FILE


@dataclass(frozen=True)
class WorkerFiles:
    worker: str
    files: tuple[Path, ...]
    jobs_without_unit: tuple[str, ...]  # no schedule or no command: no systemd unit


def write_worker_files(
    spec: Spec, workers: list[str], out_dir: Path, templates_dir: Path, placement: Placement
) -> list[WorkerFiles]:
    """Render, check and write every named worker's files: all of them, or none.

    The flag values that end up in the files are checked first; then every file is rendered,
    written to a staging folder in `out_dir`, and each lockctl.json loaded back as the runner
    will; only when all of that passed are the files renamed into place.
    """
    unknown = [name for name in workers if name not in {w.name for w in spec.workers}]
    if unknown:
        known = ", ".join(w.name for w in spec.workers)
        raise InputError(f"--worker {unknown[0]}: not a worker in {spec.path} (workers: {known})")
    idle = [name for name in workers if not spec.jobs_for(name)]
    if idle:
        raise InputError(
            f"worker {idle[0]} runs no job in {spec.path}: it has nothing to configure "
            "(name it in a job's workers, or choose the workers with --worker)"
        )
    _check_placement(placement, out_dir)
    _check_tls_addresses(spec, workers, placement)
    env = make_environment(templates_dir)
    rendered = {name: _render_worker(spec, name, out_dir, env, placement) for name in workers}
    files = {
        Path(name) / relative: text
        for name, (texts, _) in rendered.items()
        for relative, text in texts.items()
    }
    try:
        write_all_or_none(
            out_dir, files, mode=PUBLIC_MODE, check=lambda staged: _check_configs(staged, workers)
        )
    except OSError as exc:
        raise InputError(
            f"--out {out_dir}: cannot write the worker files: {_reason(exc)}"
        ) from None
    return [
        WorkerFiles(name, tuple(out_dir / name / relative for relative in texts), skipped)
        for name, (texts, skipped) in rendered.items()
    ]


def _check_configs(staged: Path, workers: list[str]) -> None:
    """Each staged lockctl.json loads cleanly, as the runner will load it; problems name the
    file where it would have been written, not the staging folder."""
    for name in workers:
        path = staged / name / CONFIG_NAME
        try:
            load_worker_config(path)
        except ConfigError as exc:
            shown_at = staged.parent / name / CONFIG_NAME  # staged is in the output folder
            raise ConfigError(
                shown_at, [line.removeprefix(f"{path}: ") for line in exc.lines]
            ) from None


def _reason(exc: OSError) -> str:
    where = f" ({exc.filename})" if exc.filename else ""
    return f"{exc.strerror or exc}{where}"


# --- flag values that are written into the files ---------------------------------------------

MAX_PATH = 4096  # PATH_MAX on Linux


def _check_placement(placement: Placement, out_dir: Path) -> None:
    """Every path a flag puts into a file must be absolute and one printable line: a newline
    would add lines to lockctl.env or a unit; a relative path means nothing on the worker."""
    config_dir = placement.config_dir
    paths = [
        ("--secrets-dir", str(placement.token_dir)),
        ("--config-dir", str(config_dir)) if config_dir else ("--out", str(out_dir.absolute())),
    ]
    if placement.tls_dir is not None:
        paths.append(("--tls-dir", str(placement.tls_dir)))
    paths.append(("--bearer-token-file", str(placement.bearer_token_file)))
    for flag, value in paths:
        _check_path(flag, value)
    _check_program(placement.lockctl)


def _check_tls_addresses(spec: Spec, workers: list[str], placement: Placement) -> None:
    """TLS files for an agent that speaks plain HTTP would be ignored, and the token sent in
    clear: refused, naming the spec line to change."""
    if placement.tls_dir is None:
        return
    for name in workers:
        worker = spec.worker(name)
        if not worker.address.startswith("https://"):
            raise InputError(
                f"--tls-dir: {spec.path}:{worker.line}: worker {name}'s address "
                f"{worker.address} is plain HTTP; give its agent's https:// address"
            )


def _check_program(program: str) -> None:
    """What systemd takes as ExecStart='s program: an absolute, normalised path, or a bare name
    (which systemd looks up in its own fixed search path)."""
    _check_line("--lockctl", program)
    if "/" not in program and program not in ("", ".", ".."):
        return
    if not program.startswith("/"):
        raise InputError(
            f"--lockctl {program!r}: must be an absolute path or a bare program name "
            "(systemd's ExecStart= takes no other)"
        )
    if os.path.normpath(program) != program:
        raise InputError(
            f"--lockctl {program!r}: must be a normalised path (no '.', '..', '//' or trailing "
            "'/'): systemd refuses any other ExecStart= program"
        )


def _check_path(flag: str, value: str) -> None:
    _check_line(flag, value)
    if not value.startswith("/"):
        raise InputError(
            f"{flag} {value!r}: must be an absolute path (it names a place on the worker)"
        )


def _check_line(flag: str, value: str) -> None:
    if not value.isprintable():
        raise InputError(f"{flag} {value!r}: must not contain control characters (one line)")
    if len(value) > MAX_PATH:
        raise InputError(f"{flag}: must be at most {MAX_PATH} characters")


def _render_worker(
    spec: Spec, worker: str, out_dir: Path, env: Any, placement: Placement
) -> tuple[dict[str, str], tuple[str, ...]]:
    config_dir = placement.config_dir or (out_dir / worker).absolute()
    token_file = placement.token_dir / f"{worker}.token"
    tls = WorkerTLS.in_folder(placement.tls_dir, worker) if placement.tls_dir else WorkerTLS()
    config_path = config_dir / CONFIG_NAME
    identity = spec.worker(worker).identity  # set: the worker logs in, no token file
    bearer = placement.bearer_token_file
    context = {
        "worker": worker,
        "config": config_record(spec, worker, token_file, tls, bearer),
        "config_path": str(config_path),
        "address": spec.worker(worker).address,
        "token_file": str(token_file),
        "tls": tls,
        "login": {"auth_method": identity.auth_method, "bearer_token_file": str(bearer)}
        if identity is not None
        else None,
    }
    files = {
        CONFIG_NAME: render_template(env, "worker/lockctl.json.j2", context),
        ENV_NAME: render_template(env, "worker/lockctl.env.j2", context),
    }
    skipped: list[str] = []
    scheduled: list[Job] = []  # a schedule and a command: `lockctl schedule` runs them
    for job in spec.jobs_for(worker):
        if not (job.schedule and job.command):
            skipped.append(job.name)
            continue
        scheduled.append(job)
        argv = [placement.lockctl, "run", "--config", str(config_path), "--job", job.name]
        # a keyed job's ticks are its keys': a timer of its own for each (`lockctl-JOB@KEY`:
        # no `@` in a name or a key, so no two jobs' units share a name)
        named: list[tuple[str | None, str]] = [(k, f"{job.name}@{k}") for k in job.keys]
        for key, name in named or [(None, job.name)]:
            keyed = argv if key is None else [*argv, "--key", key]
            unit = {
                **context,
                "job": job,
                "key": key,
                "exec_start": " ".join(systemd_quote(a) for a in [*keyed, "--", *job.command]),
                "stop_timeout": int(job.timings.kill_grace) + 10,
                "on_calendar": timer_calendar(job.schedule, job.timezone),
            }
            files[f"systemd/lockctl-{name}.service"] = render_template(
                env, "worker/lockctl-job.service.j2", unit
            )
            files[f"systemd/lockctl-{name}.timer"] = render_template(
                env, "worker/lockctl-job.timer.j2", unit
            )
    if scheduled:
        files[f"systemd/{SCHEDULER_UNIT}"] = _scheduler_unit(env, context, scheduled, placement)
    return files, tuple(skipped)


def _scheduler_unit(
    env: Any, context: dict[str, Any], scheduled: list[Job], placement: Placement
) -> str:
    """The unit of `lockctl schedule`: stopped within the longest kill grace plus the margin."""
    clash = [job.name for job in scheduled if f"lockctl-{job.name}.service" == SCHEDULER_UNIT]
    if clash:
        raise InputError(
            f'job "{clash[0]}": its unit would be {SCHEDULER_UNIT}, the name of the scheduler\'s'
            " own unit; rename the job"
        )
    longest = max(scheduled, key=lambda job: job.timings.kill_grace)
    argv = [placement.lockctl, "schedule", "--config", context["config_path"]]
    unit = {
        **context,
        "jobs": [job.name for job in scheduled],
        "exec_start": " ".join(systemd_quote(a) for a in argv),
        "longest_grace_job": longest.name,
        "longest_grace": math.ceil(longest.timings.kill_grace),
        "stop_margin": SCHEDULER_STOP_MARGIN,
        "client_timeout": int(DEFAULT_TIMEOUT),
        "stop_timeout": math.ceil(longest.timings.kill_grace) + SCHEDULER_STOP_MARGIN,
    }
    return render_template(env, "worker/lockctl-scheduler.service.j2", unit)


def timer_calendar(schedule: str, zone: str) -> list[str]:
    """The timer's OnCalendar= values for a validated schedule (docs/schedules.md)."""
    try:
        lines = parse_schedule(schedule, zone).on_calendar()
    except ScheduleError as exc:  # the spec refuses these; a Spec built by hand may not
        raise InputError(f"schedule {schedule!r}: {exc}") from None
    # The spec refuses '%'; doubled here as well, as systemd expands specifiers there.
    return [line.replace("%", "%%") for line in lines]


def systemd_quote(argument: str) -> str:
    """Quote one ExecStart= argument: systemd's own quoting, with % and $ made literal.

    Control characters (the spec refuses them; this is the last line of defence against a
    newline that would start a new directive) become C escapes, which systemd decodes.
    """
    escaped = argument.replace("\\", "\\\\").replace('"', '\\"')
    escaped = escaped.replace("%", "%%").replace("$", "$$")
    escaped = "".join(f"\\x{ord(c):02x}" if ord(c) < 0x20 or ord(c) == 0x7F else c for c in escaped)
    return f'"{escaped}"'
