"""`lockctl worker-config`, `lockctl run` and `lockctl status`.

`run` is started by every worker on every tick, so its imports are lazy: it loads the runner and
the Consul client, not the spec parser, Jinja or rich.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from provision.cli.options import Address, TokenFile, consul_settings
from provision.cli.output import console
from provision.errors import InputError

DEFAULT_SPEC = Path("policies/locks.hcl")
SpecFile = Annotated[Path, typer.Option("--spec", envvar="LOCKCTL_SPEC", help="The lock spec.")]


def worker_config(
    out: Annotated[Path, typer.Option("--out", help="Folder: one sub-folder per worker.")],
    worker: Annotated[
        list[str] | None, typer.Option("--worker", "-w", help="A worker (repeatable).")
    ] = None,
    all_workers: Annotated[bool, typer.Option("--all", help="Every worker in the spec.")] = False,
    spec_file: SpecFile = DEFAULT_SPEC,
    token_dir: Annotated[
        Path,
        typer.Option("--token-dir", help="Where the worker finds <worker>.token (on the worker)."),
    ] = Path(".lockctl/secrets"),
    config_dir: Annotated[
        Path | None,
        typer.Option(
            "--config-dir",
            help="Where lockctl.json lives on the worker [default: the output folder itself].",
        ),
    ] = None,
    lockctl_bin: Annotated[
        str, typer.Option("--lockctl", help="The lockctl program the systemd units run.")
    ] = "/usr/local/bin/lockctl",
    templates_dir: Annotated[Path | None, typer.Option("--templates-dir")] = None,
) -> None:
    """Write each worker's runner config, env file and systemd units (no secrets in them)."""
    from provision.spec import load_spec
    from provision.system.templates import find_templates_dir
    from provision.workers.files import Placement, write_worker_files

    spec = load_spec(spec_file)
    if all_workers == bool(worker):
        raise InputError("give --worker NAME (repeatable) or --all, not both or neither")
    names = [w.name for w in spec.workers] if all_workers else list(worker or [])
    placement = Placement(config_dir, token_dir.absolute(), lockctl_bin)
    for result in write_worker_files(
        spec, names, out, find_templates_dir(templates_dir), placement
    ):
        typer.echo(f"{result.worker}: {len(result.files)} files in {out / result.worker}")
        if result.jobs_without_unit:
            jobs = ", ".join(result.jobs_without_unit)
            typer.echo(f"  no systemd unit for {jobs} (needs both schedule and command)")


def run(
    command: Annotated[list[str], typer.Argument(help="The job's command, after --.")],
    job: Annotated[str, typer.Option("--job", "-j", help="The job (its name in the spec).")],
    config: Annotated[
        Path,
        typer.Option("--config", "-c", envvar="LOCKCTL_CONFIG", help="The worker's lockctl.json."),
    ],
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait for the lock instead of skipping this tick.")
    ] = False,
    timeout: Annotated[
        str | None, typer.Option("--timeout", help="With --wait: give up after this duration.")
    ] = None,
    min_hold: Annotated[
        str | None,
        typer.Option("--min-hold", help="Hold the lock at least this long (overrides config)."),
    ] = None,
    allow_unsafe: Annotated[
        bool,
        typer.Option("--allow-unsafe", help="Run even if the timings break the fencing bound."),
    ] = False,
) -> None:
    """Run COMMAND only if this worker holds the job's lock; skip (exit 0) if another does."""
    from provision.cli.signals import signals_request_stop
    from provision.consul import Consul, resolve_settings
    from provision.runner.child import become_subreaper
    from provision.runner.engine import RunOptions, run_job
    from provision.runner.events import EventLog
    from provision.runner.stop import StopRequest
    from provision.workers.config import load_worker_config

    if timeout is not None and not wait:
        raise InputError("--timeout only applies with --wait")
    worker_config = load_worker_config(config, allow_unsafe=allow_unsafe)
    job_config = worker_config.job(job)
    settings = resolve_settings(address=worker_config.address, token_file=worker_config.token_file)
    options = RunOptions(wait, _seconds(timeout, "--timeout"), _seconds(min_hold, "--min-hold"))
    events = EventLog(job, worker_config.worker, sys.stderr)
    consul = Consul(settings)
    become_subreaper()  # the job's orphans come back to us, so none of them outlives the lock
    with signals_request_stop(StopRequest()) as stop:
        result = run_job(consul, job_config, worker_config.worker, command, options, events, stop)
    raise typer.Exit(result.exit_code)


def status(
    spec_file: SpecFile = DEFAULT_SPEC,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    address: Address = None,
    token_file: TokenFile = None,
) -> None:
    """Who holds each job's lock (consistent reads): session, node, since when, LockIndex."""
    from rich.table import Table

    from provision.consul import Consul
    from provision.runner.status import lock_states
    from provision.spec import load_spec

    spec = load_spec(spec_file)
    states = lock_states(Consul(consul_settings(address, token_file)), spec)
    if as_json:
        typer.echo(json.dumps([asdict(state) for state in states], indent=2))
        return
    table = Table()
    for header in ("job", "lock key", "holder", "session", "since (UTC)", "LockIndex"):
        table.add_column(header, overflow="fold")  # a narrow table wraps; it never cuts an ID
    for s in states:
        holder = f"{s.worker or '?'} (node {s.node or '?'})" if s.held else "free"
        table.add_row(
            s.job,
            s.key,
            holder,
            s.session or "-",
            s.acquired_at or "-",
            str(s.lock_index if s.lock_index is not None else "-"),
        )
    console().print(table)


def _seconds(text: str | None, flag: str) -> float | None:
    from provision.durations import DurationSyntaxError, parse_duration

    if text is None:
        return None
    try:
        seconds = parse_duration(text).seconds
    except DurationSyntaxError as exc:
        raise InputError(f"{flag}: {exc}") from None
    if seconds < 0:
        raise InputError(f"{flag} {text}: must not be negative")
    return seconds
