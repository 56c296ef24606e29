"""Agent config templates per Consul version: golden files (tests/golden/consul/) and every
key checked against the names HashiCorp documents for that version.

Only 1.8.7 runs here (tests/integration/test_cluster_tls.py); the newer dialects are checked
against the documentation, cited per key below and in docs/compatibility.md. To update the
golden files after a deliberate change: LOCKCTL_UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import hcl2
import pytest

from provision.cluster.agent_config import ConfigDialect, render_agent_config
from provision.cluster.layout import ClusterLayout, default_layout
from provision.errors import LocalEnvironmentError
from provision.system.secrets import Secret
from provision.system.templates import CHECKOUT_TEMPLATES, make_environment

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "consul"
STATE_DIR = Path("/var/lib/lockctl/cluster")
# Test data, not a secret: base64 of 32 zero bytes, the shape `consul keygen` prints.
FAKE_GOSSIP_KEY = Secret("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=")
# The version each dialect is rendered for: the one tested here, the first of each change, and
# the range users run (1.15-1.21).
VERSIONS = ("1.8.7", "1.12.0", "1.14.0", "1.15.0", "1.21.0")

# Top-level agent config keys and the stanzas' keys that the templates may use, from
# https://developer.hashicorp.com/consul/docs/agent/config/config-files (1.8: the v1.8.x page;
# 1.12+: .../reference/agent/configuration-file/tls for the tls stanza).
COMMON_KEYS = {
    "node_name", "datacenter", "data_dir", "bind_addr", "advertise_addr", "client_addr",
    "server", "bootstrap_expect", "retry_join", "retry_interval", "disable_update_check",
    "disable_host_node_id", "log_level", "performance", "acl", "ports", "encrypt",
}  # fmt: skip
LEGACY_TLS_KEYS = {  # top level before 1.12 (deprecated from 1.12: "Deprecated Options")
    "ca_file", "cert_file", "key_file", "verify_incoming", "verify_outgoing",
    "verify_server_hostname",
}  # fmt: skip
STANZA_KEYS = {
    "performance": {"raft_multiplier"},
    "acl": {"enabled", "default_policy", "down_policy", "enable_token_persistence"},
    "ports": {"http", "https"},
}
PORTS_1_14 = {"http", "https", "grpc_tls"}  # ports.grpc_tls: added in 1.14 (default 8503)
TLS_STANZA = {  # 1.12+: tls { defaults {...} internal_rpc {...} }
    "defaults": {"ca_file", "cert_file", "key_file", "verify_incoming", "verify_outgoing"},
    "internal_rpc": {"verify_server_hostname"},
}


def _layout(tls: bool) -> ClusterLayout:
    return default_layout(STATE_DIR, "127.0.0", 2, tls=tls)


def _render(version: str, *, server: bool, tls: bool = True) -> str:
    layout = _layout(tls)
    agent = layout.servers[0] if server else layout.workers[0]
    env = make_environment(CHECKOUT_TEMPLATES)
    key = FAKE_GOSSIP_KEY if tls else None
    return render_agent_config(
        env, layout, agent, ConfigDialect.of(version), gossip_key=key, log_level="info"
    )


def _cases() -> list[tuple[str, bool, bool]]:
    tls_cases = [(v, server, True) for v in VERSIONS for server in (True, False)]
    return [*tls_cases, ("1.8.7", True, False), ("1.8.7", False, False)]


def _case_name(version: str, server: bool, tls: bool) -> str:
    return f"{'server' if server else 'client'}-{version}{'' if tls else '-plain'}.hcl"


@pytest.mark.parametrize(("version", "server", "tls"), _cases(), ids=lambda v: str(v))
def test_golden_agent_config(version: str, server: bool, tls: bool) -> None:
    rendered = _render(version, server=server, tls=tls)
    path = GOLDEN / _case_name(version, server, tls)
    if os.environ.get("LOCKCTL_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rendered)
    assert rendered == path.read_text()


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("server", [True, False])
def test_every_key_is_documented_for_its_version(version: str, server: bool) -> None:
    dialect = ConfigDialect.of(version)
    parsed = _parse(_render(version, server=server))
    allowed_top = COMMON_KEYS | ({"tls"} if dialect.tls_stanza else LEGACY_TLS_KEYS)
    assert set(parsed) <= allowed_top
    for stanza, keys in STANZA_KEYS.items():
        if stanza in parsed:
            allowed = PORTS_1_14 if stanza == "ports" and dialect.grpc_tls_port else keys
            assert set(parsed[stanza]) <= allowed, stanza
    if dialect.tls_stanza:
        assert set(parsed["tls"]) == set(TLS_STANZA)
        for block, keys in TLS_STANZA.items():
            assert set(parsed["tls"][block]) == keys, block


@pytest.mark.parametrize("version", VERSIONS)
def test_tls_config_means_the_same_in_every_dialect(version: str) -> None:
    """HTTPS only, all three verifications on, gossip encrypted: whatever the names."""
    parsed = _parse(_render(version, server=True))
    assert parsed["ports"]["http"] == -1 and parsed["ports"]["https"] == 8501
    assert parsed.get("encrypt") == FAKE_GOSSIP_KEY.reveal()
    if ConfigDialect.of(version).tls_stanza:
        tls = {**parsed["tls"]["defaults"], **parsed["tls"]["internal_rpc"]}
    else:
        tls = {key: parsed[key] for key in LEGACY_TLS_KEYS}
    assert tls["verify_incoming"] is True and tls["verify_outgoing"] is True
    assert tls["verify_server_hostname"] is True
    assert tls["ca_file"] == str(STATE_DIR / "tls" / "ca.pem")
    assert tls["cert_file"] == str(STATE_DIR / "tls" / "server-1.pem")
    assert tls["key_file"] == str(STATE_DIR / "tls" / "server-1-key.pem")
    assert (parsed["ports"].get("grpc_tls") == -1) is ConfigDialect.of(version).grpc_tls_port


def test_a_plain_cluster_has_no_tls_and_no_gossip_key() -> None:
    parsed = _parse(_render("1.21.0", server=True, tls=False))
    assert not {"tls", "encrypt", "ports"} & set(parsed)
    assert not LEGACY_TLS_KEYS & set(parsed)


@pytest.mark.parametrize(
    ("text", "version"),
    [("1.8.7", (1, 8, 7)), ("1.15.2+ent", (1, 15, 2)), ("1.21.0-dev", (1, 21, 0))],
)
def test_dialect_parses_what_consul_version_reports(
    text: str, version: tuple[int, int, int]
) -> None:
    assert ConfigDialect.of(text).version == version


def test_dialect_boundaries() -> None:
    assert not ConfigDialect.of("1.11.9").tls_stanza
    assert ConfigDialect.of("1.12.0").tls_stanza
    assert not ConfigDialect.of("1.13.9").grpc_tls_port
    assert ConfigDialect.of("1.14.0").grpc_tls_port


def test_an_unparseable_version_is_a_clear_error() -> None:
    with pytest.raises(LocalEnvironmentError, match=r"not MAJOR\.MINOR\.PATCH"):
        ConfigDialect.of("v1")


def _parse(text: str) -> dict[str, Any]:
    """python-hcl2 8.x gives blocks as lists of dicts and keeps the quotes on strings."""
    return _unwrap(hcl2.loads(text))  # type: ignore[no-any-return]


def _unwrap(value: Any) -> Any:
    if isinstance(value, dict):  # without the parser's own entries (`__comments__`)
        return {key: _unwrap(item) for key, item in value.items() if not key.startswith("__")}
    if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        merged: dict[str, Any] = {}
        for item in value:
            merged.update(_unwrap(item))
        return merged
    if isinstance(value, list):
        return [_unwrap(item) for item in value]
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value
