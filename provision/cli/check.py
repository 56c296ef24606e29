"""`lockctl check`: each job's health from its ledger, for monitoring systems (Nagios plugin
convention: exit 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN; the first line of stdout says it all).

Unlike every other command, an error is not exit 3/4/5 by family: whatever keeps check from
judging the ledger (Consul unreachable, a token refused, a spec that does not load) is UNKNOWN,
exit 3, on stdout where the monitoring system reads it.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import TYPE_CHECKING, Annotated

import typer

from provision.cli import options
from provision.cli.datacenters import Each, Failure
from provision.cli.history import JobOption, scheduled_jobs
from provision.errors import LockctlError

if TYPE_CHECKING:
    from pathlib import Path

    from provision.consul import Consul
    from provision.ledger.health import JobHealth, State
    from provision.ledger.history import LedgerJob

MaxIntervals = Annotated[
    int,
    typer.Option(
        "--max-intervals",
        min=1,
        max=1000,
        help="CRITICAL when no run succeeded in this many of the latest ticks (or one of them "
        "was missed).",
    ),
]
UNKNOWN = 3


@options.consul_command
def check(
    connection: options.Connection,
    spec_file: options.SpecFile = options.DEFAULT_SPEC,
    job: JobOption = None,
    max_intervals: MaxIntervals = 2,
    datacenter: options.Datacenter = None,
) -> None:
    """Judge each job's ledger for monitoring: OK, WARNING, CRITICAL (Nagios).

    OK; WARNING: the last run failed, a record dated in the future; CRITICAL: a tick missed, no
    success in --max-intervals ticks; UNKNOWN: it could not judge. Records the missed ticks it
    finds when the token may. A job whose workers are in several datacenters is judged in
    each (--datacenter: only that one); a datacenter that cannot be read is UNKNOWN there.
    """
    from provision.ledger.health import worst

    try:
        judged = _judge(connection, spec_file, (job, datacenter), max_intervals)
    except LockctlError as exc:
        for problem in getattr(exc, "problems", ()):
            typer.echo(str(problem), err=True)
        typer.echo(f"UNKNOWN: {exc}".replace("|", "\\x7c"))
        raise typer.Exit(UNKNOWN) from None
    if not judged:
        typer.echo(f"UNKNOWN: no job in {spec_file} has a schedule: nothing to check")
        raise typer.Exit(UNKNOWN)
    state = worst([health.state for health, _ in judged])
    lines = [health.line() + remark for health, remark in judged]
    if len(judged) > 1:
        typer.echo(_summary(state, judged))
    typer.echo("\n".join(lines))
    raise typer.Exit(int(state))


def _judge(
    connection: options.Connection,
    spec_file: Path,
    which: tuple[str | None, str | None],  # --job, --datacenter
    max_intervals: int,
) -> list[tuple[JobHealth, str]]:
    """Each job judged in each datacenter its ledger is in, `job in dc2` (a spec that names
    no datacenters: `job`, as ever)."""
    jobs = scheduled_jobs(spec_file, *which)
    if not jobs:
        return []
    each = Each(connection.connect())
    judged = []
    for job, datacenter in jobs:
        found = each.ask(datacenter, partial(_judge_one, job=job, max_intervals=max_intervals))
        if found is None:  # its datacenter failed: check cannot vouch for the job there
            assert datacenter is not None
            found = (_unread(each.failure_in(datacenter)), "")
        health, remark = found
        if datacenter is not None:
            health = dataclasses.replace(health, job=f"{job.name} in {datacenter}")
        judged.append((health, remark))
    return judged


def _unread(lost: Failure) -> JobHealth:
    """UNKNOWN, `could not be read: Consul answered 500: No path to datacenter`."""
    from datetime import datetime, timezone

    from provision.ledger.health import JobHealth, State

    said = lost.said("could not be read").removeprefix(f"{lost.datacenter}: ")
    now = datetime.now(timezone.utc)
    return JobHealth("", State.UNKNOWN, (), last_success=None, next_tick=None, now=now, note=said)


def _judge_one(consul: Consul, job: LedgerJob, max_intervals: int) -> tuple[JobHealth, str]:
    """The job's health, after recording the missed ticks found (read again if any were)."""
    from provision.ledger.health import assess, read_enough
    from provision.ledger.history import Wanted, read_history
    from provision.ledger.unrun import record_missed

    enough = read_enough(job.schedule, job.start_deadline, max_intervals)
    wanted = Wanted(job.history_limit, enough=enough)  # newest first, back to what it judges
    history = read_history(consul, job, wanted=wanted)
    remark = ""
    if history.unrecorded_missed:
        recording = record_missed(consul, history)
        if recording.written:
            history = read_history(consul, job, history.now, wanted)
            remark = f" ({recording.said()})"
        elif recording.denied:
            remark = " (missed ticks not recorded: this token may not write the ledger)"
    return assess(history, job.start_deadline, max_intervals), remark + _paused(consul, job.name)


def _paused(consul: Consul, job: str) -> str:
    """` (paused by alice at ...: why)` while an operator paused the job (its paused ticks are
    neither missed nor failed runs); nothing when not, or when this token may not read it."""
    from provision.consul import ConsulError
    from provision.ledger.operator import readable_pause_state

    try:
        state = readable_pause_state(consul, job)
    except ConsulError:  # the ledger was read: say what it says, without this remark
        return ""
    if state is None or state.note is None or state.ended:  # an ended pause holds no tick
        return ""
    return f" (paused {state.said()})".replace("|", "\\x7c")  # no Nagios perf data


def _summary(state: State, judged: list[tuple[JobHealth, str]]) -> str:
    """`CRITICAL: 3 jobs, 1 critical (a), 1 warning (b), 1 ok`: the line a pager shows."""
    from provision.ledger.health import State

    parts = []
    for level in (State.CRITICAL, State.UNKNOWN, State.WARNING, State.OK):
        names = [health.job for health, _ in judged if health.state is level]
        if names:
            listed = f" ({', '.join(names)})" if level is not State.OK else ""
            parts.append(f"{len(names)} {level.name.lower()}{listed}")
    return f"{state.name}: {len(judged)} jobs, " + ", ".join(parts)
