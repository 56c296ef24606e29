"""What `cluster up` waits for once the agents run: a leader, ACLs bootstrapped, every agent
accepting the management token and holding its own agent token, every node healthy."""

from __future__ import annotations

from pathlib import Path

from provision.acl.agent_tokens import ensure_agent_token
from provision.acl.bootstrap import bootstrap_acl, wait_until_management_works
from provision.cluster import tls as cluster_tls
from provision.cluster.layout import AgentSpec, ClusterLayout
from provision.consul import NO_RETRY, Consul, ConsulError, PermissionDenied
from provision.errors import LocalEnvironmentError
from provision.system.deadline import Deadline, attempts, retry_until
from provision.system.secrets import Secret, read_secret_file, write_secret_file

# Consul 1.8 agents leave legacy ACL mode only at checks whose gap doubles from 50 ms to 30 s:
# on a slow machine a follower that missed the leader's switch can wait that long for its next.
LEGACY_MODE_CHECK_GAP = 30.0
POLL_PAUSE = 0.1


def bootstrap_management(layout: ClusterLayout, give_up: Deadline) -> tuple[Consul, bool]:
    """The management client, bootstrapping ACLs first if this cluster never was."""
    settings = cluster_tls.consul_settings(layout, address=layout.servers[0].http_address)
    anonymous = Consul(settings, retry=NO_RETRY)
    leader = _wait_for_leader(layout, anonymous, give_up)
    token = read_management_token(layout)
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


def wait_until_every_agent_accepts(
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


def give_agent_token(
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
        leader = find_leader(layout, client)
        if leader in by_raft_address:
            return by_raft_address[leader]
    raise LocalEnvironmentError("no Consul leader was elected in time")


def find_leader(layout: ClusterLayout, client: Consul) -> str:
    for server in layout.servers:
        try:
            leader = client.with_settings(address=server.http_address).status.leader(retry=NO_RETRY)
        except ConsulError:
            continue
        if leader:
            return leader
    return ""


def wait_until_healthy(layout: ClusterLayout, management: Consul, give_up: Deadline) -> None:
    """Every node registered with a passing serfHealth: sessions can be made on it."""
    for _ in attempts(give_up, POLL_PAUSE):
        health = serf_health(management)
        unhealthy = [a.name for a in layout.agents if health.get(a.name) != "passing"]
        if not unhealthy:
            return
    raise LocalEnvironmentError(f"agents not healthy in time: {', '.join(unhealthy)}")


def serf_health(client: Consul) -> dict[str, str]:
    try:
        checks = client.health.checks_in_state("any")
    except ConsulError:
        return {}
    return {c["Node"]: c["Status"] for c in checks if c.get("CheckID") == "serfHealth"}


def read_management_token(layout: ClusterLayout) -> Secret | None:
    path = layout.management_token_file
    return read_secret_file(path) if path.is_file() else None
