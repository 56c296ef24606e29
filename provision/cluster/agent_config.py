"""Each agent's config file, in the dialect of the Consul binary that will read it.

Agent config names changed across versions (docs/compatibility.md): the `tls` stanza with
`defaults` and `internal_rpc` replaced the top-level `ca_file`/`cert_file`/`key_file`/`verify_*`
in 1.12, and 1.14 added `ports.grpc_tls` (on by default on 8503). The templates branch on the
`ConfigDialect` made once from `consul version`, never on a version string.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import jinja2

from provision.cluster.layout import HTTPS_PORT, AgentSpec, ClusterLayout
from provision.errors import LocalEnvironmentError
from provision.system.secrets import Secret
from provision.system.templates import render_template

SERVER_TEMPLATE = "consul/server.hcl.j2"
CLIENT_TEMPLATE = "consul/client.hcl.j2"
_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")


@dataclass(frozen=True)
class ConfigDialect:
    """Which agent config names a Consul version understands."""

    version: tuple[int, int, int]

    @classmethod
    def of(cls, version: str) -> ConfigDialect:
        """From what `consul version` reports: "1.8.7", "1.15.2+ent", "1.21.0-dev"."""
        match = _VERSION.match(version)
        if match is None:
            raise LocalEnvironmentError(f"Consul version {version!r}: not MAJOR.MINOR.PATCH")
        major, minor, patch = (int(part) for part in match.groups())
        return cls((major, minor, patch))

    @property
    def tls_stanza(self) -> bool:
        """1.12+: `tls { defaults {...} internal_rpc {...} }` (the top-level names deprecated)."""
        return self.version >= (1, 12, 0)

    @property
    def grpc_tls_port(self) -> bool:
        """1.14+: `ports.grpc_tls`, which servers open on 8503 unless it is set to -1."""
        return self.version >= (1, 14, 0)


@dataclass(frozen=True)
class AgentTls:
    """The files one agent's TLS config names."""

    ca_file: str
    cert_file: str
    key_file: str


def render_agent_config(
    env: jinja2.Environment,
    layout: ClusterLayout,
    agent: AgentSpec,
    dialect: ConfigDialect,
    *,
    gossip_key: Secret | None,
    log_level: str,
    replication_token: Secret | None = None,
) -> str:
    """The config file text of `agent`; it holds the gossip key on a TLS cluster and a
    secondary datacenter's server holds the replication token, so it is written 0600."""
    template = SERVER_TEMPLATE if agent.server else CLIENT_TEMPLATE
    context = _context(layout, agent, dialect, gossip_key, log_level)
    # only a server replicates: a client's config never holds the token
    token = replication_token if agent.server and layout.secondary else None
    context["replication_token"] = None if token is None else token.reveal()
    return render_template(env, template, context)


def _context(
    layout: ClusterLayout,
    agent: AgentSpec,
    dialect: ConfigDialect,
    gossip_key: Secret | None,
    log_level: str,
) -> dict[str, Any]:
    tls = None
    if agent.tls:
        cert, key = layout.cert_file(agent.name), layout.key_file(agent.name)
        tls = AgentTls(str(layout.ca_cert_file), str(cert), str(key))
    return {
        "agent": agent,
        "servers": layout.servers,
        "datacenter": layout.datacenter,
        "primary_datacenter": layout.primary_datacenter,
        "wan_join": layout.wan_join,
        "data_dir": str(layout.data_dir(agent)),
        "log_level": log_level,
        "dialect": dialect,
        "tls": tls,
        "https_port": HTTPS_PORT,
        "gossip_key": None if gossip_key is None else gossip_key.reveal(),
    }
