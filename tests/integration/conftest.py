"""The integration tests' shell is the one `eval "$(lockctl cluster env)"` leaves: the session
cluster's CA and lockctl's client pair in CONSUL_CACERT, CONSUL_CLIENT_CERT and CONSUL_CLIENT_KEY
(on a TLS cluster, the default), so every `lockctl` the tests run, in process or as a child,
reaches the agents as a user's shell would. Set per module, and taken away after it, so the unit
tests never see them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from provision.runner import containment

if TYPE_CHECKING:
    from provision.consul import Consul
    from tests.conftest import LiveCluster


@pytest.fixture(scope="module")
def subreaper() -> Iterator[None]:
    """As `lockctl run` and `schedule` are: the job's orphans come back to this process, for the
    modules that run the engine in process (undone afterwards)."""
    containment.become_subreaper()
    yield
    containment._prctl(containment._PR_SET_CHILD_SUBREAPER, 0)


@pytest.fixture
def consul(live_cluster: LiveCluster) -> Consul:
    """A management client through worker-1's agent, where the engine and scheduler tests run
    their jobs (a module may define its own)."""
    return live_cluster.management("worker-1")


@pytest.fixture(scope="module", autouse=True)
def cluster_tls_env(live_cluster: LiveCluster) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        for name, value in live_cluster.tls_env().items():
            patch.setenv(name, value)
        yield
