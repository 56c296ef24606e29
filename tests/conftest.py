"""Shared fixtures: the real local Consul cluster, started once per test session.

The cluster is started through the same code as `lockctl cluster up`, on its own loopback /24
(LOCKCTL_TEST_SUBNET, default 127.0.2, each xdist worker its own: tests/subnets.py) and in a
temporary state folder, so it never collides with a cluster a developer runs for the quick start.
It is stopped at the end, also when tests fail. It is what `cluster up` makes by default: HTTPS
only, client certificates required, gossip encrypted (LOCKCTL_TEST_TLS=0: plain HTTP, as before
lockctl made TLS the default).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.cluster import tls
from provision.cluster import tls as cluster_tls
from provision.cluster.consul_binary import ConsulBinary
from provision.cluster.federation import FederationStatus, federation_down, federation_up
from provision.cluster.layout import ClusterLayout
from provision.cluster.local import ClusterShape, ClusterStatus, cluster_down, cluster_up
from provision.consul import Consul
from provision.system.secrets import Secret, read_secret_file
from tests.subnets import FEDERATION_SUBNET, TEST_SUBNET

TEST_TLS = os.environ.get("LOCKCTL_TEST_TLS", "1") != "0"


class LiveCluster:
    """Handles on the running test cluster."""

    def __init__(self, status: ClusterStatus) -> None:
        self.status = status
        self.layout = status.layout
        self.management_token: Secret = read_secret_file(self.layout.management_token_file)

    def address(self, name: str) -> str:
        return next(a.http_address for a in self.layout.agents if a.name == name)

    def client(self, name: str = "server-1", token: Secret | None = None) -> Consul:
        """A client of one agent; the management token unless another (or none) is given."""
        return Consul(tls.consul_settings(self.layout, address=self.address(name), token=token))

    def tls_env(self) -> dict[str, str]:
        """What `eval "$(lockctl cluster env)"` exports for TLS: the CA and lockctl's pair."""
        return dict(tls.tls_exports(self.layout))

    def tls_flags(self) -> list[str]:
        """The same as the connection flags every Consul command takes."""
        flags = {"CONSUL_CACERT": "--ca-cert", "CONSUL_CLIENT_CERT": "--client-cert"}
        flags["CONSUL_CLIENT_KEY"] = "--client-key"
        return [part for name, value in self.tls_env().items() for part in (flags[name], value)]

    def management(self, name: str = "server-1") -> Consul:
        return self.client(name, self.management_token)


@pytest.fixture(scope="session")
def cluster_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cluster") / "state"


@pytest.fixture(scope="session")
def live_cluster(cluster_state_dir: Path) -> Iterator[LiveCluster]:
    result = cluster_up(
        cluster_state_dir, ClusterShape(subnet=TEST_SUBNET, workers=3, tls=TEST_TLS)
    )
    try:
        yield LiveCluster(result.status)
    finally:
        cluster_down(cluster_state_dir)


class LiveFederation:
    """Handles on the running two-datacenter federation: each datacenter a LiveCluster (dc1 the
    primary; the management token is the same in both)."""

    def __init__(self, status: FederationStatus) -> None:
        self.status = status
        self.datacenters = {
            dc.cluster.layout.datacenter: LiveCluster(dc.cluster) for dc in status.datacenters
        }

    def __getitem__(self, datacenter: str) -> LiveCluster:
        return self.datacenters[datacenter]


@pytest.fixture(scope="session")
def federation_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("federation") / "state"


@pytest.fixture(scope="session")
def live_federation(federation_state_dir: Path) -> Iterator[LiveFederation]:
    """dc1 and dc2, one server and one worker agent each (the suite's size), started for the
    first test that asks and stopped at the end."""
    shape = ClusterShape(
        subnet=FEDERATION_SUBNET, workers=1, tls=TEST_TLS, servers=1, datacenters=2
    )
    result = federation_up(federation_state_dir, shape)
    try:
        yield LiveFederation(result.status)
    finally:
        federation_down(federation_state_dir)


# --- secret scan (scripts/scan-secrets) ---------------------------------------------------------
# With LOCKCTL_TEST_SECRETS_OUT set, every Secret this process creates is recorded and written to
# that file at the end, so the suite's whole output can be searched for the secrets it minted.
_SECRETS_OUT = os.environ.get("LOCKCTL_TEST_SECRETS_OUT")
_seen_secrets: set[str] = set()

if _SECRETS_OUT:
    _original_init = Secret.__init__

    def _recording_init(self: Secret, _value: str) -> None:
        _original_init(self, _value)
        _seen_secrets.add(_value)

    Secret.__init__ = _recording_init  # type: ignore[method-assign]

    # The private keys of every TLS cluster the tests make in this process (the gossip key is a
    # Secret when an agent config is written, so it is recorded above): each line of a key's
    # base64 body is searched for, as a token secret is.
    _original_ensure = cluster_tls.ensure_tls_material

    def _recording_ensure(layout: ClusterLayout, binary: ConsulBinary) -> tuple[str, ...]:
        made = _original_ensure(layout, binary)
        for path in layout.tls_files():
            if path.name.endswith("-key.pem") or path == layout.gossip_key_file:
                lines = path.read_text(encoding="utf-8").splitlines()
                _seen_secrets.update(line for line in lines if line and "-----" not in line)
        return made

    cluster_tls.ensure_tls_material = _recording_ensure  # type: ignore[assignment]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _SECRETS_OUT:
        # under pytest-xdist each worker process records its own: one file each, never a race
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        out = Path(f"{_SECRETS_OUT}.{worker}" if worker else _SECRETS_OUT)
        out.write_text("".join(f"{s}\n" for s in sorted(_seen_secrets)))


# Fixtures that stand for the real local cluster: a test using one, directly or through another
# fixture, needs the cluster.
CLUSTER_FIXTURES = frozenset(
    {"live_cluster", "cluster_state_dir", "live_federation", "federation_state_dir"}
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The `cluster` marker comes from the fixtures a test uses, not from its author: `make unit`
    (`-m "not cluster"`) then never starts a cluster, whoever forgot a marker."""
    for item in items:
        if CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.cluster)
