"""`lockctl run`: run a job's command only on the worker that holds the job's lock.

`run` is started by every worker on every tick, so its imports are lazy: it loads the runner and
the Consul client, not the spec parser, Jinja or rich. It reads where Consul is from the
worker's config (lockctl.json), not from connection flags.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from provision.errors import InputError
from provision.runner.events import EventLog


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
    with signals_request_stop(StopRequest(), restore=False) as stop:  # we exit right after
        result = run_job(consul, job_config, worker_config.worker, command, options, events, stop)
    if events.broken:
        _report_broken_stream(events)
    raise typer.Exit(result.exit_code)


def _report_broken_stream(events: EventLog) -> None:
    """Say once, if stderr works again, how many events were lost; then make sure the exit
    status stays the job's: Python's own final flush of a broken stderr would turn it into 120."""
    import contextlib
    import os

    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(
            f"lockctl: warning: {events.dropped} lock events could not be written to stderr "
            f"({events.broken})\n"
        )
        sys.stderr.flush()
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        sys.stderr = open(devnull, "w", encoding="utf-8", closefd=False)  # noqa: SIM115


# The longest --timeout (a wait for the lock) taken: a week. --min-hold is bounded like the
# spec's min_hold (provision.timings.BOUNDS). Both are refused at the flag, before any lock is
# taken: a value no clock or sleep can hold would otherwise fail after the job ran.
MAX_WAIT_SECONDS = 7 * 86400.0


def _seconds(text: str | None, flag: str) -> float | None:
    from provision.durations import DurationSyntaxError, format_duration, parse_duration
    from provision.timings import BOUNDS

    if text is None:
        return None
    try:
        seconds = parse_duration(text).seconds
    except DurationSyntaxError as exc:
        raise InputError(f"{flag}: {exc}") from None
    if seconds < 0:
        raise InputError(f"{flag} {text}: must not be negative")
    high = BOUNDS["min_hold"][1] if flag == "--min-hold" else MAX_WAIT_SECONDS
    if seconds > high:
        raise InputError(f"{flag} {text}: must be at most {format_duration(high)}")
    return seconds
