"""lockctl's own Consul sessions, made, renewed and destroyed one way wherever a key is held:
a plain lock's session (tick/pool.py, tick/plain.py) and lockctl's apply lock (acl/serialize.py).

A worker without a local agent (a pod talking to the servers: `agentless` in the spec) has no
node of its own for a session to live on: lockctl registers the worker as a catalog node
(`AgentlessNode`) before it makes a session on it, and its sessions are TTL-only (no node check:
nothing would ever update one). docs/identity.md says what that changes in the lock's promise.

A renew has a client timeout below the renew interval and is not retried, so renewals never
pile up behind a slow one (the next interval is the retry). A destroy is best effort: a session
whose destroy failed ends with its TTL.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from provision.consul import NO_RETRY, Consul, ConsulError


@dataclass(frozen=True)
class SessionTerms:
    """What a session is made with: its name (shown by `consul operator` and `lockctl status`),
    TTL and LockDelay in seconds, Behavior ("release" or "delete"), and how often it is renewed."""

    name: str
    ttl: float
    lock_delay: float
    behavior: str
    renew_interval: float
    node: AgentlessNode | None = None  # None: the serving agent's node, its serfHealth check


@dataclass(frozen=True)
class AgentlessNode:
    """The catalog node a worker without a local agent registers as: its sessions live on it."""

    name: str  # the worker's name: its token's policy allows node and session write on it only
    address: str  # what the catalog shows for it; nothing connects to it


NODE_ADDRESS_ENV = "LOCKCTL_NODE_ADDRESS"  # a pod's IP (the downward API's status.podIP)


def node_address(environ: Mapping[str, str]) -> str:
    """The address an agentless worker registers: LOCKCTL_NODE_ADDRESS, else this host's name
    resolved (a pod's hostname resolves to its IP), else 127.0.0.1 (only shown, never used)."""
    given = environ.get(NODE_ADDRESS_ENV, "").strip()
    if given:
        return given
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def agentless_node(
    worker: str, agentless: bool, environ: Mapping[str, str]
) -> AgentlessNode | None:
    """The catalog node of a worker without an agent (None for a worker with one)."""
    return AgentlessNode(worker, node_address(environ)) if agentless else None


def create_session(consul: Consul, terms: SessionTerms) -> str:
    """Make a session on the serving agent's node (its serfHealth check), or, for an agentless
    worker, register its node first (idempotent, so a node someone deregistered comes back)
    and make a TTL-only session on it."""
    name, ttl, lock_delay, behavior = terms.name, terms.ttl, terms.lock_delay, terms.behavior
    node = terms.node
    if node is None:
        return consul.session.create(name=name, ttl=ttl, lock_delay=lock_delay, behavior=behavior)
    consul.catalog.register_node(node.name, node.address)
    return consul.session.create(
        name=name, ttl=ttl, lock_delay=lock_delay, behavior=behavior, node=node.name, checks=()
    )


def deregister_node(consul: Consul, node: AgentlessNode) -> str | None:
    """Remove the agentless worker's node at a clean stop (after its sessions are destroyed);
    best effort: the error said, or None. A node left behind holds nothing: its sessions
    have ended with their TTL, and the next start registers it again."""
    try:
        consul.catalog.deregister_node(node.name)
    except ConsulError as exc:
        return str(exc)
    return None


class OwnSession:
    """One session on the agent we talk to (its node's serfHealth check), or one made by someone
    else and only used here (`adopt`: renewed, never destroyed)."""

    def __init__(self, consul: Consul, terms: SessionTerms) -> None:
        self.consul = consul
        self.terms = terms
        self.id = ""
        self.adopted = False

    def create(self) -> str:
        """Create the session (PermissionDenied without session write on the node)."""
        self.id = create_session(self.consul, self.terms)
        return self.id

    def adopt(self, session_id: str) -> None:
        """Use a session someone else keeps and destroys (the scheduler's, across ticks)."""
        self.id, self.adopted = session_id, True

    @property
    def renew_timeout(self) -> float:
        """The client timeout of one renew: below the renew interval, so renewals never pile up."""
        return min(self.terms.renew_interval / 2, self.consul.settings.timeout)

    def renew(self) -> None:
        """Renew once, not retried; NotFound when Consul no longer knows the session."""
        self.consul.session.renew(self.id, timeout=self.renew_timeout, retry=NO_RETRY)

    def destroy(self) -> None:
        """Destroy the session, best effort (the TTL ends it anyway); never an adopted one."""
        if not self.id or self.adopted:
            return
        with contextlib.suppress(ConsulError):
            self.consul.session.destroy(self.id)
