"""`lockctl backfill JOB --from T1 --to T2`: the ticks of a past range run once each by the
running schedulers, those that ran skipped (provision/ledger/backfill.py decides, and
provision/ledger/backfilling.py writes the note, with the operator's token)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Annotated

import typer

from provision.cli import options
from provision.cli.datacenters import in_each
from provision.errors import InputError

if TYPE_CHECKING:
    from provision.consul import Consul
    from provision.ledger.backfill import BackfillPlan
    from provision.schedule import Schedule
    from provision.spec import Job

_TINY = timedelta(microseconds=1)

From = Annotated[
    str,
    typer.Option("--from", help="The range's first instant (2026-12-07T02:00:00Z), included."),
]
To = Annotated[
    str, typer.Option("--to", help="The range's last instant, included; not in the future.")
]
Reason = Annotated[
    str | None,
    typer.Option("--reason", help="Why (shown by history; at most 200 characters)."),
]
Yes = Annotated[bool, typer.Option("--yes", help="Run more ticks than the job's catchup_limit.")]
DryRun = Annotated[
    bool, typer.Option("--dry-run", help="Say which ticks would run and which not; write nothing.")
]


@dataclass(frozen=True)
class BackfillFlags:
    """backfill's own flags (their order is --help's): the range, why, and how far to go."""

    from_: From
    to: To
    reason: Reason = None
    yes: Yes = False
    dry_run: DryRun = False
    spec_file: options.SpecFile = options.DEFAULT_SPEC
    datacenter: options.Datacenter = None


@options.flags_command(BackfillFlags)
@options.consul_command
def backfill(
    connection: options.Connection,
    flags: BackfillFlags,
    job: Annotated[str, typer.Argument(help="The job's name, as in the spec.", metavar="JOB")],
) -> None:
    """Run JOB's ticks from --from to --to once each, on one replica of its schedulers.

    The ticks that already ran are skipped (so are those a blackout window held, and those
    older than a pruned ledger's oldest record); `missed` and `paused` ones run, recorded as
    backfill. Refused (exit 1) over the job's catchup_limit without --yes, while JOB is paused,
    or while a backfill of it is pending.
    """
    from provision.ledger.backfill import instant, range_problem
    from provision.ledger.control import reason_problem
    from provision.spec import load_spec
    from provision.spec.datacenters import chosen_datacenters

    span = (instant("--from", flags.from_), instant("--to", flags.to))
    order = range_problem(*span, now=span[1])  # its order; the future is Consul's clock's word
    if order is not None:
        raise InputError(order)
    problem = reason_problem(flags.reason)
    if problem is not None:
        raise InputError(f"--reason {problem}")
    spec = load_spec(flags.spec_file)
    found = [known for known in spec.jobs if known.name == job]
    if not found:
        raise InputError(f"job {job!r} is not in {flags.spec_file}")
    if found[0].schedule is None:
        raise InputError(f"job {job} has no schedule: no `lockctl schedule` runs it")
    datacenters = chosen_datacenters(spec.workers, found[0], flags.datacenter)
    in_each(connection.connect(), datacenters, functools.partial(_act, found[0], span, flags))


def _act(
    job: Job, span: tuple[datetime, datetime], flags: BackfillFlags, consul: Consul
) -> list[str]:
    """The backfill in one datacenter: its ledger read, the plan said, the note written."""
    from provision.ledger.backfill import limit_problem, plan_backfill, range_problem
    from provision.ledger.backfilling import BackfillRefused, ask_backfill, read_ledger

    seen = read_ledger(consul, job.lock_key)
    problem = range_problem(*span, seen.now)
    if problem is not None:
        raise InputError(problem)
    schedule, held = _schedule(job)
    plan = plan_backfill(schedule, span, _closed(job, seen.now), seen.ledger, held)
    lines = _said(job.name, plan)
    refusal = limit_problem(plan, job.catchup_reach.limit, flags.yes)
    if refusal is not None:
        raise BackfillRefused(f"job {job.name}: not backfilled: {refusal}")
    if flags.dry_run or not plan.run:
        return [*lines, "nothing written (--dry-run)" if flags.dry_run else "nothing to run"]
    note = ask_backfill(consul, job.name, plan.run, flags.reason, seen)
    return [*lines, f"job {job.name} backfilled {note.said()} (backfill {note.id})"]


def _schedule(job: Job) -> tuple[Schedule, Callable[[datetime], str | None]]:
    """The job's schedule, and the name of the blackout window holding a tick (None: none)."""
    from provision.blackouts import holding_window
    from provision.schedule import parse_schedule

    assert job.schedule is not None

    def held(tick: datetime) -> str | None:
        found = holding_window(job.blackouts, tick)
        return None if found is None else found.name

    return parse_schedule(job.schedule, job.timezone), held


def _closed(job: Job, now: datetime) -> datetime:
    """The newest instant whose tick's claim window has closed at `now`: the current tick's
    window may be open (its own turn runs it, not a backfill)."""
    from provision.ledger.ticks import claim_window
    from provision.schedule import parse_schedule

    assert job.schedule is not None
    schedule = parse_schedule(job.schedule, job.timezone)
    current = schedule.latest_tick_at_or_before(now)
    window = claim_window(schedule, current, job.timings.start_deadline)
    return current if (now - current).total_seconds() > window else current - _TINY


def _said(job: str, plan: BackfillPlan) -> list[str]:
    from provision.ledger.records import tick_name

    lines = [f"job {job}: {len(plan.run)} ticks to run, {len(plan.skipped)} skipped"]
    rows = [(tick, "run", "") for tick in plan.run]
    rows += [(tick, "skip", f": {why}") for tick, why in plan.skipped]
    for tick, what, why in sorted(rows):
        lines.append(f"  {what:4} {tick_name(tick)}{why}")
    return lines
