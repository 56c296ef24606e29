"""`lockctl history`: each job's ticks from its ledger, as a table or JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from provision.cli import options
from provision.cli.datacenters import Each
from provision.cli.output import cell, console
from provision.errors import InputError

if TYPE_CHECKING:
    from rich.text import Text

    from provision.consul import Consul
    from provision.ledger.history import JobHistory, LedgerJob, TickRow
    from provision.ledger.records import TickRecord
    from provision.ledger.since import Earliest

JobOption = Annotated[
    str | None, typer.Option("--job", help="Only this job (default: every job with a schedule).")
]
Since = Annotated[
    str | None,
    typer.Option(
        "--since",
        help="Only ticks from then on: a duration back from now (24h, 90m, 7d) or an ISO "
        "date or date/time (2026-12-01, 2026-12-01T02:00:00Z; UTC unless it says).",
        show_default=False,
    ),
]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON.")]
Limit = Annotated[
    int | None,
    typer.Option(
        "--limit",
        min=1,
        max=10000,
        help="At most this many ticks per job, the newest (default: the job's history_limit).",
        show_default=False,
    ),
]
TickOption = Annotated[
    str | None,
    typer.Option(
        "--tick",
        help="With --job: that one tick's record (as history names it, 2026-12-01T02:00:00Z), "
        "with the end of the run's stdout and stderr.",
        show_default=False,
    ),
]
TimelineOption = Annotated[
    bool,
    typer.Option(
        "--timeline",
        help="Per job, a strip per worker of its recent ticks, one character per tick.",
    ),
]
PROBLEMS_SHOWN = 10  # lines about records not read, per job; the rest are counted


@dataclass(frozen=True)
class HistoryFlags:
    """history's own flags (their order is --help's): which jobs and ticks, and how shown."""

    spec_file: options.SpecFile = options.DEFAULT_SPEC
    job: JobOption = None
    since: Since = None
    limit: Limit = None
    as_json: AsJson = False
    tick: TickOption = None
    show_timeline: TimelineOption = False
    datacenter: options.Datacenter = None
    key: options.Key = None


@options.flags_command(HistoryFlags)
@options.consul_command
def history(connection: options.Connection, flags: HistoryFlags) -> None:
    """Each tick of each job from its ledger: who ran it, how it ended, and when.

    Who ran it (the record's word), LockIndex, outcome, exit status, duration, start lag, and
    the ticks nobody ran.
    """
    earliest = _since(flags.since)  # refused before the spec or Consul is read
    wanted_tick = _tick(flags.tick, flags.job, flags.show_timeline)
    _check_key(flags.key, flags.job)
    jobs = scheduled_jobs(flags.spec_file, flags.job, flags.datacenter)
    if flags.key is not None:
        jobs = [(job.keyed(flags.key), datacenter) for job, datacenter in jobs]
    each = Each(connection.connect())
    if wanted_tick is not None:
        _show_tick(each, jobs, wanted_tick, flags.as_json)
    else:
        _show_histories(each, jobs, flags, earliest)
    each.end()  # a datacenter that failed: its line, after what the others showed


def _show_tick(
    each: Each, jobs: list[tuple[LedgerJob, str | None]], tick: datetime, as_json: bool
) -> None:
    rows = [(j, d, each.ask(d, partial(_tick_row, job=j, tick=tick))) for j, d in jobs]
    found = [(j, d, row) for j, d, row in rows if row is not None]
    if as_json:  # one document: the record, or a list of them, one per datacenter
        records = [_in({"job": j.name, **row.to_record()}, d) for j, d, row in found]
        if records:
            typer.echo(json.dumps(records[0] if len(rows) == 1 else records, indent=2))
        return
    for j, datacenter, row in found:
        _print_tick(_job_title(j.title, datacenter), row)


def _show_histories(
    each: Each,
    jobs: list[tuple[LedgerJob, str | None]],
    flags: HistoryFlags,
    earliest: Earliest | None,
) -> None:
    from provision.ledger.history import Wanted, read_history

    histories, unread = [], []
    for j, datacenter in jobs:
        count = flags.limit or j.history_limit
        wanted = Wanted(count)
        if earliest is not None:
            wanted = Wanted(count, earliest.moment, back=earliest.back)
        found = each.ask(datacenter, partial(read_history, job=j, wanted=wanted))
        if found is None:
            if datacenter is not None:
                unread.append(each.unread(j.name, datacenter))
            continue
        shown = found if earliest is None else found.since(earliest.start(found.now))
        histories.append((shown.newest(count), datacenter))
    for found, _ in histories:
        _report_problems(found)
    if flags.as_json:
        records = [_in(h.to_record(), datacenter) for h, datacenter in histories]
        if records or not each.failures:  # nothing read at all: no `[]`
            records += unread  # after what was read: a reader of the list's first keeps it
            typer.echo(json.dumps(records, indent=2))
        return
    if flags.show_timeline:
        _print_timelines(histories)
        return
    if not jobs:
        typer.echo(f"no job in {flags.spec_file} has a schedule: no ledger to show")
    for found, datacenter in histories:
        paused = _pause_said(each.consul.in_datacenter(datacenter), found.job)
        _print(found, paused, datacenter)


def _in(record: dict[str, Any], datacenter: str | None) -> dict[str, Any]:
    """A JSON record with the datacenter it was read in, after the job's name (none in a spec
    that names no datacenters: the record as it always was)."""
    if datacenter is None:
        return record
    job = {"job": record.pop("job")} if "job" in record else {}
    return {**job, "datacenter": datacenter, **record}


def _job_title(job: str, datacenter: str | None) -> str:
    return job if datacenter is None else f"{job} in {datacenter}"


def _pause_said(consul: Consul, job: str) -> str:
    """`, paused by alice at ... until ...: why` while the job is paused (a time-boxed pause
    that ended says so); nothing when not, or when this token may not read it."""
    from provision.consul import ConsulError
    from provision.ledger.operator import readable_pause_state

    try:
        state = readable_pause_state(consul, job)
    except ConsulError:  # the ledger was read: show it, without this remark
        return ""
    return "" if state is None or state.note is None else f", paused {state.said()}"


def scheduled_jobs(
    spec_file: Path, name: str | None, datacenter: str | None = None
) -> list[tuple[LedgerJob, str | None]]:
    """The spec's jobs that have a ledger, or just `name` (InputError if it has none), each
    once per datacenter its ledger is read in (None: the agent's own, in a spec that names no
    datacenters); with `datacenter`, only there (the jobs with no worker there left out)."""
    from provision.ledger.history import ledger_job
    from provision.spec import load_spec
    from provision.spec.datacenters import (
        check_datacenter_flag,
        chosen_datacenters,
        job_datacenters,
    )

    spec = load_spec(spec_file)
    check_datacenter_flag(spec.workers, datacenter)
    if name is None:
        picked = [
            j
            for j in spec.jobs
            if datacenter is None or datacenter in job_datacenters(spec.workers, j)
        ]
    else:
        match = [j for j in spec.jobs if j.name == name]
        if not match:
            known = ", ".join(j.name for j in spec.jobs) or "none"
            raise InputError(f"--job {name[:64]!r}: no such job in {spec_file} (jobs: {known})")
        if ledger_job(match[0]) is None:
            where = f"{spec_file}:{match[0].line}"
            raise InputError(f"{where}: job {name!r} has no schedule: no ledger")
        picked = match
    return [
        (found, there)
        for j in picked
        if (found := ledger_job(j)) is not None
        for there in chosen_datacenters(spec.workers, j, datacenter)
    ]


def _check_key(key: str | None, job: str | None) -> None:
    """--key: held to the key rule (refused, never escaped), and only with --job."""
    if key is None:
        return
    options.keyed_lock("", key)  # refused here, before the spec or Consul is read
    if job is None:
        raise InputError("--key needs --job: a key is one job's")


def _since(text: str | None) -> Earliest | None:
    from provision.ledger.since import read_since

    if text is None:
        return None
    try:
        return read_since(text)
    except ValueError as exc:
        raise InputError(f"--since: {exc}") from None


def _tick(text: str | None, job: str | None, show_timeline: bool) -> datetime | None:
    from provision.ledger.records import parse_tick_name

    if text is None:
        return None
    if job is None:
        raise InputError("--tick needs --job: a tick is one job's")
    if show_timeline:
        raise InputError("--tick and --timeline: one or the other")
    moment = parse_tick_name(text)
    if moment is None:
        raise InputError(f"--tick {text[:64]!r}: not a tick name (like 2026-12-01T02:00:00Z, UTC)")
    return moment


def _tick_row(consul: Consul, job: LedgerJob, tick: datetime) -> TickRow:
    from provision.ledger.history import read_tick
    from provision.ledger.records import tick_name

    found, row = read_tick(consul, job, tick)
    _report_problems(found)
    if row is None:
        where = consul.settings.datacenter
        shown = "" if where is None else f" in {where}"
        raise InputError(f"--tick {tick_name(tick)}: job {job.name!r} has no record of it{shown}")
    return row


def _print_tick(job: str, row: TickRow) -> None:
    """The record's fields, one a line, then the ends of its output, each line escaped."""
    from rich.text import Text

    out = console()
    fields = {k: v for k, v in row.to_record().items() if k not in ("stdout", "stderr")}
    out.print(cell(f"{job} tick {fields.pop('tick')}: {row.label}", 300))
    if fields["recorded_outcome"] == row.outcome:  # said in the first line already
        del fields["recorded_outcome"]
    for name, value in fields.items():
        if value is not None and name not in ("outcome", "recorded", "catchup"):
            out.print(Text("  ") + cell(f"{name}: {value}", 300))
    r = row.record
    for name, text in (("stdout", r and r.stdout), ("stderr", r and r.stderr)):
        if not text:
            out.print(cell(f"  {name}: (nothing kept)"))
            continue
        out.print(cell(f"  {name} (its end, secrets masked):"))
        for line in text.rstrip("\n").split("\n"):
            out.print(Text("    | ") + cell(line, 1000), overflow="fold")


def _print_timelines(histories: list[tuple[JobHistory, str | None]]) -> None:
    from provision.ledger.records import tick_name
    from provision.ledger.timeline import LEGEND, timeline

    out = console()
    for found, datacenter in histories:
        shown = timeline(found, out.width)
        span = f"{shown.count} ticks"
        if shown.first is not None and shown.last is not None:
            span += f" {tick_name(shown.first)} .. {tick_name(shown.last)}"
        title = _job_title(found.title, datacenter)
        out.print(cell(f"{title}: {found.schedule.text} ({found.schedule.zone}), {span}", 300))
        width = max(len(strip.worker) for strip in shown.strips)
        for strip in shown.strips:
            out.print(cell(f"  {strip.worker:<{width}}  {strip.ticks}", 1000), overflow="ignore")
    legend = ", ".join(f"{mark} {meaning}" for mark, meaning in LEGEND)
    out.print(cell(f"legend: {legend}", 1000))


def _report_problems(found: JobHistory) -> None:
    """One line on stderr per record not read (`key: field: why`), the first few."""
    for problem in found.problems[:PROBLEMS_SHOWN]:
        typer.echo(f"lockctl: warning: {problem.line()}", err=True)
    if len(found.problems) > PROBLEMS_SHOWN:
        more = len(found.problems) - PROBLEMS_SHOWN
        typer.echo(f"lockctl: warning: {found.job}: {more} more records not read", err=True)


def _print(found: JobHistory, paused: str = "", datacenter: str | None = None) -> None:
    from rich.table import Table

    from provision.ledger.records import tick_name

    where = _job_title(found.title, datacenter)
    title = f"{where}: {found.schedule.text} ({found.schedule.zone}), "
    title += f"next tick {tick_name(found.next_tick)}{paused}"
    table = Table(title=cell(title, 300), title_justify="left")
    headers = ("tick (UTC)", "worker (as recorded)", "LockIndex", "outcome", "exit")
    for header in (*headers, "duration", "planned start", "start lag"):
        table.add_column(header, overflow="fold")
    for row in found.rows:
        table.add_row(*_cells(row))
    if not found.rows:
        table.add_row(cell("-"), cell("no ticks recorded yet"), *[cell("")] * 6)
    console().print(table)


def _cells(row: TickRow) -> list[Text]:
    from provision.durations import format_duration
    from provision.ledger.records import tick_name

    r = row.record
    style = "" if row.outcome in ("succeeded", "running") else "bold red"
    style = "yellow" if row.outcome == "paused" else style  # an operator's hold, not a fault

    def shown(value: object) -> Text:
        return cell("-") if value is None else cell(value)

    def seconds(value: float | None) -> Text:
        return shown(None if value is None else format_duration(value))

    return [
        cell(tick_name(row.tick)),
        shown(None if r is None else r.worker),
        shown(None if r is None else r.lock_index),
        cell(row.label, style=style),
        shown(None if r is None else r.exit_status),
        seconds(None if r is None else r.duration),
        _planned(r),
        seconds(None if r is None else r.start_lag),
    ]


def _planned(record: TickRecord | None) -> Text:
    """The tick's planned start, as an offset from its instant (its jitter); `+0s` without."""
    from provision.durations import format_duration

    if record is None or record.claimed_at is None:
        return cell("-")
    return cell("+" + format_duration(record.planned_start or 0.0))
