"""`lockctl cluster up|down|status|env`: a local cluster of real Consul agents on loopback.

Three servers and two client agents (worker-1, worker-2), each on its own loopback address with
default ports, ACLs on with default deny. `up` is idempotent: it starts what is not running
(recovering from a crash with the agents' own data), bootstraps ACLs once, gives every agent a
minimal agent token, and waits until every node is healthy. The same code starts the test
suite's cluster. With `netns` (root) each agent runs in its own network namespace
(provision/cluster/netns.py) and lockctl talks to them from the cluster's driver namespace. With
`tls` the agents serve HTTPS only, verify certificates both ways and encrypt gossip
(provision/cluster/tls.py); lockctl then calls them with its own client certificate.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from provision.cluster import netns as ns
from provision.cluster import tls as cluster_tls
from provision.cluster.agents import agent_running, start_missing_agents, stop_agents
from provision.cluster.consul_binary import ConsulBinary, install_consul
from provision.cluster.layout import (
    DEFAULT_NETNS_SUBNET,
    DEFAULT_SERVERS,
    DEFAULT_SUBNET,
    DEFAULT_TLS,
    DEFAULT_WORKERS,
    LAYOUT_FILE,
    AgentSpec,
    ClusterLayout,
    default_layout,
    load_layout,
    refuse_if_taken,
    remove_cluster_files,
    save_layout,
)
from provision.cluster.readiness import (
    bootstrap_management,
    find_leader,
    give_agent_token,
    read_management_token,
    serf_health,
    wait_until_every_agent_accepts,
    wait_until_healthy,
)
from provision.consul import NO_RETRY, Consul, ConsulError
from provision.errors import LocalEnvironmentError
from provision.system.deadline import Deadline
from provision.system.processes import read_pid
from provision.system.templates import find_templates_dir

# Consul's own TLS variables: a plain cluster's env unsets them, so none of a TLS cluster's
# lingers (CONSUL_HTTP_SSL would turn a host:port address into https://).
TLS_VARIABLES = (
    "CONSUL_CACERT",
    "CONSUL_CLIENT_CERT",
    "CONSUL_CLIENT_KEY",
    "CONSUL_HTTP_SSL",
    "CONSUL_HTTP_SSL_VERIFY",
)
START_DEADLINE = 120.0  # seconds for leader, bootstrap and healthy nodes, on a slow machine
PROBE_TIMEOUT = 2.0


@dataclass(frozen=True)
class AgentState:
    agent: AgentSpec
    pid: int | None
    running: bool
    reachable: bool
    health: str  # serfHealth as the servers see it: passing, critical, or unknown


@dataclass(frozen=True)
class ClusterStatus:
    layout: ClusterLayout
    agents: tuple[AgentState, ...]
    leader: str
    acl_ready: bool  # the management token file exists and Consul accepts it

    @property
    def healthy(self) -> bool:
        every_agent = all(a.running and a.reachable and a.health == "passing" for a in self.agents)
        return every_agent and bool(self.leader) and self.acl_ready


@dataclass(frozen=True)
class UpResult:
    status: ClusterStatus
    consul: ConsulBinary
    started: tuple[str, ...]  # agents started by this call (empty when all were running)
    bootstrapped: bool  # ACLs were bootstrapped by this call
    seconds: float


@dataclass(frozen=True)
class ClusterShape:
    """The cluster `up` is asked for. A cluster already recorded in the state folder is
    recovered as it was started where a field is None (and stays a namespace cluster)."""

    subnet: str | None = None  # None: as recorded, else DEFAULT_SUBNET (DEFAULT_NETNS_SUBNET)
    workers: int | None = None  # None: as recorded, else DEFAULT_WORKERS
    netns: bool = False
    tls: bool | None = None  # None: as recorded, else DEFAULT_TLS
    servers: int | None = None  # None: as recorded, else DEFAULT_SERVERS (1 or 3)
    datacenters: int = 1  # more: a federation (provision/cluster/federation.py)


@dataclass(frozen=True)
class UpTerms:
    """How `up` works, whatever the cluster: its templates, the agents' log level, the
    deadline every wait shares."""

    templates: Path
    log_level: str
    give_up: Deadline


def cluster_up(
    state_dir: Path,
    shape: ClusterShape = ClusterShape(),  # frozen, so a shared default is safe
    *,
    templates_dir: Path | None = None,
    log_level: str = "info",
    deadline: float = START_DEADLINE,
) -> UpResult:
    """Bring the cluster to healthy and bootstrapped, starting only what is not running."""
    began = time.monotonic()
    terms = UpTerms(find_templates_dir(templates_dir), log_level, Deadline(deadline))
    layout, fresh = _layout_for_up(state_dir, shape)
    if layout.netns_prefix is not None:
        ns.require_root()  # before anything is installed or written
    binary = install_consul()
    started, bootstrapped = bring_up(layout, fresh, binary, terms)
    status = cluster_status(state_dir)
    return UpResult(status, binary, started, bootstrapped, time.monotonic() - began)


def bring_up(
    layout: ClusterLayout, fresh: bool, binary: ConsulBinary, terms: UpTerms
) -> tuple[tuple[str, ...], bool]:
    """Start what of `layout` is not running and wait until it is bootstrapped and healthy:
    the agents started, and whether ACLs were bootstrapped now. A secondary datacenter's
    management token is the primary's, already in its folder: it bootstraps nothing."""
    state_dir, templates, give_up = layout.state_dir, terms.templates, terms.give_up
    missing = [agent for agent in layout.agents if not agent_running(layout, agent)]
    if layout.netns_prefix is None:  # a fresh namespace has nothing in the way
        for agent in missing:
            refuse_if_taken(agent)
    else:
        ns.ensure_iproute2()
    if fresh:  # only now, so a refused `up` leaves nothing behind
        # 0700: the agents' data holds every token secret (raft state, persisted agent tokens).
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        state_dir.chmod(0o700)
        save_layout(layout)
    if layout.netns_prefix is not None:
        subnet_of_layout = layout.servers[0].address.rsplit(".", 1)[0]
        hosts = [layout.host(agent) for agent in layout.agents]
        ns.create_network(layout.state_dir, layout.netns_prefix, subnet_of_layout, hosts)
    if layout.tls:
        cluster_tls.ensure_tls_material(layout, binary)
    started = start_missing_agents(layout, missing, binary, templates, terms.log_level)
    try:
        with ns.entered(layout.driver_netns):
            management, bootstrapped = bootstrap_management(layout, give_up)
            wait_until_every_agent_accepts(layout, management, give_up)
            for agent in layout.agents:
                give_agent_token(management, agent, templates, give_up)
            wait_until_healthy(layout, management, give_up)
    except (ConsulError, LocalEnvironmentError) as exc:
        if started:
            stop_agents(layout, [a for a in layout.agents if a.name in started])
        raise LocalEnvironmentError(
            f"cluster up failed: {exc} (agent logs: {layout.state_dir}/*/consul.log)"
        ) from None
    return started, bootstrapped


@dataclass(frozen=True)
class DownResult:
    stopped: tuple[str, ...]  # the agents that were running and were stopped
    kept: tuple[Path, ...]  # files in the state folder that lockctl did not make, left alone


def cluster_down(state_dir: Path) -> DownResult:
    """Stop the agents this state folder started (by pidfile) and delete what lockctl made in
    it: the layout, the management token, each agent's folder; nothing else."""
    layout = load_layout(state_dir)
    if layout is None:
        if state_dir.exists() and any(state_dir.iterdir()):
            raise LocalEnvironmentError(
                f"{state_dir}: not a lockctl cluster folder (no {LAYOUT_FILE}); not touching it"
            )
        return DownResult((), ())
    stopped = stop_agents(layout, list(layout.agents))
    ns.destroy_network(layout.state_dir)  # only the namespaces it recorded creating
    return DownResult(stopped, remove_cluster_files(layout))


def cluster_status(state_dir: Path) -> ClusterStatus:
    """What is running, reachable and healthy; never changes anything."""
    layout = load_layout(state_dir)
    if layout is None:
        raise _no_cluster(state_dir)
    token = read_management_token(layout)
    settings = cluster_tls.consul_settings(layout, timeout=PROBE_TIMEOUT, token=token)
    probe = Consul(settings, retry=NO_RETRY)
    with ns.entered(layout.driver_netns):
        leader = find_leader(layout, probe)
        acl_ready, health = False, {}
        if token is not None and leader:
            server = probe.with_settings(address=layout.servers[0].http_address)
            try:
                server.acl.read_self_token()
                acl_ready = True
                health = serf_health(server)
            except ConsulError:
                pass
        agents = tuple(_agent_state(layout, agent, probe, health) for agent in layout.agents)
    return ClusterStatus(layout, agents, leader, acl_ready)


@dataclass(frozen=True)
class ClusterEnv:
    """The exports that point Consul tools (and lockctl) at a cluster's first server."""

    exports: tuple[tuple[str, str], ...]
    # Namespace mode: the addresses answer only inside this network namespace (the driver's).
    namespace: str | None = None
    unset: tuple[str, ...] = ()  # variables a previous cluster's exports may have left set
    # A federation's other datacenters and their first servers' addresses: the exports'
    # certificates reach them too (one CA)
    others: tuple[tuple[str, str], ...] = ()


def cluster_env(state_dir: Path) -> ClusterEnv:
    """The environment that points Consul tools (and lockctl) at this cluster's first server."""
    layout = load_layout(state_dir)
    if layout is None:
        raise _no_cluster(state_dir)
    exports = (
        ("CONSUL_HTTP_ADDR", layout.servers[0].http_address),
        ("CONSUL_HTTP_TOKEN_FILE", str(layout.management_token_file)),
        *cluster_tls.tls_exports(layout),
    )
    exported = {name for name, _ in exports}
    unset = tuple(name for name in TLS_VARIABLES if name not in exported)
    return ClusterEnv(exports, layout.driver_netns, ("CONSUL_HTTP_TOKEN", *unset))


def _no_cluster(state_dir: Path) -> LocalEnvironmentError:
    return LocalEnvironmentError(f"no cluster in {state_dir} (start one: lockctl cluster up)")


def _layout_for_up(state_dir: Path, shape: ClusterShape) -> tuple[ClusterLayout, bool]:
    """The layout to bring up, and whether it is new (nothing recorded yet)."""
    subnet, workers, netns, tls = shape.subnet, shape.workers, shape.netns, shape.tls
    servers = shape.servers
    existing = load_layout(state_dir)
    if existing is not None and workers is None:
        workers = len(existing.workers)  # recovering: keep what was started
    if existing is not None and servers is None:
        servers = len(existing.servers)
    if existing is not None and existing.netns_prefix is not None:
        netns = True  # recovering a namespace cluster: it stays one
    if tls is None:  # recovering: as it was started; new: the default
        tls = existing.tls if existing is not None else DEFAULT_TLS
    if subnet is None and existing is not None:
        subnet = existing.servers[0].address.rsplit(".", 1)[0]  # recovering: where it runs
    if subnet is None:
        subnet = DEFAULT_NETNS_SUBNET if netns else DEFAULT_SUBNET
    wanted_workers = DEFAULT_WORKERS if workers is None else workers  # 0 is refused
    wanted_servers = DEFAULT_SERVERS if servers is None else servers
    wanted = default_layout(
        state_dir, subnet, wanted_workers, netns=netns, tls=tls, servers=wanted_servers
    )
    if existing is None:
        if state_dir.exists() and any(state_dir.iterdir()):
            raise LocalEnvironmentError(
                f"{state_dir}: exists and is not a lockctl cluster folder; choose another "
                "--state-dir"
            )
        return wanted, True
    if existing.agents != wanted.agents:
        raise LocalEnvironmentError(
            f"{state_dir} holds a different cluster ({existing.servers[0].address}, "
            f"{len(existing.servers)} servers, {len(existing.workers)} workers, "
            f"{'TLS' if existing.tls else 'plain HTTP'}); run "
            "`lockctl cluster down` first or use another --state-dir"
        )
    return existing, False


def _agent_state(
    layout: ClusterLayout, agent: AgentSpec, probe: Consul, health: dict[str, str]
) -> AgentState:
    pid = read_pid(layout.pidfile(agent))
    running = agent_running(layout, agent)
    try:
        probe.with_settings(address=agent.http_address).status.leader(retry=NO_RETRY)
        reachable = True
    except ConsulError:
        reachable = False
    return AgentState(agent, pid, running, reachable, health.get(agent.name, "unknown"))
