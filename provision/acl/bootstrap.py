"""Bootstrapping Consul's ACL system and giving agents their tokens.

Consul answers a fresh cluster's bootstrap with transient errors (CONSUL_FACTS.md): a non-leader
says 500 "legacy mode" for up to ~6.4 s after the election, and right after bootstrap a follower
can say 403 "ACL not found" for ~0.2 s. These are retried within a deadline; decisions branch on
status codes, never on error text.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from provision.consul import Consul
from provision.consul.errors import (
    ConsulServerError,
    ConsulUnavailable,
    PermissionDenied,
)
from provision.consul.models import Token
from provision.consul.transport import NO_RETRY
from provision.errors import LocalEnvironmentError
from provision.system.templates import make_environment, render_template

BOOTSTRAP_DEADLINE = 30.0
MANAGED_MARKER = "lockctl-managed"
RETRY_PAUSE = 0.1


@dataclass(frozen=True)
class AgentTokenResult:
    node: str
    accessor_id: str
    created: bool


def agent_policy_name(node: str) -> str:
    return f"agent-{node}"


def bootstrap_acl(
    consul: Consul,
    *,
    deadline: float = BOOTSTRAP_DEADLINE,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Token | None:
    """Bootstrap the ACL system; the management token, or None if it was bootstrapped before."""
    give_up_at = clock() + deadline
    while True:
        try:
            return consul.acl.bootstrap(retry=NO_RETRY)
        except PermissionDenied:
            return None  # "ACL bootstrap no longer allowed": someone already did it
        except (ConsulServerError, ConsulUnavailable):
            if clock() >= give_up_at:
                raise
        sleep(RETRY_PAUSE)


def wait_until_management_works(
    consul: Consul,
    *,
    deadline: float = BOOTSTRAP_DEADLINE,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Retry until the agent resolves the management token and lets it read ACLs.

    Measured on 1.8.7: a follower answers 500 "legacy mode" for ~1.5 s after bootstrap, then
    may answer 403 "ACL not found" even after /v1/acl/token/self succeeded there. Listing
    policies needs the agent's own ACL resolver, so it is the probe that matches later use.
    """
    give_up_at = clock() + deadline
    while True:
        try:
            consul.acl.list_policies()
            return
        except (PermissionDenied, ConsulServerError, ConsulUnavailable):
            if clock() >= give_up_at:
                raise
        sleep(RETRY_PAUSE)


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
