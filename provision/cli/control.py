"""`lockctl pause JOB`, `lockctl resume JOB`: an operator's hold on a job's ticks; `lockctl
trigger JOB`: one run now, outside the schedule. Kept in Consul under the job's control keys
(provision/ledger/operator.py), written with the operator's token, never a worker's. `lockctl
break JOB`: the session of a gone replica destroyed (provision/ledger/breaking.py). `lockctl abort
JOB`: the run going on stopped by its replica, recorded `aborted` (provision/ledger/aborts.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from provision.cli import options
from provision.cli.datacenters import Datacenters, in_each
from provision.errors import InputError

if TYPE_CHECKING:
    from provision.consul import Consul
    from provision.ledger.operator import PauseChange
    from provision.spec import Job, Spec

JobArgument = Annotated[str, typer.Argument(help="The job's name, as in the spec.", metavar="JOB")]
Reason = Annotated[
    str | None,
    typer.Option("--reason", help="Why (shown by status and history; at most 200 characters)."),
]


For = Annotated[
    str | None,
    typer.Option(
        "--for", help="End the pause by itself after this long (90s, 15m, 2h, 1h30m, 7d)."
    ),
]
Until = Annotated[
    str | None,
    typer.Option("--until", help="End the pause by itself at this instant (2026-12-24T00:00:00Z)."),
]


@options.consul_command
def pause(
    connection: options.Connection,
    job: JobArgument,
    reason: Reason = None,
    for_: For = None,
    until: Until = None,
    spec_file: options.SpecFile = options.DEFAULT_SPEC,
    datacenter: options.Datacenter = None,
) -> None:
    """Pause JOB: every replica refuses its ticks until `lockctl resume JOB`.

    Each refused tick is recorded `paused` (not missed). With --for or --until the pause ends
    by itself: ticks from that instant on (on Consul's clock) run. Needs a token that may write
    lockctl/control/JOB/ (not a worker's).
    """
    from provision.ledger.control import reason_problem
    from provision.ledger.operator import pause as pause_job

    _, datacenters = _target(spec_file, job, datacenter)
    problem = reason_problem(reason)
    if problem is not None:
        raise InputError(f"--reason {problem}")
    if for_ is not None and until is not None:
        raise InputError("--for and --until: give one of them, not both")
    ends = None if for_ is None and until is None else (for_, until)
    in_each(
        connection.connect(),
        datacenters,
        lambda consul: _said(pause_job(consul, job, reason, ends=ends), "paused"),
    )


@options.consul_command
def resume(
    connection: options.Connection,
    job: JobArgument,
    spec_file: options.SpecFile = options.DEFAULT_SPEC,
    datacenter: options.Datacenter = None,
) -> None:
    """Resume JOB: its next tick is claimed and run as usual."""
    from provision.ledger.operator import resume as resume_job

    _, datacenters = _target(spec_file, job, datacenter)
    in_each(
        connection.connect(), datacenters, lambda consul: _said(resume_job(consul, job), "resumed")
    )


@options.consul_command
def trigger(
    connection: options.Connection,
    job: JobArgument,
    reason: Reason = None,
    spec_file: options.SpecFile = options.DEFAULT_SPEC,
    datacenter: options.Datacenter = None,
) -> None:
    """Run JOB once now, outside its schedule, on one replica of its schedulers.

    One replica of the running `lockctl schedule`s runs it (right after its run, if one is going
    on), recorded as a manual run. Refused (exit 1) while JOB is paused or a trigger of it is
    pending.
    """
    from provision.ledger.control import manual_tick, reason_problem
    from provision.ledger.operator import trigger as trigger_job
    from provision.ledger.records import tick_name

    known, datacenters = _target(spec_file, job, datacenter)
    problem = reason_problem(reason)
    if problem is not None:
        raise InputError(f"--reason {problem}")
    if known.schedule is None:
        raise InputError(f"job {job} has no schedule: no `lockctl schedule` runs it")

    def triggered(consul: Consul) -> list[str]:
        note = trigger_job(consul, job, known.lock_key, reason)
        assert note.at is not None
        return [
            f"job {job} triggered {note.said()} (trigger {note.id})",
            f"its run is recorded at {tick_name(manual_tick(note.at))} in its history",
        ]

    in_each(connection.connect(), datacenters, triggered)


@options.consul_command
def break_lock(
    connection: options.Connection,
    job: JobArgument,
    force: Annotated[
        bool,
        typer.Option("--force", help="Break it while its node is healthy, or when not lockctl's."),
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
    spec_file: options.SpecFile = options.DEFAULT_SPEC,
    key: options.Key = None,
) -> None:
    """Destroy the session holding JOB's lock, when its replica is gone.

    With --key, a keyed job's lock for that key. Shows the holder (session, node and its
    serfHealth, its record and tick), then asks. Refused
    (exit 1) without --force while the holder's node is healthy or the session is not lockctl's;
    exit 0 when the lock is free. Needs a token with session write on the holder's node (an
    operator's, not a worker's). The lock may be taken again after the session's LockDelay.
    """
    import sys
    from datetime import datetime, timezone

    from provision.ledger.breaking import (
        BreakRefused,
        break_refusal,
        describe,
        destroy_holder,
        fencing_note,
        read_holder,
    )
    from provision.spec import load_spec

    spec = load_spec(spec_file)
    _job_in(spec, spec_file, job)
    keys = {known.name: known.lock_key for known in spec.jobs}
    lock_key = options.keyed_lock(keys.pop(job), key)
    consul = connection.connect()
    view = read_holder(consul, job, lock_key, keys)
    refusal = break_refusal(view, force)
    if refusal is not None and refusal.nothing_held:
        typer.echo(refusal.reason)
        return
    for line in describe(view, datetime.now(timezone.utc)):
        typer.echo(line)
    if refusal is not None:
        raise BreakRefused(f"not broken: {refusal.said()}")
    overridden = break_refusal(view, force=False)
    if overridden is not None:
        typer.echo(f"forced (--force): {overridden.reason}")
    typer.echo(fencing_note(view))
    if not yes:
        if not sys.stdin.isatty():
            raise InputError("stdin is not a terminal: confirm with --yes")
        if not typer.confirm(f"destroy session {view.shown_id} on node {view.node}?"):
            raise BreakRefused("not broken: not confirmed")
    typer.echo(destroy_holder(consul, view).said())


def _target(spec_file: Path, job: str, datacenter: str | None) -> tuple[Job, Datacenters]:
    """JOB must be a job of the spec (a typo must not pause nothing); the datacenters its
    control keys are written in (provision/spec/datacenters.py)."""
    from provision.spec import load_spec
    from provision.spec.datacenters import chosen_datacenters

    spec = load_spec(spec_file)
    known = _job_in(spec, spec_file, job)
    return known, chosen_datacenters(spec.workers, known, datacenter)


def _job_in(spec: Spec, spec_file: Path, job: str) -> Job:
    found = [known for known in spec.jobs if known.name == job]
    if not found:
        raise InputError(f"job {job!r} is not in {spec_file}")
    return found[0]


def _said(change: PauseChange, done: str) -> list[str]:
    note, job = change.state.note, change.state.job
    if done == "paused":
        assert note is not None
        line = f"job {job} paused {note.said()}"
        return [line if change.changed else f"job {job} was already paused {note.said()}"]
    return [f"job {job} resumed" if change.changed else f"job {job} was not paused"]


# -- `lockctl abort JOB` ---------------------------------------------------------------------


@options.consul_command
def abort(
    connection: options.Connection,
    job: JobArgument,
    reason: Reason = None,
    spec_file: options.SpecFile = options.DEFAULT_SPEC,
    datacenter: options.Datacenter = None,
    key: options.Key = None,
) -> None:
    """Stop JOB's run now: its replica ends its process tree, recorded aborted.

    The run holding JOB's lock (with --key, that key's) is named (its tick and session); its
    replica stops it as a timed-out run is stopped (SIGTERM to the whole tree, SIGKILL after
    the grace), records it `aborted` with who and why, and releases the lock; the next tick
    runs as usual. Exit 1 when JOB is not running. Needs a token that may write
    lockctl/control/JOB/ (not a worker's). Obeyed by `lockctl schedule`, `lockctl run` and
    an app's provision.embed.
    """
    from provision.ledger.control import reason_problem
    from provision.ledger.operator import NotRunning
    from provision.ledger.operator import abort as abort_job

    known, datacenters = _target(spec_file, job, datacenter)
    problem = reason_problem(reason)
    if problem is not None:
        raise InputError(f"--reason {problem}")
    lock_key = options.keyed_lock(known.lock_key, key)

    several = len(datacenters) > 1
    stopped: list[str] = []

    def aborted(consul: Consul) -> list[str]:
        try:
            note = abort_job(consul, job, lock_key, reason, key=key)
        except NotRunning as idle:
            if not several:
                raise
            return [str(idle)]  # a datacenter where it does not run: nothing to stop there
        stopped.append(job)
        return [
            f"job {job} aborted {note.said()}",
            f"the process running it (`lockctl schedule`, `lockctl run` or an app's "
            f"provision.embed) stops it now, recorded `aborted` (lockctl history {job})",
        ]

    in_each(connection.connect(), datacenters, aborted)
    if several and not stopped:  # run nowhere: as a single datacenter's, exit 1
        raise NotRunning(f"job {job} is not running in any of its datacenters: nothing aborted")
