"""Plan the identity objects (auth methods, roles, binding rules): pure, no I/O.

Auth methods and roles are matched by name (an unmarked one of that name is adopted: updated
to carry lockctl's marker), binding rules, which have no name, by their marker description
(`lockctl-managed: worker "w"`) within their auth method, else adopted when an unmarked rule
of that method binds the worker's role. Compared semantically: audiences and keys as sets,
"10m0s" equal to "600s". With prune, the objects marked as the spec owner's that the spec no
longer has are deleted; nothing unmarked, and nothing of another owner, ever is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from provision.acl.identity import (
    DesiredAuthMethod,
    DesiredIdentity,
    DesiredRole,
    DesiredRule,
)
from provision.durations import DurationSyntaxError, parse_duration
from provision.errors import InputError
from provision.spec.names import DEFAULT_OWNER, ROLE_PREFIX, parse_managed

IdentityAction = Literal["create", "update", "delete"]
Kind = Literal["auth-method", "role", "binding-rule"]
WORKER_SOURCE = 'worker "'  # the start of a role's or binding rule's marker source
METHOD_SOURCE = 'auth_method "'
_CONFIG_KEYS = ("BoundIssuer", "BoundAudiences", "JWTValidationPubKeys", "ClaimMappings")


# --- what Consul has ------------------------------------------------------------------------


@dataclass(frozen=True)
class LiveAuthMethod:
    name: str
    type: str
    description: str
    max_token_ttl: str  # as Consul shows it: "10m0s"
    config: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LiveRole:
    id: str
    name: str
    description: str
    policies: tuple[str, ...]  # sorted names


@dataclass(frozen=True)
class LiveRule:
    id: str
    auth_method: str
    description: str
    selector: str
    bind_type: str
    bind_name: str


@dataclass(frozen=True)
class LiveIdentity:
    methods: tuple[LiveAuthMethod, ...] = ()
    roles: tuple[LiveRole, ...] = ()
    rules: tuple[LiveRule, ...] = ()


NO_LIVE_IDENTITY = LiveIdentity()


class IdentityConflict(InputError):
    """Consul holds an object lockctl cannot turn into the spec's (an auth method's type)."""


# --- the plan -------------------------------------------------------------------------------


@dataclass(frozen=True)
class IdentityChange:
    action: IdentityAction
    kind: Kind
    name: str  # the method's or role's name; a binding rule's worker (or its description)
    reason: str
    id: str | None = None  # role and rule IDs (update, delete); a method's name
    method: DesiredAuthMethod | None = field(default=None, repr=False)
    role: DesiredRole | None = None
    rule: DesiredRule | None = None

    def to_record(self) -> dict[str, Any]:
        return {"action": self.action, "kind": self.kind, "name": self.name, "reason": self.reason}


@dataclass(frozen=True)
class IdentityPlan:
    changes: tuple[IdentityChange, ...] = ()
    unchanged: int = 0
    not_pruned: tuple[str, ...] = ()


def plan_identity(
    desired: DesiredIdentity, live: LiveIdentity, *, prune: bool, owner: str = DEFAULT_OWNER
) -> IdentityPlan:
    """The changes that make `live`'s identity objects match `desired`; only `owner`'s marked
    objects are ever stale (deleted with `prune`)."""
    changes: list[IdentityChange] = []
    stale: list[IdentityChange] = []
    unchanged = 0
    for plan in (_plan_methods, _plan_roles, _plan_rules):
        made, same, old = plan(desired, live, owner)
        changes += made
        stale += old
        unchanged += same
    if prune:
        # Deletes in the order apply runs them: rules, then roles, then methods.
        order: dict[Kind, int] = {"binding-rule": 0, "role": 1, "auth-method": 2}
        changes += sorted(stale, key=lambda c: (order[c.kind], c.name))
        return IdentityPlan(tuple(changes), unchanged)
    kept = tuple(f"{c.kind} {c.name}" for c in stale)
    return IdentityPlan(tuple(changes), unchanged, kept)


_Planned = tuple[list[IdentityChange], int, list[IdentityChange]]


def _owned(description: str, owner: str, source: str) -> bool:
    """Whether `description` is `owner`'s marker on an object made from `source` (`worker "`)."""
    marker = parse_managed(description)
    return marker is not None and marker.owner == owner and marker.source.startswith(source)


def _plan_methods(desired: DesiredIdentity, live: LiveIdentity, owner: str) -> _Planned:
    by_name = {m.name: m for m in live.methods}
    changes: list[IdentityChange] = []
    unchanged = 0
    for want in desired.methods:
        have = by_name.get(want.name)
        if have is None:
            changes.append(IdentityChange("create", "auth-method", want.name, "new", None, want))
            continue
        if have.type != want.type:
            raise IdentityConflict(
                f'auth method "{want.name}" in Consul has type "{have.type}", the spec says '
                f'"{want.type}": Consul cannot change a type; delete it or rename the spec\'s'
            )
        reasons = _method_differences(want, have)
        if reasons:
            changes.append(
                IdentityChange(
                    "update", "auth-method", want.name, "; ".join(reasons), want.name, want
                )
            )
        else:
            unchanged += 1
    wanted = {m.name for m in desired.methods}
    stale = [
        IdentityChange("delete", "auth-method", m.name, "managed, no longer in the spec", m.name)
        for m in sorted(live.methods, key=lambda m: m.name)
        if m.name not in wanted and _owned(m.description, owner, METHOD_SOURCE)
    ]
    return changes, unchanged, stale


def _method_differences(want: DesiredAuthMethod, have: LiveAuthMethod) -> list[str]:
    reasons = []
    if have.description != want.description:
        reasons.append(_description_reason(have.description))
    if _seconds(have.max_token_ttl) != want.max_token_ttl:
        reasons.append("max_token_ttl differs")
    config = have.config
    if str(config.get("BoundIssuer") or "") != want.bound_issuer:
        reasons.append("bound_issuer differs")
    if sorted(map(str, config.get("BoundAudiences") or ())) != list(want.bound_audiences):
        reasons.append("bound_audiences differ")
    keys = sorted(str(k).strip() for k in config.get("JWTValidationPubKeys") or ())
    if keys != sorted(k.strip() for k in want.public_keys):
        reasons.append("jwt_validation_pub_keys differ")
    if dict(config.get("ClaimMappings") or {}) != dict(want.claim_mappings):
        reasons.append("claim_mappings differ")
    extra = sorted(k for k, v in config.items() if k not in _CONFIG_KEYS and v not in _EMPTY)
    if extra:
        reasons.append(f"config sets {', '.join(extra)}, which the spec does not")
    return reasons


_EMPTY: tuple[Any, ...] = (None, "", 0, False, [], {})


def _seconds(text: str) -> float:
    try:
        return parse_duration(text).seconds if text else 0.0
    except DurationSyntaxError:
        return -1.0  # never equal to a valid TTL: the update rewrites it


def _description_reason(current: str) -> str:
    if parse_managed(current) is None:
        return "adopt: existing object of that name gets lockctl's marker"
    return "description differs"


def _plan_roles(desired: DesiredIdentity, live: LiveIdentity, owner: str) -> _Planned:
    by_name = {r.name: r for r in live.roles}
    changes: list[IdentityChange] = []
    unchanged = 0
    for want in desired.roles:
        have = by_name.get(want.name)
        if have is None:
            changes.append(IdentityChange("create", "role", want.name, "new", role=want))
            continue
        reasons = []
        if have.policies != want.policies:
            reasons.append(_set_change("policies", have.policies, want.policies))
        if have.description != want.description:
            reasons.append(_description_reason(have.description))
        if reasons:
            changes.append(
                IdentityChange("update", "role", want.name, "; ".join(reasons), have.id, role=want)
            )
        else:
            unchanged += 1
    wanted = {r.name for r in desired.roles}
    stale = [
        IdentityChange("delete", "role", r.name, "managed, no longer in the spec", r.id)
        for r in sorted(live.roles, key=lambda r: r.name)
        if r.name not in wanted
        and r.name.startswith(ROLE_PREFIX)
        and _owned(r.description, owner, WORKER_SOURCE)
    ]
    return changes, unchanged, stale


def _set_change(what: str, old: tuple[str, ...], new: tuple[str, ...]) -> str:
    added = [f"+{n}" for n in sorted(set(new) - set(old))]
    removed = [f"-{n}" for n in sorted(set(old) - set(new))]
    return f"{what} {' '.join(added + removed)}"


def _plan_rules(desired: DesiredIdentity, live: LiveIdentity, owner: str) -> _Planned:
    changes: list[IdentityChange] = []
    unchanged = 0
    used: set[str] = set()
    for want in desired.rules:
        have = _matching_rule(want, live.rules, used)
        if have is None:
            changes.append(IdentityChange("create", "binding-rule", want.worker, "new", rule=want))
            continue
        used.add(have.id)
        reasons = []
        if have.selector != want.selector:
            reasons.append("selector differs (the worker's claims changed)")
        if (have.bind_type, have.bind_name) != ("role", want.role):
            reasons.append(f"binds {have.bind_type} {have.bind_name}, not role {want.role}")
        if have.description != want.description:
            reasons.append(_description_reason(have.description))
        if reasons:
            changes.append(
                IdentityChange(
                    "update", "binding-rule", want.worker, "; ".join(reasons), have.id, rule=want
                )
            )
        else:
            unchanged += 1
    stale = [
        IdentityChange(
            "delete", "binding-rule", _rule_label(r), "managed, no longer in the spec", r.id
        )
        for r in sorted(live.rules, key=lambda r: (r.description, r.id))
        if r.id not in used and _owned(r.description, owner, WORKER_SOURCE)
    ]
    return changes, unchanged, stale


def _matching_rule(
    want: DesiredRule, rules: tuple[LiveRule, ...], used: set[str]
) -> LiveRule | None:
    """The worker's marked rule in its method (the one with its selector first), else an
    unmarked rule of that method binding its role (adopted)."""
    mine = [r for r in rules if r.auth_method == want.auth_method and r.id not in used]
    marked = sorted(
        (r for r in mine if r.description == want.description),
        key=lambda r: (r.selector != want.selector, r.id),
    )
    if marked:
        return marked[0]
    unmarked = [
        r
        for r in mine
        if parse_managed(r.description) is None
        and (r.bind_type, r.bind_name) == ("role", want.role)
    ]
    return min(unmarked, key=lambda r: r.id) if unmarked else None


def _rule_label(rule: LiveRule) -> str:
    """A stale rule's worker, from its marker (`lockctl-managed: worker "w"` -> w)."""
    marker = parse_managed(rule.description)
    source = marker.source if marker is not None else ""
    return source.removeprefix(WORKER_SOURCE).removesuffix('"') or rule.id
