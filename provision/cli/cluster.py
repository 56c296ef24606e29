"""`lockctl cluster up|down|status|env`."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from provision.cli import options
from provision.cli.output import cell, console
from provision.cluster.layout import (
    DEFAULT_NETNS_SUBNET,
    DEFAULT_STATE_DIR,
    DEFAULT_SUBNET,
    DEFAULT_TLS,
    DEFAULT_WORKERS,
)
from provision.errors import EXIT_FAILED
from provision.system.text import printable

if TYPE_CHECKING:  # the core is imported lazily: `lockctl run` must start fast
    from provision.cluster.local import ClusterStatus

app = typer.Typer(
    help="A local cluster of real Consul agents on loopback, ACLs on (default deny).\n\n"
    "3 servers and a client agent per worker (worker-1 and worker-2 unless --workers says), "
    "HTTPS only and gossip encrypted unless --no-tls.",
    no_args_is_help=True,
)

StateDir = Annotated[
    Path,
    typer.Option(
        "--state-dir",
        envvar="LOCKCTL_CLUSTER_DIR",
        help="Folder for the agents' configs, data, logs, pidfiles and the management token.",
    ),
]
Subnet = Annotated[
    str | None,
    typer.Option(
        "--subnet",
        envvar="LOCKCTL_CLUSTER_SUBNET",
        help=f"/24 for the agents' addresses: loopback \\[default: {DEFAULT_SUBNET}], or private "
        f"with --netns \\[default: {DEFAULT_NETNS_SUBNET}]; up on a started cluster: as started.",
        show_default=False,
    ),
]
LEADER_LIMIT = 80  # an address:port; Consul's answer, so bounded
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


@app.command()
def up(
    state_dir: StateDir = DEFAULT_STATE_DIR,
    subnet: Subnet = None,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            help=f"Client agents worker-1..N at .21, .22, ... \\[default: {DEFAULT_WORKERS}, or "
            "as already started]",
            show_default=False,
        ),
    ] = None,
    templates_dir: options.TemplatesDir = None,
    netns: Annotated[
        bool,
        typer.Option(
            "--netns",
            help="Root only: each agent in its own network namespace on a bridge, so one host "
            "can be cut off (fault tests). Talk to it with `ip netns exec <prefix>-driver ...`.",
        ),
    ] = False,
    tls: Annotated[
        bool | None,
        typer.Option(
            "--tls/--no-tls",
            help="HTTPS only with certificates verified both ways (a CA and per-agent "
            "certificates made with `consul tls`) and encrypted gossip (`consul keygen`); keys "
            f"0600 in <state-dir>/tls. \\[default: {'--tls' if DEFAULT_TLS else '--no-tls'}, or as "
            "already started]",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Start (or recover) the cluster, bootstrap ACLs, and wait until every agent is healthy."""
    from provision.cluster.local import ClusterShape, cluster_up

    result = cluster_up(
        state_dir,
        ClusterShape(subnet=subnet, workers=workers, netns=netns, tls=tls),
        templates_dir=templates_dir,
    )
    started = ", ".join(result.started) or "none (all were running)"
    typer.echo(f"{result.consul.describe()}")
    typer.echo(f"started: {started}")
    typer.echo(f"ACLs: {'bootstrapped now' if result.bootstrapped else 'bootstrapped before'}")
    typer.echo(f"ready in {result.seconds:.1f} s")
    token_file = result.status.layout.management_token_file
    typer.echo(f"management token: {token_file} (mode 0600, never printed)")
    layout = result.status.layout
    if layout.tls:
        typer.echo(
            f"TLS: HTTPS only, certificates verified both ways, gossip encrypted; CA, keys "
            f"(mode 0600, never printed) and gossip key in {layout.tls_dir}"
        )
    driver = result.status.layout.driver_netns
    if driver is not None:
        typer.echo(
            "namespaces: the agents' addresses exist only inside them; "
            f"use: ip netns exec {driver} ..."
        )
    _print_status(result.status)
    typer.echo('use it: eval "$(lockctl cluster env)"')


@app.command()
def down(state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Stop the agents this cluster started (by pidfile) and delete its data."""
    from provision.cluster.local import cluster_down

    result = cluster_down(state_dir)
    stopped = ", ".join(result.stopped) or "nothing was running"
    if not result.kept:
        typer.echo(f"stopped: {stopped}; removed {state_dir}")
        return
    shown = ", ".join(
        _printable(path.relative_to(state_dir.absolute())) for path in result.kept[:5]
    )
    more = f" and {len(result.kept) - 5} more" if len(result.kept) > 5 else ""
    typer.echo(
        f"stopped: {stopped}; removed what lockctl made in {state_dir}, kept what it did not "
        f"make: {shown}{more}"
    )


@app.command()
def status(state_dir: StateDir = DEFAULT_STATE_DIR, as_json: AsJson = False) -> None:
    """Show each agent's process, reachability and health; exit 1 unless all is well."""
    from provision.cluster.local import cluster_status

    current = cluster_status(state_dir)
    if as_json:
        typer.echo(json.dumps(_status_record(current), indent=2))
    else:
        _print_status(current)
    if not current.healthy:
        raise typer.Exit(EXIT_FAILED)


@app.command()
def env(state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Print the shell exports that point consul and lockctl at this cluster.

    Use: eval "$(lockctl cluster env)". A namespace cluster (up --netns) answers only inside its
    driver namespace: the output says so in a comment, with the command prefix to use.
    """
    from provision.cluster.local import cluster_env

    found = cluster_env(state_dir)
    if found.namespace is not None:
        typer.echo(
            f"# namespace mode: these addresses answer only inside network namespace "
            f"{found.namespace}; run tools there: ip netns exec {found.namespace} consul members"
        )
    typer.echo(f"unset {' '.join(found.unset)}")
    for name, value in found.exports:
        typer.echo(f"export {name}={shlex.quote(value)}")


def _printable(path: Path) -> str:
    """A file name someone else chose, safe for a terminal."""
    return "".join(c if c.isprintable() else "?" for c in str(path))


def _status_record(current: ClusterStatus) -> dict[str, object]:
    return {
        "healthy": current.healthy,
        "leader": current.leader,
        "acl_ready": current.acl_ready,
        "agents": [
            {
                "name": state.agent.name,
                "role": "server" if state.agent.server else "client",
                "address": state.agent.http_address,
                "pid": state.pid,
                "running": state.running,
                "reachable": state.reachable,
                "health": state.health,
            }
            for state in current.agents
        ],
    }


def _print_status(current: ClusterStatus) -> None:
    """The leader and the serfHealth states are Consul's answers: shown escaped, never markup."""
    from rich.table import Table

    api = "https" if current.layout.tls else "http"
    table = Table("agent", "role", "address", "pid", "process", api, "serfHealth")
    for state in current.agents:
        table.add_row(
            state.agent.name,
            "server" if state.agent.server else "client",
            state.agent.http_address.split("://", 1)[1],
            str(state.pid or "-"),
            "running" if state.running else "stopped",
            "ok" if state.reachable else "unreachable",
            cell(state.health),
        )
    console().print(table)
    leader = printable(current.leader, LEADER_LIMIT) or "none"
    acl = "bootstrapped, management token accepted" if current.acl_ready else "not ready"
    typer.echo(f"leader: {leader}   ACLs: {acl}   healthy: {'yes' if current.healthy else 'no'}")
