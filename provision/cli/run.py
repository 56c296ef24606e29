"""`lockctl run` as a Typer command: run a job's command only on the worker that holds its lock.

The console script serves a plain `lockctl run` without Typer (entry.py); this command is what
`run --help`, a malformed `run` and the tests' CliRunner see. Its flags come from the one table
in runjob.py, and it does what the fast path does: `run_command`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from provision.cli.runjob import COMMAND_HELP, FLAGS, RunArgs, run_command


def _option(field: str) -> Any:
    flag = FLAGS[field]
    return typer.Option(*flag.names, help=flag.help, envvar=flag.envvar)


def run(
    command: Annotated[list[str], typer.Argument(help=COMMAND_HELP)],
    job: Annotated[str, _option("job")],
    config: Annotated[Path, _option("config")],
    wait: Annotated[bool, _option("wait")] = False,
    timeout: Annotated[str | None, _option("timeout")] = None,
    min_hold: Annotated[str | None, _option("min_hold")] = None,
    allow_unsafe: Annotated[bool, _option("allow_unsafe")] = False,
    metrics_textfile: Annotated[str | None, _option("metrics_textfile")] = None,
) -> None:
    """Run COMMAND only if this worker holds the job's lock; skip (exit 0) if another does."""
    args = RunArgs(command, job, config, wait, timeout, min_hold, allow_unsafe, metrics_textfile)
    raise typer.Exit(run_command(args))
