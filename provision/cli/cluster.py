"""`lockctl cluster up|down|status|env`."""

from __future__ import annotations

import typer

app = typer.Typer(help="A local cluster of real Consul agents on loopback, ACLs on.", no_args_is_help=True)
