"""The two sides a plan compares: what the spec wants in Consul, and what Consul holds.

Both are plain frozen values (no I/O): `desired_from_render` builds the first from a rendered
spec, apply reads the second from the ACL lists (`from_api`), and `acl.plan` diffs them.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from provision.acl.identity import NO_IDENTITY, DesiredIdentity
from provision.acl.identity_plan import NO_LIVE_IDENTITY, LiveIdentity
from provision.spec.names import (
    DEFAULT_OWNER,
    LOCK_POLICY_PREFIX,
    SESSION_POLICY_PREFIX,
    managed_description,
    parse_managed,
)

if TYPE_CHECKING:  # only a type here: importing render would load jinja2 into the pure plan
    from provision.acl.render import RenderResult

MANAGED_POLICY_PREFIXES = (LOCK_POLICY_PREFIX, SESSION_POLICY_PREFIX)


# --- what we want ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DesiredPolicy:
    name: str
    description: str
    rules: str

    @property
    def hash(self) -> str:
        return policy_hash(self.name, self.description, self.rules)


@dataclass(frozen=True)
class DesiredToken:
    worker: str
    description: str
    policies: tuple[str, ...]  # sorted
    datacenter: str | None = None  # the worker's (a spec that names datacenters)


@dataclass(frozen=True)
class Desired:
    policies: tuple[DesiredPolicy, ...]
    tokens: tuple[DesiredToken, ...]
    identity: DesiredIdentity = NO_IDENTITY  # auth methods, roles, binding rules
    owner: str = DEFAULT_OWNER  # the spec's: only objects whose marker names it are its own


def desired_from_render(result: RenderResult) -> Desired:
    """What Consul should hold for a rendered spec."""
    policies = tuple(
        DesiredPolicy(p.name, managed_description(p.source, result.owner), p.rules)
        for p in result.policies
    )
    tokens = tuple(
        DesiredToken(t.worker, t.description, tuple(sorted(t.policies)), t.datacenter)
        for t in result.tokens
    )
    return Desired(policies, tokens, result.identity, result.owner)


def policy_hash(name: str, description: str, rules: str) -> str:
    """Consul's own policy hash (blake2b-256 of name, description, rules), as the list shows it.

    Consul OSS hashes exactly these fields (plus datacenters, which lockctl never sets).
    """
    digest = hashlib.blake2b(digest_size=32)
    for part in (name, description, rules):
        digest.update(part.encode("utf-8"))
    return base64.b64encode(digest.digest()).decode("ascii")


# --- what Consul has ------------------------------------------------------------------------


@dataclass(frozen=True)
class LivePolicy:
    """A policy from the list (rules None until read)."""

    id: str
    name: str
    description: str
    hash: str
    rules: str | None = None

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> LivePolicy:
        return cls(
            id=str(raw["ID"]),
            name=str(raw["Name"]),
            description=str(raw.get("Description") or ""),
            hash=str(raw.get("Hash") or ""),
            rules=raw.get("Rules"),
        )


@dataclass(frozen=True)
class LiveToken:
    """A token from the list (never with its secret)."""

    accessor_id: str
    description: str
    policies: tuple[str, ...]  # sorted names
    create_index: int = 0

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> LiveToken:
        return cls(
            accessor_id=str(raw["AccessorID"]),
            description=str(raw.get("Description") or ""),
            policies=tuple(sorted(str(p["Name"]) for p in raw.get("Policies") or ())),
            create_index=int(raw.get("CreateIndex") or 0),
        )


@dataclass(frozen=True)
class LiveState:
    policies: tuple[LivePolicy, ...]
    tokens: tuple[LiveToken, ...]
    identity: LiveIdentity = NO_LIVE_IDENTITY  # read only when the spec has identities, or --prune


@dataclass(frozen=True)
class TokenFileState:
    """A worker's token file as checked (never its secret): which token Consul says the secret
    is, if any, and what else is wrong with the file (content, mode, owner)."""

    holds: str | None = None  # the accessor ID of the token the secret belongs to
    problems: tuple[str, ...] = ()


def is_managed_policy(policy: LivePolicy, owner: str) -> bool:
    """`owner`'s own worker policies: lockctl's name prefix and a marker naming `owner`."""
    marker = parse_managed(policy.description)
    return (
        policy.name.startswith(MANAGED_POLICY_PREFIXES)
        and marker is not None
        and marker.owner == owner
    )
