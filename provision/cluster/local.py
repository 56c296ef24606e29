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

from provision.acl.agent_tokens import ensure_agent_token
from provision.acl.bootstrap import bootstrap_acl, wait_until_management_works
from provision.cluster import netns as ns
from provision.cluster import tls as cluster_tls
from provision.cluster.agent_config import ConfigDialect, render_agent_config
from provision.cluster.consul_binary import ConsulBinary, install_consul
from provision.cluster.layout import (
    DEFAULT_NETNS_SUBNET,
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
from provision.consul import NO_RETRY, Consul, ConsulError, PermissionDenied
from provision.errors import LocalEnvironmentError
from provision.system.deadline import Deadline, attempts, retry_until
from provision.system.files import SECRET_MODE, write_atomically
from provision.system.processes import is_running, read_pid, spawn, stop
from provision.system.secrets import Secret, read_secret_file, write_secret_file
from provision.system.templates import find_templates_dir, make_environment

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
# Consul 1.8 agents leave legacy ACL mode only at checks whose gap doubles from 50 ms to 30 s:
# on a slow machine a follower that missed the leader's switch can wait that long for its next.
LEGACY_MODE_CHECK_GAP = 30.0
POLL_PAUSE = 0.1
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


def cluster_up(
    state_dir: Path,
    *,
    subnet: str | None = None,  # None: DEFAULT_SUBNET, or DEFAULT_NETNS_SUBNET with netns
    workers: int | None = None,  # None: as recorded, else DEFAULT_WORKERS
    templates_dir: Path | None = None,
    log_level: str = "info",
    deadline: float = START_DEADLINE,
    netns: bool = False,
    tls: bool | None = None,  # None: as recorded, else DEFAULT_TLS
) -> UpResult:
    """Bring the cluster to healthy and bootstrapped, starting only what is not running."""
    began = time.monotonic()
    give_up = Deadline(deadline)
    layout, fresh = _layout_for_up(state_dir, subnet, workers, netns, tls)
    if layout.netns_prefix is not None:
        ns.require_root()
    binary = install_consul()
    templates = find_templates_dir(templates_dir)
    missing = [agent for agent in layout.agents if not _agent_running(layout, agent)]
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
    started = _start_missing_agents(layout, missing, binary, templates, log_level)
    try:
        with ns.entered(layout.driver_netns):
            management, bootstrapped = _bootstrap(layout, give_up)
            _wait_until_every_agent_accepts(layout, management, give_up)
            for agent in layout.agents:
                _give_agent_token(management, agent, templates, give_up)
            _wait_until_healthy(layout, management, give_up)
    except (ConsulError, LocalEnvironmentError) as exc:
        if started:
            _stop_agents(layout, [a for a in layout.agents if a.name in started])
        raise LocalEnvironmentError(
            f"cluster up failed: {exc} (agent logs: {layout.state_dir}/*/consul.log)"
        ) from None
    status = cluster_status(state_dir)
    return UpResult(status, binary, started, bootstrapped, time.monotonic() - began)


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
    stopped = _stop_agents(layout, list(layout.agents))
    ns.destroy_network(layout.state_dir)  # only the namespaces it recorded creating
    return DownResult(stopped, remove_cluster_files(layout))


def cluster_status(state_dir: Path) -> ClusterStatus:
    """What is running, reachable and healthy; never changes anything."""
    layout = load_layout(state_dir)
    if layout is None:
        raise _no_cluster(state_dir)
    token = _read_management_token(layout)
    settings = cluster_tls.consul_settings(layout, timeout=PROBE_TIMEOUT, token=token)
    probe = Consul(settings, retry=NO_RETRY)
    with ns.entered(layout.driver_netns):
        leader = _leader(layout, probe)
        acl_ready, health = False, {}
        if token is not None and leader:
            server = probe.with_settings(address=layout.servers[0].http_address)
            try:
                server.acl.read_self_token()
                acl_ready = True
                health = _serf_health(server)
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


def _layout_for_up(
    state_dir: Path, subnet: str | None, workers: int | None, netns: bool, tls: bool | None
) -> tuple[ClusterLayout, bool]:
    """The layout to bring up, and whether it is new (nothing recorded yet)."""
    existing = load_layout(state_dir)
    if existing is not None and workers is None:
        workers = len(existing.workers)  # recovering: keep what was started
    if existing is not None and existing.netns_prefix is not None:
        netns = True  # recovering a namespace cluster: it stays one
    if tls is None:  # recovering: as it was started; new: the default
        tls = existing.tls if existing is not None else DEFAULT_TLS
    if subnet is None and existing is not None:
        subnet = existing.servers[0].address.rsplit(".", 1)[0]  # recovering: where it runs
    if subnet is None:
        subnet = DEFAULT_NETNS_SUBNET if netns else DEFAULT_SUBNET
    wanted_workers = DEFAULT_WORKERS if workers is None else workers  # 0 is refused
    wanted = default_layout(state_dir, subnet, wanted_workers, netns=netns, tls=tls)
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
            f"{len(existing.workers)} workers, {'TLS' if existing.tls else 'plain HTTP'}); run "
            "`lockctl cluster down` first or use another --state-dir"
        )
    return existing, False


def _start_missing_agents(
    layout: ClusterLayout,
    missing: list[AgentSpec],
    binary: ConsulBinary,
    templates: Path,
    log_level: str,
) -> tuple[str, ...]:
    env = make_environment(templates)
    dialect = ConfigDialect.of(binary.version)
    gossip_key = cluster_tls.read_gossip_key(layout) if layout.tls else None
    for agent in missing:  # servers first: the layout lists them first
        layout.data_dir(agent).mkdir(parents=True, exist_ok=True)
        config = render_agent_config(
            env, layout, agent, dialect, gossip_key=gossip_key, log_level=log_level
        )
        # 0600: on a TLS cluster the config holds the gossip key (argv would show it to all).
        write_atomically(layout.config_file(agent), config, mode=SECRET_MODE)
        argv = [str(binary.path), "agent", f"-config-file={layout.config_file(agent)}"]
        if agent.netns is not None:
            argv = ns.exec_argv(agent.netns, argv)
        spawn(argv, layout.log_file(agent), layout.pidfile(agent))
    return tuple(agent.name for agent in missing)


def _bootstrap(layout: ClusterLayout, give_up: Deadline) -> tuple[Consul, bool]:
    """The management client, bootstrapping ACLs first if this cluster never was."""
    settings = cluster_tls.consul_settings(layout, address=layout.servers[0].http_address)
    anonymous = Consul(settings, retry=NO_RETRY)
    leader = _wait_for_leader(layout, anonymous, give_up)
    token = _read_management_token(layout)
    bootstrapped = False
    if token is None:
        leader_client = anonymous.with_settings(address=leader.http_address)
        minted = bootstrap_acl(leader_client, deadline=max(1.0, give_up.remaining()))
        if minted is None or minted.secret is None:
            raise LocalEnvironmentError(
                f"ACLs were bootstrapped before but {layout.management_token_file} is missing; "
                "run `lockctl cluster down` and `up` again"
            )
        write_secret_file(layout.management_token_file, minted.secret)
        token, bootstrapped = minted.secret, True
    # Management calls go to the leader: followers take a moment to know a new token.
    return anonymous.with_settings(address=leader.http_address, token=token), bootstrapped


def _wait_until_every_agent_accepts(
    layout: ClusterLayout, management: Consul, give_up: Deadline
) -> None:
    """Return only once every agent resolves the management token: callers may use any agent."""
    for agent in layout.agents:
        client = management.with_settings(address=agent.http_address)
        try:
            # At least one full check gap: the agent can only be waiting for its next check.
            wait = max(LEGACY_MODE_CHECK_GAP + 5.0, give_up.remaining())
            wait_until_management_works(client, deadline=wait)
        except PermissionDenied:
            raise LocalEnvironmentError(
                f"{agent.name} does not accept the token in {layout.management_token_file}; "
                "run `lockctl cluster down` and `up` again"
            ) from None


def _give_agent_token(
    management: Consul, agent: AgentSpec, templates: Path, give_up: Deadline
) -> None:
    """A restarted server may not know the management token for a moment (its ACL state is
    still replaying): retry a 403 from the agent itself until the deadline."""
    node_client = management.with_settings(address=agent.http_address)
    retry_until(
        give_up,
        lambda: ensure_agent_token(management, node_client, agent.name, templates),
        retry_on=(PermissionDenied,),
        pause=POLL_PAUSE,
    )


def _wait_for_leader(layout: ClusterLayout, client: Consul, give_up: Deadline) -> AgentSpec:
    by_raft_address = {f"{agent.address}:8300": agent for agent in layout.servers}
    for _ in attempts(give_up, POLL_PAUSE):
        leader = _leader(layout, client)
        if leader in by_raft_address:
            return by_raft_address[leader]
    raise LocalEnvironmentError("no Consul leader was elected in time")


def _leader(layout: ClusterLayout, client: Consul) -> str:
    for server in layout.servers:
        try:
            leader = client.with_settings(address=server.http_address).status.leader(retry=NO_RETRY)
        except ConsulError:
            continue
        if leader:
            return leader
    return ""


def _wait_until_healthy(layout: ClusterLayout, management: Consul, give_up: Deadline) -> None:
    """Every node registered with a passing serfHealth: sessions can be made on it."""
    for _ in attempts(give_up, POLL_PAUSE):
        health = _serf_health(management)
        unhealthy = [a.name for a in layout.agents if health.get(a.name) != "passing"]
        if not unhealthy:
            return
    raise LocalEnvironmentError(f"agents not healthy in time: {', '.join(unhealthy)}")


def _serf_health(client: Consul) -> dict[str, str]:
    try:
        checks = client.health.checks_in_state("any")
    except ConsulError:
        return {}
    return {c["Node"]: c["Status"] for c in checks if c.get("CheckID") == "serfHealth"}


def _agent_state(
    layout: ClusterLayout, agent: AgentSpec, probe: Consul, health: dict[str, str]
) -> AgentState:
    pid = read_pid(layout.pidfile(agent))
    running = _agent_running(layout, agent)
    try:
        probe.with_settings(address=agent.http_address).status.leader(retry=NO_RETRY)
        reachable = True
    except ConsulError:
        reachable = False
    return AgentState(agent, pid, running, reachable, health.get(agent.name, "unknown"))


def _agent_running(layout: ClusterLayout, agent: AgentSpec) -> bool:
    pid = read_pid(layout.pidfile(agent))
    return pid is not None and is_running(pid, str(layout.config_file(agent)))


def _stop_agents(layout: ClusterLayout, agents: list[AgentSpec]) -> tuple[str, ...]:
    by_pid = {}
    for agent in agents:
        pid = read_pid(layout.pidfile(agent))
        if pid is not None:
            by_pid[pid] = agent
    stopped = stop([(pid, str(layout.config_file(agent))) for pid, agent in by_pid.items()])
    for agent in agents:
        layout.pidfile(agent).unlink(missing_ok=True)
    return tuple(by_pid[pid].name for pid in stopped)


def _read_management_token(layout: ClusterLayout) -> Secret | None:
    path = layout.management_token_file
    return read_secret_file(path) if path.is_file() else None
