"""`lockctl status`: who holds each job's lock, as a table or JSON."""

from __future__ import annotations

import json
from functools import partial
from typing import TYPE_CHECKING, Annotated

import typer

from provision.cli import options
from provision.cli.datacenters import Each
from provision.cli.output import cell, console

if TYPE_CHECKING:
    from rich.text import Text

    from provision.runner.status import LockState

RECORD_LIMIT = 400  # the record's fields, each already cut to 64 characters, with their labels


@options.consul_command
def status(
    connection: options.Connection,
    spec_file: options.SpecFile = options.DEFAULT_SPEC,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    datacenter: options.Datacenter = None,
) -> None:
    """Who holds each job's lock; each scheduled job's last and next tick.

    Consistent reads: the session and its node (Consul's word), the record the holder wrote (its
    claim), LockIndex; for a job with a schedule, its ledger's last tick (outcome, the worker the
    record names) and its next tick; who paused a job, and who asked for a trigger no running
    scheduler has taken yet, and a backfill with ticks not run yet. A job whose workers are in
    several datacenters: a row per datacenter (--datacenter: only that one).
    """
    from provision.runner.status import lock_state, lock_targets
    from provision.spec import load_spec

    targets = lock_targets(load_spec(spec_file), datacenter)
    each = Each(connection.connect())
    states, unread = [], []
    for job, there in targets:  # a datacenter that fails: its rows left out, said after
        state = each.ask(there, partial(lock_state, job=job, datacenter=there))
        if state is not None:
            states.append(state)
        elif there is not None:  # in --json, an entry saying so, after the rows read
            unread.append(each.unread(job.name, there))
    if states or not each.failures:  # nothing read at all: no empty table or `[]`
        if as_json:
            typer.echo(json.dumps([s.to_record() for s in states] + unread, indent=2))
        else:
            _print(states)
    each.end()


def _print(states: list[LockState]) -> None:
    """The holder is the session's node, Consul's word; the record is only what the holder
    wrote into the key, so it gets its own column and a mismatch is called out. The ledger's
    columns are left out when no job has a schedule (they would be empty)."""
    from rich.table import Table

    table = Table()
    where = ("datacenter",) if any(s.datacenter is not None for s in states) else ()
    headers = ("job", *where, "lock key", "holder (node, from Consul)", "session")
    scheduled = any(s.next_tick is not None for s in states)
    ticks = ("last tick (outcome, worker as recorded)", "next tick") if scheduled else ()
    paused = ("paused",) if any(s.paused for s in states) else ()  # only while a job is
    pending = ("trigger pending",) if any(s.trigger_pending for s in states) else ()
    backfill = ("backfill pending",) if any(s.backfill_pending for s in states) else ()
    keyed = ("keys seen",) if any(s.keys_seen_count for s in states) else ()
    control = (*paused, *pending, *backfill, *keyed)
    for header in (*headers, "record (as written by the holder)", "LockIndex", *ticks, *control):
        table.add_column(header, overflow="fold")  # a narrow table wraps; it never cuts an ID
    for s in states:
        ledger = [_last_tick(s), cell(s.next_tick or "-")] if scheduled else []
        ledger += [cell(s.paused or "-", RECORD_LIMIT, style="yellow")] if paused else []
        ledger += [cell(s.trigger_pending or "-", RECORD_LIMIT)] if pending else []
        ledger += [cell(s.backfill_pending or "-", RECORD_LIMIT)] if backfill else []
        ledger += [cell(_keys(s), RECORD_LIMIT)] if keyed else []
        table.add_row(
            cell(s.job),
            *([cell(s.datacenter or "-")] if where else []),
            cell(s.key),
            _holder(s),
            cell(s.session or "-"),
            cell(_record(s.claims) if s.held else "-", RECORD_LIMIT),
            cell(s.lock_index if s.lock_index is not None else "-"),
            *ledger,
        )
    console().print(table)


def _keys(state: LockState) -> str:
    """`tenant-41, tenant-42`; `a, b, ... and 12 more (14)` past the few shown."""
    if not state.keys_seen_count:
        return "-"
    shown = ", ".join(state.keys_seen)
    more = state.keys_seen_count - len(state.keys_seen)
    return shown if not more else f"{shown} and {more} more ({state.keys_seen_count})"


def _holder(state: LockState) -> Text:
    if not state.held:
        return cell("free")
    holder = cell(state.node or "? (its session is not readable with this token)")
    if state.forged:
        holder.append("\n")
        holder.append_text(cell(f"forged? claims {state.claims['worker']}", style="bold red"))
    return holder


def _last_tick(state: LockState) -> Text:
    """`2026-12-01T02:00:00Z succeeded, worker-1`; `-` for a job without a schedule; and how
    many records are dated in the future, which are not the last tick."""
    last = state.last_tick
    if last is None:
        shown = cell("-" if state.next_tick is None else "none yet")
    else:
        style = "" if last.outcome in ("succeeded", "running") else "bold red"
        # an operator's hold or stop, or the job's own overlap policy's: said, not a failure
        operators = ("paused", "aborted", "cancelled", "buffered")
        style = "yellow" if last.outcome in operators else style
        shown = cell(f"{last.tick} ")
        shown.append_text(cell(last.outcome, style=style))
        if last.worker is not None:
            shown.append_text(cell(f", {last.worker}"))
    if state.suspect_ticks:
        shown.append("\n")
        suspect = f"+{state.suspect_ticks} suspect (dated in the future)"
        shown.append_text(cell(suspect, style="bold red"))
    return shown


def _record(claims: dict[str, str]) -> str:
    """`worker-1, host h1, pid 42, since 2026-...`: the fields the holder wrote, in that order."""
    labels = {"worker": "", "host": "host ", "pid": "pid ", "acquired_at": "since "}
    shown = [f"{label}{claims[name]}" for name, label in labels.items() if name in claims]
    return ", ".join(shown) or "(none)"
