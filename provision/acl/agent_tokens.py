"""Agent tokens: each client agent gets a token that can register its own node and nothing else.

Re-running adopts the existing policy and token (found by name and description), so it never
mints a second token for the same node.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from provision.consul import Consul
from provision.errors import LocalEnvironmentError
from provision.spec.names import MANAGED_MARKER
from provision.system.templates import make_environment, render_template


@dataclass(frozen=True)
class AgentTokenResult:
    node: str
    accessor_id: str
    created: bool


def agent_policy_name(node: str) -> str:
    return f"agent-{node}"


def ensure_agent_token(
    management: Consul, agent: Consul, node: str, templates_dir: Path
) -> AgentTokenResult:
    """Give the agent serving `node` a token that can register that node and nothing else.

    Re-running adopts the existing policy and token (found by name and description), so it
    never mints a second token for the same node.
    """
    env = make_environment(templates_dir)
    rules = render_template(env, "consul/agent-policy.hcl.j2", {"node": node})
    name = agent_policy_name(node)
    description = f"{MANAGED_MARKER}: agent token for node {node}"
    # A list, not a read by name: 1.8.7 answers a missing name with 403 "ACL not found",
    # which cannot be told apart from an unknown token.
    policy = next((p for p in management.acl.list_policies() if p.name == name), None)
    if policy is None:
        management.acl.create_policy(name, rules, description)
    elif management.acl.read_policy(policy.id).rules != rules:
        management.acl.update_policy(policy.id, name, rules, description)
    existing = [t for t in management.acl.list_tokens() if t.description == description]
    created = not existing
    token = (
        management.acl.create_token(description, [name])
        if created
        else (management.acl.read_token(existing[0].accessor_id))
    )
    if token.secret is None:
        raise LocalEnvironmentError(f"Consul returned no secret for the agent token of {node}")
    agent.agent.set_agent_token(token.secret)
    return AgentTokenResult(node, token.accessor_id, created)
