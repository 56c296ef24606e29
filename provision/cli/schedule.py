"""`lockctl schedule`: run every scheduled job of this worker's config, tick after tick.

The console script serves a plain invocation without Typer (schedulejob.py, entry.py); this
command gets the rest (-h, a malformed flag) and ends in the same `run_schedule`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def schedule(
    config: Annotated[
        Path,
        typer.Option("--config", "-c", envvar="LOCKCTL_CONFIG", help="The worker's lockctl.json."),
    ],
    allow_unsafe: Annotated[
        bool,
        typer.Option("--allow-unsafe", help="Run even if the timings break the fencing bound."),
    ] = False,
    listen: Annotated[
        str | None,
        typer.Option(
            "--listen",
            metavar="HOST:PORT",
            help="Serve /metrics (Prometheus) and /healthz here; PORT alone is 127.0.0.1:PORT.",
        ),
    ] = None,
) -> None:
    """Run every job of the config that has a schedule and a command, each tick on exactly one
    replica (the tick claimed in Consul with the lock). SIGTERM: finish cleanly, exit 0;
    SIGHUP: reload the config (a bad one is refused, the old one kept)."""
    from provision.cli.schedulejob import ScheduleArgs, run_schedule

    raise typer.Exit(run_schedule(ScheduleArgs(config, allow_unsafe, listen)))
