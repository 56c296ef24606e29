"""`lockctl pause JOB`, `lockctl resume JOB`: an operator's hold on a job's ticks, kept in
Consul under the job's control keys (provision/ledger/operator.py), with the operator's token."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from provision.cli import options
from provision.errors import InputError

if TYPE_CHECKING:
    from provision.ledger.operator import PauseChange

JobArgument = Annotated[str, typer.Argument(help="The job's name, as in the spec.", metavar="JOB")]
Reason = Annotated[
    str | None,
    typer.Option("--reason", help="Why (shown by status and history; at most 200 characters)."),
]


@options.consul_command
def pause(
    connection: options.Connection,
    job: JobArgument,
    reason: Reason = None,
    spec_file: options.SpecFile = options.DEFAULT_SPEC,
) -> None:
    """Pause JOB: every replica refuses its ticks, each recorded `paused` (not missed), until
    `lockctl resume JOB`. Needs a token that may write lockctl/control/JOB/ (not a worker's)."""
    from provision.ledger.control import reason_problem
    from provision.ledger.operator import pause as pause_job

    _known_job(spec_file, job)
    problem = reason_problem(reason)
    if problem is not None:
        raise InputError(f"--reason {problem}")
    _say(pause_job(connection.connect(), job, reason), "paused")


@options.consul_command
def resume(
    connection: options.Connection,
    job: JobArgument,
    spec_file: options.SpecFile = options.DEFAULT_SPEC,
) -> None:
    """Resume JOB: its next tick is claimed and run as usual."""
    from provision.ledger.operator import resume as resume_job

    _known_job(spec_file, job)
    _say(resume_job(connection.connect(), job), "resumed")


def _known_job(spec_file: Path, job: str) -> None:
    """JOB must be a job of the spec (a typo must not pause nothing)."""
    from provision.spec import load_spec

    if job not in {known.name for known in load_spec(spec_file).jobs}:
        raise InputError(f"job {job!r} is not in {spec_file}")


def _say(change: PauseChange, done: str) -> None:
    note, job = change.state.note, change.state.job
    if done == "paused":
        assert note is not None
        line = f"job {job} paused {note.said()}"
        typer.echo(line if change.changed else f"job {job} was already paused {note.said()}")
    else:
        typer.echo(f"job {job} resumed" if change.changed else f"job {job} was not paused")
