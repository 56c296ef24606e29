"""`lockctl status`: who holds each job's lock, as a table or JSON."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

from provision.cli import options
from provision.cli.output import console

if TYPE_CHECKING:
    from provision.runner.status import LockState


@options.consul_command
def status(
    connection: options.Connection,
    spec_file: options.SpecFile = options.DEFAULT_SPEC,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Who holds each job's lock (consistent reads): session, node, since when, LockIndex."""
    from provision.runner.status import lock_states
    from provision.spec import load_spec

    spec = load_spec(spec_file)
    states = lock_states(connection.connect(), spec)
    if as_json:
        typer.echo(json.dumps([state.to_record() for state in states], indent=2))
        return
    _print(states)


def _print(states: list[LockState]) -> None:
    from rich.table import Table

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
