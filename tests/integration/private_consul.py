"""A Consul of one test's own: one server started from lockctl's templates on a spare address of
the test subnet, plain HTTP, nothing else on it. For what cannot be scoped on the shared
cluster: `apply --prune` deletes every lockctl-managed object its spec does not name, whoever
made it, the anonymous token is one per cluster, and so is lockctl's own apply lock.

Spare hosts of the test subnet (the live cluster uses .11-.13 and .21-.23): .41 and .42
test_bootstrap.py (never bootstrapped), .43 test_apply.py, .44 test_identity.py,
.45 test_verify.py, .46 test_apply_safety.py.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

from provision.acl.bootstrap import AgentTarget, bootstrap_cluster
from provision.cluster.agent_config import ConfigDialect, render_agent_config
from provision.cluster.consul_binary import install_consul
from provision.cluster.layout import AgentSpec, ClusterLayout
from provision.consul import Consul, ConsulSettings
from provision.consul.errors import ConsulError
from provision.system.processes import spawn, stop
from provision.system.secrets import Secret, read_secret_file
from provision.system.templates import find_templates_dir, make_environment
from tests.integration.named_reads import serf_health
from tests.subnets import TEST_SUBNET

READY_SECONDS = 60  # bounded waits: a loaded machine may be slow, never stuck


class FreshServer:
    """One server on `<subnet>.<host>`, its ACLs on and never bootstrapped."""

    def __init__(self, state_dir: Path, host: int) -> None:
        self.agent = AgentSpec(f"fresh-{host}", f"{TEST_SUBNET}.{host}", True)
        self.layout = ClusterLayout(state_dir, (self.agent,))

    @property
    def address(self) -> str:
        return self.agent.http_address

    def start(self) -> None:
        layout, agent = self.layout, self.agent
        layout.data_dir(agent).mkdir(parents=True)
        binary = install_consul()
        config = render_agent_config(
            make_environment(find_templates_dir()),
            layout,
            agent,
            ConfigDialect.of(binary.version),
            gossip_key=None,  # a plain-HTTP server: bootstrap needs nothing more
            log_level="warn",
        )
        layout.config_file(agent).write_text(config, encoding="utf-8")
        argv = [str(binary.path), "agent", f"-config-file={layout.config_file(agent)}"]
        spawn(argv, layout.log_file(agent), layout.pidfile(agent))
        client = Consul(ConsulSettings(address=self.address, timeout=1))
        give_up_at = time.monotonic() + 30
        while time.monotonic() < give_up_at:
            try:
                if client.status.leader():
                    return
            except ConsulError:
                pass
            time.sleep(0.1)
        raise AssertionError("the fresh server elected no leader")

    def stop(self) -> None:
        pid = int(self.layout.pidfile(self.agent).read_text())
        stop([(pid, str(self.layout.config_file(self.agent)))])


class PrivateConsul:
    """A fresh server bootstrapped by lockctl (its agent token given, so its node is in the
    catalog and sessions can be made on it). Answers as `LiveCluster` does where the ACL tests
    use it (address, client, management, management_token, layout): every agent name is its
    one agent."""

    def __init__(self, server: FreshServer) -> None:
        self.server = server
        self.layout = server.layout
        self.node = server.agent.name
        self.management_token: Secret = read_secret_file(self.layout.management_token_file)

    def address(self, name: str = "") -> str:
        return self.server.address

    def client(self, name: str = "", token: Secret | None = None) -> Consul:
        return Consul(ConsulSettings(address=self.server.address, token=token))

    def management(self, name: str = "") -> Consul:
        return self.client(token=self.management_token)


@contextlib.contextmanager
def private_consul(state_dir: Path, host: int) -> Iterator[PrivateConsul]:
    """A bootstrapped server of its own on `<subnet>.<host>`, stopped at the end."""
    server = FreshServer(state_dir, host)
    server.start()
    try:
        agent = AgentTarget(server.agent.name, server.address)
        bootstrap_cluster(
            Consul(ConsulSettings(address=server.address)),
            server.layout.management_token_file,
            agents=[agent],
            templates_dir=find_templates_dir(),
        )
        private = PrivateConsul(server)
        _wait_for_its_node(private)
        yield private
    finally:
        server.stop()


def _wait_for_its_node(private: PrivateConsul) -> None:
    """Until the agent, with the token bootstrap gave it, has registered its node."""
    management = private.management()
    give_up_at = time.monotonic() + READY_SECONDS
    while serf_health(management, private.node) != "passing":
        assert time.monotonic() < give_up_at, f"{private.node} never registered its node"
        time.sleep(0.2)
