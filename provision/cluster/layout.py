"""What a local cluster is made of: which agents, where, and where its state lives."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import shutil
import socket
from dataclasses import asdict, dataclass
from pathlib import Path

from provision.cluster import netns as ns
from provision.errors import InputError, LocalEnvironmentError
from provision.system.files import PUBLIC_MODE, write_atomically

DEFAULT_SUBNET = "127.0.0"  # servers at .11-.13, worker agents at .21-.22
DEFAULT_NETNS_SUBNET = "10.77.0"  # namespace mode: exists only inside the cluster's namespaces
PRIVATE_NETWORKS = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")
DEFAULT_STATE_DIR = Path(".lockctl/cluster")
SERVER_HOSTS = (11, 12, 13)
SERVER_COUNTS = (1, 3)  # a Raft quorum that survives a lost server needs 3; 1 is the smallest
DEFAULT_SERVERS = 3
DEFAULT_WORKERS = 2  # worker-1, worker-2 at .21, .22; up to MAX_WORKERS (.21-.29)
MAX_WORKERS = 9
FIRST_WORKER_HOST = 21
HTTP_PORT = 8500
HTTPS_PORT = 8501  # Consul's conventional HTTPS port; with TLS the agents serve only this one
# Whether `cluster up` makes a TLS cluster when neither --tls nor --no-tls is given (and none is
# recorded yet). Flipping this one line makes TLS the default everywhere.
DEFAULT_TLS = True
LAYOUT_FILE = "cluster.json"
MANAGEMENT_TOKEN_FILE = "management.token"  # noqa: S105 - a file name, not a secret
REPLICATION_TOKEN_FILE = "replication.token"  # noqa: S105 - a secondary datacenter's, a file name
TLS_DIR = "tls"  # the CA, every agent's certificate and key, lockctl's own pair, the gossip key
CA_CERT_FILE = "ca.pem"
CA_KEY_FILE = "ca-key.pem"
GOSSIP_KEY_FILE = "gossip.key"
CLI_CERT_NAME = "lockctl"  # lockctl's (and the consul CLI's) own client certificate


@dataclass(frozen=True)
class AgentSpec:
    """One Consul agent: its node name, address, whether it is a server, (namespace mode) the
    network namespace it runs in, and whether it serves its API over HTTPS only (TLS)."""

    name: str
    address: str
    server: bool
    netns: str | None = None
    tls: bool = False

    @property
    def api_port(self) -> int:
        return HTTPS_PORT if self.tls else HTTP_PORT

    @property
    def http_address(self) -> str:
        """The API's base URL: https:// on a TLS cluster (plain HTTP is off there)."""
        return f"{'https' if self.tls else 'http'}://{self.address}:{self.api_port}"


@dataclass(frozen=True)
class ClusterLayout:
    """The agents of a local cluster and the folder holding their configs, data and pidfiles."""

    state_dir: Path
    agents: tuple[AgentSpec, ...]
    datacenter: str = "dc1"
    netns_prefix: str | None = None  # namespace mode: the prefix of every namespace's name
    # A federation's datacenter (cluster up --datacenters): the primary's name, and the
    # addresses of the servers its servers join over the WAN (a secondary's: the primary's)
    primary_datacenter: str | None = None
    wan_join: tuple[str, ...] = ()

    @property
    def secondary(self) -> bool:
        """A federation's datacenter that replicates its ACLs from the primary."""
        return self.primary_datacenter not in (None, self.datacenter)

    @property
    def replication_token_file(self) -> Path:
        """A secondary's: the token its servers replicate the primary's ACLs with (0600)."""
        return self.state_dir / REPLICATION_TOKEN_FILE

    @property
    def driver_netns(self) -> str | None:
        """Where lockctl talks to the agents from: None in loopback mode (right here)."""
        return None if self.netns_prefix is None else ns.driver_netns(self.netns_prefix)

    def host(self, agent: AgentSpec) -> ns.Host:
        """Namespace mode: the agent's namespace, address and bridge-side veth."""
        if agent.netns is None:
            raise LocalEnvironmentError(f"{agent.name} does not run in a network namespace")
        return ns.Host(agent.netns, agent.address, f"v-{agent.name}")

    @property
    def servers(self) -> tuple[AgentSpec, ...]:
        return tuple(agent for agent in self.agents if agent.server)

    @property
    def workers(self) -> tuple[AgentSpec, ...]:
        return tuple(agent for agent in self.agents if not agent.server)

    @property
    def management_token_file(self) -> Path:
        return self.state_dir / MANAGEMENT_TOKEN_FILE

    @property
    def tls(self) -> bool:
        return self.agents[0].tls

    @property
    def tls_dir(self) -> Path:
        return self.state_dir / TLS_DIR

    @property
    def ca_cert_file(self) -> Path:
        return self.tls_dir / CA_CERT_FILE

    @property
    def ca_key_file(self) -> Path:
        return self.tls_dir / CA_KEY_FILE

    @property
    def gossip_key_file(self) -> Path:
        return self.tls_dir / GOSSIP_KEY_FILE

    def cert_file(self, name: str) -> Path:
        """The certificate of agent `name`, or of lockctl itself (CLI_CERT_NAME)."""
        return self.tls_dir / f"{name}.pem"

    def key_file(self, name: str) -> Path:
        """The private key of `cert_file(name)`: mode 0600."""
        return self.tls_dir / f"{name}-key.pem"

    def tls_files(self) -> tuple[Path, ...]:
        """Every file the TLS material is made of (the ones lockctl writes into tls/)."""
        names = [agent.name for agent in self.agents] + [CLI_CERT_NAME]
        pairs = [path for name in names for path in (self.cert_file(name), self.key_file(name))]
        return (self.ca_cert_file, self.ca_key_file, self.gossip_key_file, *pairs)

    def agent_dir(self, agent: AgentSpec) -> Path:
        return self.state_dir / agent.name

    def pidfile(self, agent: AgentSpec) -> Path:
        return self.agent_dir(agent) / "consul.pid"

    def config_file(self, agent: AgentSpec) -> Path:
        return self.agent_dir(agent) / "agent.hcl"

    def log_file(self, agent: AgentSpec) -> Path:
        return self.agent_dir(agent) / "consul.log"

    def data_dir(self, agent: AgentSpec) -> Path:
        return self.agent_dir(agent) / "data"


def default_layout(
    state_dir: Path,
    subnet: str = DEFAULT_SUBNET,
    workers: int = DEFAULT_WORKERS,
    *,
    netns: bool = False,
    tls: bool = False,
    servers: int = DEFAULT_SERVERS,
) -> ClusterLayout:
    """3 servers (server-1..3 at .11-.13; or 1) and worker-1..N (.21, .22, ...) in a 127/8 /24,
    or with `netns` each in its own network namespace, in a private /24 that exists only inside
    them; with `tls` every agent serves HTTPS only."""
    _check_subnet(subnet, netns)
    if not 1 <= workers <= MAX_WORKERS:
        raise InputError(f"--workers {workers}: must be 1..{MAX_WORKERS}")
    if servers not in SERVER_COUNTS:
        raise InputError(f"--servers {servers}: must be 1 or 3")
    prefix = ns.netns_prefix(state_dir) if netns else None
    worker_hosts = range(FIRST_WORKER_HOST, FIRST_WORKER_HOST + workers)
    server_agents = [
        _agent("server", n, subnet, host, prefix, server=True, tls=tls)
        for n, host in enumerate(SERVER_HOSTS[:servers], 1)
    ]
    clients = [
        _agent("worker", n, subnet, host, prefix, server=False, tls=tls)
        for n, host in enumerate(worker_hosts, 1)
    ]
    return ClusterLayout(state_dir.absolute(), tuple(server_agents + clients), netns_prefix=prefix)


def _agent(
    role: str, number: int, subnet: str, host: int, prefix: str | None, *, server: bool, tls: bool
) -> AgentSpec:
    name = f"{role}-{number}"
    netns = None if prefix is None else ns.agent_netns(prefix, name)
    return AgentSpec(name, f"{subnet}.{host}", server, netns, tls)


def _check_subnet(subnet: str, netns: bool) -> None:
    try:
        network = ipaddress.IPv4Network(f"{subnet}.0/24")
    except ValueError:
        raise InputError(f"--subnet {subnet!r}: expected three octets such as 127.0.0") from None
    if not netns:
        if not network.subnet_of(ipaddress.IPv4Network("127.0.0.0/8")):
            raise InputError(f"--subnet {subnet}: must be inside 127.0.0.0/8 (loopback only)")
        return
    if not any(network.subnet_of(ipaddress.IPv4Network(p)) for p in PRIVATE_NETWORKS):
        raise InputError(
            f"--subnet {subnet}: with --netns it must be a private /24 "
            f"({', '.join(PRIVATE_NETWORKS)}), such as {DEFAULT_NETNS_SUBNET}"
        )


def refuse_if_taken(agent: AgentSpec) -> None:
    """An address already served by someone else would make us talk to the wrong agent. Both
    API ports: a plain cluster there holds 8500, a TLS one 8501, and either holds the RPC and
    gossip ports this agent needs."""
    for port in (HTTP_PORT, HTTPS_PORT):
        with socket.socket() as probe:
            probe.settimeout(0.5)
            if probe.connect_ex((agent.address, port)) == 0:
                raise LocalEnvironmentError(
                    f"{agent.address}:{port} is already in use by a process this cluster did "
                    f"not start; stop it or use another --subnet"
                )


def save_layout(layout: ClusterLayout) -> None:
    """Record the layout, so later commands (status, down, env) act on the same agents."""
    record = {
        "datacenter": layout.datacenter,
        "agents": [asdict(agent) for agent in layout.agents],
        "netns_prefix": layout.netns_prefix,
        "primary_datacenter": layout.primary_datacenter,
        "wan_join": list(layout.wan_join),
    }
    text = json.dumps(record, indent=2) + "\n"
    write_atomically(layout.state_dir / LAYOUT_FILE, text, mode=PUBLIC_MODE)


def load_layout(state_dir: Path) -> ClusterLayout | None:
    """The layout recorded in `state_dir`, or None if no cluster was ever started there."""
    path = state_dir.absolute() / LAYOUT_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        agents = tuple(AgentSpec(**agent) for agent in record["agents"])
        prefix = record.get("netns_prefix")
        primary = record.get("primary_datacenter")
        wan_join = tuple(str(address) for address in record.get("wan_join") or ())
        return ClusterLayout(
            state_dir.absolute(), agents, record["datacenter"], prefix, primary, wan_join
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise LocalEnvironmentError(f"{path}: unreadable cluster record ({exc})") from None


def remove_cluster_files(layout: ClusterLayout) -> tuple[Path, ...]:
    """Delete what lockctl made in the state folder, and each folder once it is empty; returns
    what is left: files someone else put there, which are never touched."""
    state_dir = layout.state_dir
    for agent in layout.agents:
        _remove_tree(layout.data_dir(agent))  # Consul's own data folder
        for path in (layout.pidfile(agent), layout.config_file(agent), layout.log_file(agent)):
            _remove_file(path)
        _remove_empty_folder(layout.agent_dir(agent))
    for path in layout.tls_files():
        _remove_file(path)
    for staging in layout.tls_dir.glob(".staging-*.tmp"):  # an interrupted `consul tls` run's
        _remove_tree(staging)
    _remove_empty_folder(layout.tls_dir)
    for name in (LAYOUT_FILE, MANAGEMENT_TOKEN_FILE, REPLICATION_TOKEN_FILE, ns.RECORD_FILE):
        _remove_file(state_dir / name)
    _remove_empty_folder(state_dir)
    if not state_dir.exists():
        return ()
    return tuple(sorted(p for p in state_dir.rglob("*") if not p.is_dir() or not any(p.iterdir())))


def _remove_file(path: Path) -> None:
    """The file, and any temporary file an interrupted atomic write of it left behind."""
    path.unlink(missing_ok=True)
    for leftover in path.parent.glob(f".{path.name}.*.tmp"):
        leftover.unlink(missing_ok=True)


def _remove_tree(folder: Path) -> None:
    if folder.is_symlink():  # never follow one out of the state folder
        folder.unlink()
    elif folder.is_dir():
        shutil.rmtree(folder)


def _remove_empty_folder(folder: Path) -> None:
    with contextlib.suppress(OSError):
        folder.rmdir()  # fails while someone else's file is in it: then it stays
