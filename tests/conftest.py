"""Shared fixtures: the real local Consul cluster, started once per test session.

The cluster is started through the same code as `lockctl cluster up`, on its own loopback /24
(LOCKCTL_TEST_SUBNET, default 127.0.2) and in a temporary state folder, so it never collides
with a cluster a developer runs for the quick start. It is stopped at the end, also when tests
fail.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.cluster.local import ClusterStatus, cluster_down, cluster_up
from provision.consul import Consul, ConsulSettings
from provision.secret import Secret, read_secret_file

TEST_SUBNET = os.environ.get("LOCKCTL_TEST_SUBNET", "127.0.2")


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
        return Consul(ConsulSettings(address=self.address(name), token=token))

    def management(self, name: str = "server-1") -> Consul:
        return self.client(name, self.management_token)


@pytest.fixture(scope="session")
def cluster_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cluster") / "state"


@pytest.fixture(scope="session")
def live_cluster(cluster_state_dir: Path) -> Iterator[LiveCluster]:
    result = cluster_up(cluster_state_dir, subnet=TEST_SUBNET)
    try:
        yield LiveCluster(result.status)
    finally:
        cluster_down(cluster_state_dir)
