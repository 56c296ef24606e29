"""`lockctl worker-config`: each worker's files, rendered from the spec and templates.

Per worker, in `<out>/<worker>/`: `lockctl.json` (the runner's config: agent address, token FILE
path, per-job lock key and timings), `lockctl.env` (the same for containers) and, for each job
with a schedule and a command, a systemd service and timer that run `lockctl run`. The secret
itself is never in these files; they name the 0600 token file that `lockctl apply` wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provision.errors import InputError
from provision.spec import Spec
from provision.system.files import PUBLIC_MODE, write_atomically
from provision.system.templates import make_environment, render_template
from provision.workers.config import CONFIG_NAME, config_record, load_worker_config

ENV_NAME = "lockctl.env"


@dataclass(frozen=True)
class Placement:
    """Where things are ON THE WORKER (may differ from where the files are written here)."""

    config_dir: Path | None  # None: the output folder itself (running on this machine)
    token_dir: Path
    lockctl: str  # the lockctl program the systemd units run


@dataclass(frozen=True)
class WorkerFiles:
    worker: str
    files: tuple[Path, ...]
    jobs_without_unit: tuple[str, ...]  # no schedule or no command: no systemd unit


def write_worker_files(
    spec: Spec, workers: list[str], out_dir: Path, templates_dir: Path, placement: Placement
) -> list[WorkerFiles]:
    """Render and write every named worker's files; all are rendered before any is written."""
    unknown = [name for name in workers if name not in {w.name for w in spec.workers}]
    if unknown:
        known = ", ".join(w.name for w in spec.workers)
        raise InputError(f"--worker {unknown[0]}: not a worker in {spec.path} (workers: {known})")
    env = make_environment(templates_dir)
    rendered = {name: _render_worker(spec, name, out_dir, env, placement) for name in workers}
    results = []
    for name, (files, skipped) in rendered.items():
        written = [_write(out_dir / name / relative, text) for relative, text in files.items()]
        load_worker_config(out_dir / name / CONFIG_NAME)  # what we wrote must load cleanly
        results.append(WorkerFiles(name, tuple(written), skipped))
    return results


def _render_worker(
    spec: Spec, worker: str, out_dir: Path, env: Any, placement: Placement
) -> tuple[dict[str, str], tuple[str, ...]]:
    config_dir = placement.config_dir or (out_dir / worker).absolute()
    token_file = placement.token_dir / f"{worker}.token"
    config_path = config_dir / CONFIG_NAME
    context = {
        "worker": worker,
        "config": config_record(spec, worker, token_file),
        "config_path": str(config_path),
        "address": spec.worker(worker).address,
        "token_file": str(token_file),
    }
    files = {
        CONFIG_NAME: render_template(env, "worker/lockctl.json.j2", context),
        ENV_NAME: render_template(env, "worker/lockctl.env.j2", context),
    }
    skipped = []
    for job in spec.jobs_for(worker):
        if not (job.schedule and job.command):
            skipped.append(job.name)
            continue
        argv = [
            placement.lockctl,
            "run",
            "--config",
            str(config_path),
            "--job",
            job.name,
            "--",
            *job.command,
        ]
        unit = {
            **context,
            "job": job,
            "exec_start": " ".join(systemd_quote(a) for a in argv),
            "stop_timeout": int(job.kill_grace.seconds) + 10,
        }
        files[f"systemd/lockctl-{job.name}.service"] = render_template(
            env, "worker/lockctl-job.service.j2", unit
        )
        files[f"systemd/lockctl-{job.name}.timer"] = render_template(
            env, "worker/lockctl-job.timer.j2", unit
        )
    return files, tuple(skipped)


def systemd_quote(argument: str) -> str:
    """Quote one ExecStart= argument: systemd's own quoting, with % and $ made literal.

    Control characters (the spec refuses them; this is the last line of defence against a
    newline that would start a new directive) become C escapes, which systemd decodes.
    """
    escaped = argument.replace("\\", "\\\\").replace('"', '\\"')
    escaped = escaped.replace("%", "%%").replace("$", "$$")
    escaped = "".join(f"\\x{ord(c):02x}" if ord(c) < 0x20 or ord(c) == 0x7F else c for c in escaped)
    return f'"{escaped}"'


def _write(path: Path, text: str) -> Path:
    """Atomic write (mode 0644: these files hold no secret)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomically(path, text, mode=PUBLIC_MODE)
