"""The loopback /24s the tests' own Consul clusters listen on: one set per pytest process.

Each is configurable (an environment variable, for a developer whose cluster already uses the
default). Under pytest-xdist (`make test` runs two workers) every worker starts its own clusters,
so worker N (`PYTEST_XDIST_WORKER=gwN`) takes each /24 with N * WORKER_STRIDE added to its third
octet: two workers never share an address, and a test never sees another worker's objects.
"""

from __future__ import annotations

import os

# The stride leaves room for the defaults below (2 to 17) and a developer's overrides between
# workers: worker 1 gets 127.0.52, 127.0.54, ... With the defaults, five workers fit in the octet.
WORKER_STRIDE = 50


def _worker_index() -> int:
    """0 outside xdist; N for xdist's worker `gwN`."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(name.removeprefix("gw"))


def worker_subnet(variable: str, default: str) -> str:
    """The /24 of `variable` (or `default`), moved to this worker's own range."""
    base = os.environ.get(variable, default)
    first, second, third = base.split(".")
    moved = int(third) + WORKER_STRIDE * _worker_index()
    if moved > 254:
        raise RuntimeError(
            f"{variable}={base}: worker {_worker_index()}'s /24 would be {first}.{second}.{moved};"
            " run fewer pytest-xdist workers or a lower subnet"
        )
    return f"{first}.{second}.{moved}"


# The session's cluster: 3 servers and 3 client agents (tests/conftest.py's live_cluster)
TEST_SUBNET = worker_subnet("LOCKCTL_TEST_SUBNET", "127.0.2")
# Clusters a test starts and stops itself (cluster lifecycle, TLS, agentless), one at a time
LIFECYCLE_SUBNET = worker_subnet("LOCKCTL_TEST_LIFECYCLE_SUBNET", "127.0.4")
# verify's test of a cluster whose ACL default policy is allow
ALLOW_SUBNET = worker_subnet("LOCKCTL_TEST_ALLOW_SUBNET", "127.0.10")
# The two-datacenter federation: dc1 on this /24, dc2 on the next one (both must be free)
FEDERATION_SUBNET = worker_subnet("LOCKCTL_TEST_FEDERATION_SUBNET", "127.0.16")
