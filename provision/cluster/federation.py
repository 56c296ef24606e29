"""`lockctl cluster up --datacenters N`: local clusters, one per datacenter, federated over the
WAN on loopback, as Consul federates datacenters: dc1 the primary (ACLs bootstrapped there),
dc2... secondaries that join its servers over the WAN and replicate its policies and global
tokens with a replication token.

Each datacenter is a whole local cluster (provision/cluster/local.py) in a folder of its own,
`<state-dir>/dcN`, on its own /24: the subnet given for dc1, the next /24s for the others. A
secondary's agents are named after it (`dc2-server-1`, `dc2-worker-1`): node names stay unique
across the federation, as the spec's worker names are. Every datacenter shares the primary's CA
(each server's certificate names its own datacenter: `server.dc2.consul`), gossip key and
management token; a secondary's own is its replication token.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

from provision.cluster import tls as cluster_tls
from provision.cluster.agents import stop_agents
from provision.cluster.consul_binary import ConsulBinary, install_consul
from provision.cluster.layout import (
    DEFAULT_SERVERS,
    DEFAULT_SUBNET,
    DEFAULT_TLS,
    DEFAULT_WORKERS,
    ClusterLayout,
    default_layout,
    load_layout,
)
from provision.cluster.local import (
    PROBE_TIMEOUT,
    START_DEADLINE,
    ClusterEnv,
    ClusterShape,
    ClusterStatus,
    DownResult,
    UpTerms,
    bring_up,
    cluster_down,
    cluster_env,
    cluster_status,
)
from provision.cluster.readiness import POLL_PAUSE, read_management_token
from provision.consul import NO_RETRY, Consul, ConsulError
from provision.consul.models import AclReplication
from provision.errors import InputError, LocalEnvironmentError
from provision.spec.names import MANAGED_MARKER
from provision.system.deadline import Deadline, attempts
from provision.system.files import PUBLIC_MODE, SECRET_MODE, write_atomically
from provision.system.secrets import Secret, write_secret_file
from provision.system.templates import find_templates_dir

FEDERATION_FILE = "federation.json"
MAX_DATACENTERS = 4
PRIMARY = "dc1"
# A secondary's servers copy the primary's ACLs with it (Consul's documented replication
# policy for 1.8: ACL writes, operator writes, and reads of services for intentions)
REPLICATION_POLICY = "lockctl-acl-replication"
REPLICATION_RULES = """# ACL replication from the primary datacenter: rendered by lockctl.
acl = "write"
operator = "write"
service_prefix "" {
  policy     = "read"
  intentions = "read"
}
"""
# Two datacenters start one after the other, and a secondary waits for its replication
FEDERATION_DEADLINE = 2 * START_DEADLINE
# Consul switches a secondary from "legacy" to "tokens" replication some 20 s after it starts
# (CONSUL_FACTS); only then are the primary's new tokens copied
TOKENS_REPLICATION = "tokens"


@dataclass(frozen=True)
class DatacenterStatus:
    """One datacenter of a federation: its cluster, the datacenters its servers see over the
    WAN, and (a secondary's) its ACL replication."""

    cluster: ClusterStatus
    wan: tuple[str, ...]
    replication: AclReplication | None

    @property
    def replicating(self) -> bool:
        """A primary needs none; a secondary copies tokens from the primary."""
        if not self.cluster.layout.secondary:
            return True
        state = self.replication
        return state is not None and state.running and state.kind == TOKENS_REPLICATION


@dataclass(frozen=True)
class FederationStatus:
    datacenters: tuple[DatacenterStatus, ...]  # the primary first

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(dc.cluster.layout.datacenter for dc in self.datacenters)

    @property
    def healthy(self) -> bool:
        """Every datacenter healthy, seeing all the others over the WAN, and replicating."""
        every = set(self.names)
        return all(
            dc.cluster.healthy and every <= set(dc.wan) and dc.replicating
            for dc in self.datacenters
        )


@dataclass(frozen=True)
class FederationUp:
    status: FederationStatus
    consul: ConsulBinary
    started: tuple[str, ...]
    bootstrapped: bool
    seconds: float


def is_federation(state_dir: Path) -> bool:
    return (state_dir.absolute() / FEDERATION_FILE).is_file()


def federation_up(
    state_dir: Path,
    shape: ClusterShape,
    *,
    templates_dir: Path | None = None,
    log_level: str = "info",
    deadline: float = FEDERATION_DEADLINE,
) -> FederationUp:
    """Bring every datacenter up, the primary first, and wait until they see each other over
    the WAN and every secondary replicates the primary's tokens."""
    began = time.monotonic()
    terms = UpTerms(find_templates_dir(templates_dir), log_level, Deadline(deadline))
    layouts = _layouts_for_up(state_dir, shape)
    binary = install_consul()
    if not is_federation(state_dir):
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        record = {"datacenters": [layout.datacenter for layout in layouts]}
        text = json.dumps(record, indent=2) + "\n"
        write_atomically(state_dir / FEDERATION_FILE, text, mode=PUBLIC_MODE)
    primary = layouts[0]
    runs: list[tuple[ClusterLayout, tuple[str, ...]]] = []  # what this call started, where
    try:
        names, bootstrapped = bring_up(primary, not _recorded(primary), binary, terms)
        runs.append((primary, names))
        for layout in layouts[1:]:
            fresh = not _recorded(layout)
            _prepare_secondary(primary, layout)
            names, _ = bring_up(layout, fresh, binary, terms)
            runs.append((layout, names))
        _wait_until_federated(layouts, terms.give_up)
    except (ConsulError, LocalEnvironmentError):
        # as one cluster's `up`: what this call started is stopped again (a datacenter whose
        # own bring-up failed has already stopped its agents)
        for layout, names in reversed(runs):
            stop_agents(layout, [agent for agent in layout.agents if agent.name in names])
        raise
    started = tuple(name for _, names in runs for name in names)
    status = federation_status(state_dir)
    return FederationUp(status, binary, started, bootstrapped, time.monotonic() - began)


def federation_down(state_dir: Path) -> DownResult:
    """Stop every datacenter, the secondaries first, and delete what lockctl made."""
    layouts = _recorded_layouts(state_dir)
    stopped: tuple[str, ...] = ()
    kept: tuple[Path, ...] = ()
    for layout in reversed(layouts):
        result = cluster_down(layout.state_dir)
        stopped += result.stopped
        kept += result.kept
    (state_dir.absolute() / FEDERATION_FILE).unlink(missing_ok=True)
    if not kept:
        try:
            state_dir.rmdir()
        except OSError:
            kept += tuple(sorted(state_dir.absolute().iterdir()))
    return DownResult(stopped, kept)


def federation_status(state_dir: Path) -> FederationStatus:
    """Each datacenter's cluster, what it sees over the WAN, its replication; changes nothing."""
    return FederationStatus(tuple(_datacenter_status(dc) for dc in _recorded_layouts(state_dir)))


def federation_env(state_dir: Path) -> ClusterEnv:
    """The primary's exports (ACL writes go there), and where the other datacenters answer."""
    primary, *others = _recorded_layouts(state_dir)
    found = cluster_env(primary.state_dir)
    addresses = tuple((dc.datacenter, dc.servers[0].http_address) for dc in others)
    return dataclasses.replace(found, others=addresses)


def datacenter_layouts(state_dir: Path, shape: ClusterShape) -> tuple[ClusterLayout, ...]:
    """The datacenters `shape` asks for: dcN in `<state-dir>/dcN` on the Nth /24 from the
    subnet given, the primary first."""
    count = shape.datacenters
    if not 2 <= count <= MAX_DATACENTERS:
        raise InputError(f"--datacenters {count}: must be 1..{MAX_DATACENTERS}")
    if shape.netns:
        raise InputError("--netns: a federation runs on loopback only (--datacenters 1)")
    subnet = shape.subnet or DEFAULT_SUBNET
    first, _, third = subnet.rpartition(".")
    if not third.isdigit() or int(third) + count - 1 > 255:
        raise InputError(f"--subnet {subnet}: {count} datacenters need {count} /24s after it")
    tls = DEFAULT_TLS if shape.tls is None else shape.tls
    layouts = []
    for number in range(1, count + 1):
        name = f"dc{number}"
        base = default_layout(
            state_dir.absolute() / name,
            f"{first}.{int(third) + number - 1}",
            DEFAULT_WORKERS if shape.workers is None else shape.workers,
            tls=tls,
            servers=DEFAULT_SERVERS if shape.servers is None else shape.servers,
        )
        layouts.append(_as_datacenter(base, name))
    primary_servers = tuple(agent.address for agent in layouts[0].servers)
    return tuple(
        dataclasses.replace(layout, wan_join=primary_servers) if layout.secondary else layout
        for layout in layouts
    )


def _as_datacenter(base: ClusterLayout, name: str) -> ClusterLayout:
    """`base` as the federation's datacenter `name`: a secondary's agents renamed after it."""
    agents = base.agents
    if name != PRIMARY:
        agents = tuple(dataclasses.replace(a, name=f"{name}-{a.name}") for a in agents)
    return dataclasses.replace(base, agents=agents, datacenter=name, primary_datacenter=PRIMARY)


def _layouts_for_up(state_dir: Path, shape: ClusterShape) -> tuple[ClusterLayout, ...]:
    """The recorded federation (recovering), or a new one where nothing is."""
    if is_federation(state_dir):
        recorded = _recorded_layouts(state_dir)
        if shape.datacenters not in (1, len(recorded)):
            raise LocalEnvironmentError(
                f"{state_dir} holds {len(recorded)} datacenters; run `lockctl cluster down` "
                "first or use another --state-dir"
            )
        return recorded
    if state_dir.exists() and any(state_dir.iterdir()):
        raise LocalEnvironmentError(
            f"{state_dir}: exists and is not a federation's folder; choose another --state-dir "
            "or run `lockctl cluster down` first"
        )
    return datacenter_layouts(state_dir, shape)


def _recorded(layout: ClusterLayout) -> bool:
    return load_layout(layout.state_dir) is not None


def _recorded_layouts(state_dir: Path) -> tuple[ClusterLayout, ...]:
    path = state_dir.absolute() / FEDERATION_FILE
    try:
        names = [str(name) for name in json.loads(path.read_text(encoding="utf-8"))["datacenters"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LocalEnvironmentError(f"{path}: unreadable federation record ({exc})") from None
    layouts = []
    for name in names:
        layout = load_layout(state_dir.absolute() / name)
        if layout is None:
            raise LocalEnvironmentError(
                f"{state_dir.absolute() / name}: datacenter {name} has no cluster record; run "
                "`lockctl cluster down` and `up` again"
            )
        layouts.append(layout)
    return tuple(layouts)


def _prepare_secondary(primary: ClusterLayout, layout: ClusterLayout) -> None:
    """What a secondary takes from the primary before its agents start: the CA and gossip key
    (WAN gossip and RPC verify both ends against one CA), the management token (global), and
    a replication token of its own, each written 0600 unless already there."""
    layout.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    layout.state_dir.chmod(0o700)
    management = read_management_token(primary)
    if management is None:
        raise LocalEnvironmentError(f"{primary.management_token_file} is missing")
    if not layout.management_token_file.is_file():
        write_secret_file(layout.management_token_file, management)
    if layout.tls:
        layout.tls_dir.mkdir(mode=0o700, exist_ok=True)
        shared = (
            (primary.ca_cert_file, layout.ca_cert_file, PUBLIC_MODE),
            (primary.ca_key_file, layout.ca_key_file, SECRET_MODE),
            (primary.gossip_key_file, layout.gossip_key_file, SECRET_MODE),
        )
        for source, target, mode in shared:
            if not target.is_file():
                write_atomically(target, source.read_text(encoding="utf-8"), mode=mode)
    if not layout.replication_token_file.is_file():
        token = _replication_token(primary, management, layout.datacenter)
        write_secret_file(layout.replication_token_file, token)


def _replication_token(primary: ClusterLayout, management: Secret, datacenter: str) -> Secret:
    """The replication token of `datacenter`, minted in the primary (adopted by its
    description when an interrupted `up` made it already)."""
    settings = cluster_tls.consul_settings(
        primary, address=primary.servers[0].http_address, token=management
    )
    acl = Consul(settings).acl  # the default timeout and retries: these are writes
    if acl.read_policy_by_name(REPLICATION_POLICY) is None:
        acl.create_policy(REPLICATION_POLICY, REPLICATION_RULES, f"{MANAGED_MARKER}: replication")
    description = f"{MANAGED_MARKER}: ACL replication for datacenter {datacenter}"
    existing = [t for t in acl.list_tokens() if t.description == description]
    token = (
        acl.read_token(existing[0].accessor_id)
        if existing
        else acl.create_token(description, [REPLICATION_POLICY])
    )
    if token.secret is None:
        raise LocalEnvironmentError(f"Consul returned no secret for {datacenter}'s replication")
    return token.secret


def _wait_until_federated(layouts: tuple[ClusterLayout, ...], give_up: Deadline) -> None:
    names = {layout.datacenter for layout in layouts}
    waiting: list[str] = []
    for _ in attempts(give_up, POLL_PAUSE):
        states = [_datacenter_status(layout, with_cluster=False) for layout in layouts]
        waiting = [
            dc.cluster.layout.datacenter
            for dc in states
            if not names <= set(dc.wan) or not dc.replicating
        ]
        if not waiting:
            return
    raise LocalEnvironmentError(
        f"cluster up failed: {', '.join(waiting)} not federated in time (agent logs: "
        f"{layouts[0].state_dir.parent}/*/*/consul.log)"
    )


def _datacenter_status(layout: ClusterLayout, *, with_cluster: bool = True) -> DatacenterStatus:
    cluster = cluster_status(layout.state_dir) if with_cluster else _bare_status(layout)
    token = read_management_token(layout)
    wan: tuple[str, ...] = ()
    replication = None
    if token is not None:
        client = _client(layout, token)
        try:
            wan = tuple(client.catalog.datacenters())
            if layout.secondary:
                replication = client.acl.replication()
        except ConsulError:
            pass
    return DatacenterStatus(cluster, wan, replication)


def _bare_status(layout: ClusterLayout) -> ClusterStatus:
    """While waiting: the layout only (the agents' own states are not asked for)."""
    return ClusterStatus(layout, (), "", False)


def _client(layout: ClusterLayout, token: Secret) -> Consul:
    """The management token at the datacenter's first server, each call tried once."""
    settings = cluster_tls.consul_settings(
        layout, address=layout.servers[0].http_address, token=token, timeout=PROBE_TIMEOUT
    )
    return Consul(settings, retry=NO_RETRY)
