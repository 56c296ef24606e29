"""`lockctl cluster up|down|status|env`."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from provision.cli import options
from provision.cli.output import cell, console
from provision.cluster.layout import (
    DEFAULT_NETNS_SUBNET,
    DEFAULT_SERVERS,
    DEFAULT_STATE_DIR,
    DEFAULT_SUBNET,
    DEFAULT_TLS,
    DEFAULT_WORKERS,
)
from provision.errors import EXIT_FAILED
from provision.system.text import printable

if TYPE_CHECKING:  # the core is imported lazily: `lockctl run` must start fast
    from provision.cluster.federation import FederationStatus
    from provision.cluster.local import ClusterShape, ClusterStatus

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


Workers = Annotated[
    int | None,
    typer.Option(
        "--workers",
        help=f"Client agents worker-1..N at .21, .22, ... \\[default: {DEFAULT_WORKERS}, or "
        "as already started]",
        show_default=False,
    ),
]
Servers = Annotated[
    int | None,
    typer.Option(
        "--servers",
        help=f"Servers per datacenter: 3 or 1 \\[default: {DEFAULT_SERVERS}, or as already "
        "started]",
        show_default=False,
    ),
]
Datacenters = Annotated[
    int,
    typer.Option(
        "--datacenters",
        help="Datacenters federated over the WAN: dc1 (the primary, on --subnet) and dc2... on "
        "the next /24s, ACLs replicated from dc1, each in <state-dir>/dcN.",
    ),
]
Netns = Annotated[
    bool,
    typer.Option(
        "--netns",
        help="Root only: each agent in its own network namespace on a bridge, so one host "
        "can be cut off (fault tests). Talk to it with `ip netns exec <prefix>-driver ...`.",
    ),
]
Tls = Annotated[
    bool | None,
    typer.Option(
        "--tls/--no-tls",
        help="HTTPS only with certificates verified both ways (a CA and per-agent "
        "certificates made with `consul tls`) and encrypted gossip (`consul keygen`); keys "
        f"0600 in <state-dir>/tls. \\[default: {'--tls' if DEFAULT_TLS else '--no-tls'}, or as "
        "already started]",
        show_default=False,
    ),
]


@dataclass(frozen=True)
class UpFlags:
    """`cluster up`'s flags (their order is --help's): where, what shape, how."""

    state_dir: StateDir = DEFAULT_STATE_DIR
    subnet: Subnet = None
    workers: Workers = None
    servers: Servers = None
    datacenters: Datacenters = 1
    templates_dir: options.TemplatesDir = None
    netns: Netns = False
    tls: Tls = None


@app.command()
@options.flags_command(UpFlags)
def up(flags: UpFlags) -> None:
    """Start (or recover) the cluster, bootstrap ACLs, and wait until every agent is healthy."""
    from provision.cluster.federation import is_federation
    from provision.cluster.local import ClusterShape, cluster_up

    shape = ClusterShape(
        flags.subnet, flags.workers, flags.netns, flags.tls, flags.servers, flags.datacenters
    )
    state_dir, templates_dir = flags.state_dir, flags.templates_dir
    if flags.datacenters > 1 or is_federation(state_dir):
        _federation_up(state_dir, shape, templates_dir)
        return
    result = cluster_up(state_dir, shape, templates_dir=templates_dir)
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


def _federation_up(state_dir: Path, shape: ClusterShape, templates_dir: Path | None) -> None:
    from provision.cluster.federation import federation_up

    result = federation_up(state_dir, shape, templates_dir=templates_dir)
    primary = result.status.datacenters[0].cluster.layout
    typer.echo(f"{result.consul.describe()}")
    typer.echo(f"started: {', '.join(result.started) or 'none (all were running)'}")
    typer.echo(f"ACLs: {'bootstrapped now' if result.bootstrapped else 'bootstrapped before'}")
    typer.echo(f"ready in {result.seconds:.1f} s")
    typer.echo(f"management token: {primary.management_token_file} (mode 0600, never printed)")
    _print_federation(result.status)
    typer.echo('use it: eval "$(lockctl cluster env)"')


@app.command()
def down(state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Stop the agents this cluster started (by pidfile) and delete its data."""
    from provision.cluster.federation import federation_down, is_federation
    from provision.cluster.local import cluster_down

    result = federation_down(state_dir) if is_federation(state_dir) else cluster_down(state_dir)
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
    from provision.cluster.federation import federation_status, is_federation
    from provision.cluster.local import cluster_status

    if is_federation(state_dir):
        federation = federation_status(state_dir)
        if as_json:
            typer.echo(json.dumps(_federation_record(federation), indent=2))
        else:
            _print_federation(federation)
        if not federation.healthy:
            raise typer.Exit(EXIT_FAILED)
        return
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
    from provision.cluster.federation import federation_env, is_federation
    from provision.cluster.local import cluster_env

    found = federation_env(state_dir) if is_federation(state_dir) else cluster_env(state_dir)
    if found.namespace is not None:
        typer.echo(
            f"# namespace mode: these addresses answer only inside network namespace "
            f"{found.namespace}; run tools there: ip netns exec {found.namespace} consul members"
        )
    typer.echo(f"unset {' '.join(found.unset)}")
    for name, value in found.exports:
        typer.echo(f"export {name}={shlex.quote(value)}")
    tls = any(name == "CONSUL_CACERT" for name, _ in found.exports)
    for datacenter, address in found.others:
        same = " (these certificates are good there too: one CA)" if tls else ""
        typer.echo(f"# datacenter {datacenter}: --address {address}{same}")


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


def _federation_record(federation: FederationStatus) -> dict[str, object]:
    return {
        "healthy": federation.healthy,
        "datacenters": [
            {
                "datacenter": dc.cluster.layout.datacenter,
                "primary": not dc.cluster.layout.secondary,
                "wan": list(dc.wan),
                "replication": None if dc.replication is None else dc.replication.kind,
                "replicating": dc.replicating,
                **_status_record(dc.cluster),
            }
            for dc in federation.datacenters
        ],
    }


def _print_federation(federation: FederationStatus) -> None:
    """Each datacenter's agents, then what its servers see over the WAN and its replication
    (Consul's answers: made printable)."""
    for dc in federation.datacenters:
        layout = dc.cluster.layout
        role = "secondary" if layout.secondary else "primary"
        typer.echo(f"datacenter {layout.datacenter} ({role})")
        _print_status(dc.cluster)
        wan = printable(", ".join(dc.wan), LEADER_LIMIT) or "none"
        if dc.replication is None:
            replication = "none (the primary)" if not layout.secondary else "unknown"
        else:
            kind = printable(dc.replication.kind, LEADER_LIMIT) or "none"
            running = "running" if dc.replication.running else "stopped"
            replication = f"{kind}, {running}, token index {dc.replication.replicated_token_index}"
        typer.echo(f"WAN: {wan}   ACL replication: {replication}")
    typer.echo(f"federation healthy: {'yes' if federation.healthy else 'no'}")
