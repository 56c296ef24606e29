"""Plan: the changes that bring live Consul ACLs to what the spec renders. Pure, no I/O.

plan_changes(desired, live, ...) -> Plan of create/update/delete for policies and tokens.
Policies are matched by name, worker tokens by their description (the marker), rules are
compared semantically (`acl.rules`: parsed, comments and layout dropped, rules sorted). A policy
whose list `Hash` equals the hash of the desired name, description and rules is identical without
reading its rules, so a no-op plan needs only the two list calls whatever the size of the spec.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from provision.acl.identity_plan import IdentityChange, plan_identity
from provision.acl.owners import refuse_foreign_objects
from provision.acl.rules import rules_equivalent

# The `X as X` imports are re-exported: apply and the CLI take the plan's vocabulary from here.
from provision.acl.state import Desired as Desired
from provision.acl.state import DesiredPolicy, TokenFileState, is_managed_policy
from provision.acl.state import LivePolicy as LivePolicy
from provision.acl.state import LiveState as LiveState
from provision.acl.state import LiveToken as LiveToken
from provision.acl.state import desired_from_render as desired_from_render
from provision.spec.names import parse_managed, parse_token_description

Action = Literal["create", "update", "delete", "write-secret"]


# --- the plan -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyChange:
    action: Action
    name: str
    reason: str
    policy_id: str | None = None  # update, delete
    description: str = ""
    rules: str = field(default="", repr=False)


@dataclass(frozen=True)
class TokenChange:
    action: Action
    worker: str | None  # None for a managed token of a worker no longer in the spec
    reason: str
    accessor_id: str | None = None  # update, delete, write-secret
    description: str = ""
    policies: tuple[str, ...] = ()
    datacenter: str | None = None  # the worker's: its token is awaited there before use


@dataclass(frozen=True)
class Plan:
    policies: tuple[PolicyChange, ...]
    tokens: tuple[TokenChange, ...]
    unchanged_policies: int
    unchanged_tokens: int
    not_pruned: tuple[str, ...] = ()  # managed objects no longer in the spec, kept (no --prune)
    identity: tuple[IdentityChange, ...] = ()  # auth methods, roles, binding rules
    unchanged_identity: int = 0

    @property
    def has_changes(self) -> bool:
        return bool(self.policies or self.tokens or self.identity)

    def count(self, action: Action) -> int:
        actions = [c.action for c in self.policies] + [c.action for c in self.tokens]
        return (actions + [c.action for c in self.identity]).count(action)

    def to_record(self) -> dict[str, Any]:
        """A JSON-able view (no rules text, no secrets), for --json and golden tests."""
        return {
            "changes_pending": self.has_changes,
            "policies": [
                {"action": c.action, "name": c.name, "reason": c.reason} for c in self.policies
            ],
            "tokens": [
                {
                    "action": c.action,
                    "worker": c.worker,
                    "accessor_id": c.accessor_id,
                    "policies": list(c.policies),
                    "reason": c.reason,
                }
                for c in self.tokens
            ],
            "unchanged": {"policies": self.unchanged_policies, "tokens": self.unchanged_tokens},
            "not_pruned": list(self.not_pruned),
        } | self._identity_record()

    def _identity_record(self) -> dict[str, Any]:
        """The identity part, only for a plan that has one (older plans' records unchanged)."""
        if not (self.identity or self.unchanged_identity):
            return {}
        return {
            "identity": [c.to_record() for c in self.identity],
            "unchanged_identity": self.unchanged_identity,
        }


def policies_to_read(desired: Desired, live: LiveState) -> list[str]:
    """IDs of live policies whose rules must be read to compare: same name, different hash."""
    by_name = {p.name: p for p in live.policies}
    wanted = []
    for policy in desired.policies:
        current = by_name.get(policy.name)
        if current is not None and current.rules is None and current.hash != policy.hash:
            wanted.append(current.id)
    return wanted


def workers_with_tokens(desired: Desired, live: LiveState) -> list[str]:
    """Workers that have a managed token already: the ones whose token file must be checked
    (a worker without one gets a new token and a new file whatever its file holds)."""
    live_descriptions = {t.description for t in live.tokens}
    return [t.worker for t in desired.tokens if t.description in live_descriptions]


def plan_changes(
    desired: Desired,
    live: LiveState,
    *,
    token_files: Mapping[str, TokenFileState] | None = None,
    prune: bool = False,
) -> Plan:
    """The changes that make `live` match `desired`.

    `token_files`: the state of each worker's token file (a worker without an entry has none).
    A file that does not hold the worker's current token, or is open to others, is rewritten.
    With `prune`, managed policies and tokens no longer in the spec are deleted; never anything
    unmarked. Only objects of the spec's owner are its own: one the spec wants that is marked as
    another owner's is an OwnerConflict (raised before any change is planned), and another
    owner's objects are never stale here.
    """
    refuse_foreign_objects(desired, live)
    policy_changes, same_policies = _plan_policies(desired, live)
    token_changes, same_tokens = _plan_tokens(desired, live, token_files or {})
    stale_tokens = _stale_tokens(desired, live)
    stale_policies = _stale_policies(desired, live)
    not_pruned: list[str] = []
    if prune:
        token_changes += [
            TokenChange(
                "delete", None, "managed, no longer in the spec", t.accessor_id, t.description
            )
            for t in stale_tokens
        ]
        policy_changes += [
            PolicyChange("delete", p.name, "managed, no longer in the spec", p.id, p.description)
            for p in stale_policies
        ]
    else:
        not_pruned = [f"token {t.description!r}" for t in stale_tokens]
        not_pruned += [f"policy {p.name}" for p in stale_policies]
    identity = plan_identity(desired.identity, live.identity, prune=prune, owner=desired.owner)
    return Plan(
        tuple(policy_changes),
        tuple(token_changes),
        same_policies,
        same_tokens,
        tuple(not_pruned) + identity.not_pruned,
        identity.changes,
        identity.unchanged,
    )


def _plan_policies(desired: Desired, live: LiveState) -> tuple[list[PolicyChange], int]:
    by_name = {p.name: p for p in live.policies}
    changes: list[PolicyChange] = []
    unchanged = 0
    for policy in sorted(desired.policies, key=lambda p: p.name):
        current = by_name.get(policy.name)
        if current is None:
            changes.append(
                PolicyChange("create", policy.name, "new", None, policy.description, policy.rules)
            )
            continue
        reason = _policy_difference(policy, current)
        if reason is None:
            unchanged += 1
        else:
            changes.append(
                PolicyChange(
                    "update", policy.name, reason, current.id, policy.description, policy.rules
                )
            )
    return changes, unchanged


def _policy_difference(policy: DesiredPolicy, current: LivePolicy) -> str | None:
    """Why `current` must be updated to `policy`, or None when they mean the same."""
    if current.hash == policy.hash:
        return None
    reasons = []
    if current.rules is None or not rules_equivalent(current.rules, policy.rules):
        reasons.append("rules differ")
    if current.description != policy.description:
        if parse_managed(current.description) is None:
            reasons.append("adopt: existing policy of that name gets lockctl's marker")
        else:
            reasons.append("description differs")
    return "; ".join(reasons) or None


def _plan_tokens(
    desired: Desired, live: LiveState, token_files: Mapping[str, TokenFileState]
) -> tuple[list[TokenChange], int]:
    changes: list[TokenChange] = []
    unchanged = 0
    for token in sorted(desired.tokens, key=lambda t: t.worker):
        mine = [t for t in live.tokens if t.description == token.description]
        if not mine:
            changes.append(
                TokenChange(
                    "create",
                    token.worker,
                    "new",
                    None,
                    token.description,
                    token.policies,
                    token.datacenter,
                )
            )
            continue
        held = token_files.get(token.worker)
        holds = held.holds if held is not None else None
        # Keep the token the worker's file holds; else the newest (a rotate writes it first).
        keep = max(mine, key=lambda t: (t.accessor_id == holds, t.create_index))
        for extra in sorted(mine, key=lambda t: t.create_index):
            if extra is not keep:
                changes.append(
                    TokenChange(
                        "delete",
                        token.worker,
                        "duplicate token for this worker (interrupted run)",
                        extra.accessor_id,
                        extra.description,
                        extra.policies,
                    )
                )
        quiet = True
        if keep.policies != token.policies:
            quiet = False
            changes.append(
                TokenChange(
                    "update",
                    token.worker,
                    _policy_set_change(keep.policies, token.policies),
                    keep.accessor_id,
                    token.description,
                    token.policies,
                    token.datacenter,
                )
            )
        why = _token_file_problem(held, keep)
        if why is not None:
            quiet = False
            changes.append(
                TokenChange(
                    "write-secret",
                    token.worker,
                    why,
                    keep.accessor_id,
                    token.description,
                    token.policies,
                    token.datacenter,
                )
            )
        if quiet and len(mine) == 1:
            unchanged += 1
    return changes, unchanged


def _token_file_problem(held: TokenFileState | None, keep: LiveToken) -> str | None:
    """Why the worker's token file must be (re)written with `keep`'s secret, or None."""
    if held is None:
        return "token file missing"
    if held.problems:
        return "; ".join(held.problems)
    if held.holds != keep.accessor_id:
        return "token file holds another token's secret"
    return None


def _policy_set_change(old: Iterable[str], new: Iterable[str]) -> str:
    added = sorted(set(new) - set(old))
    removed = sorted(set(old) - set(new))
    parts = [f"+{name}" for name in added] + [f"-{name}" for name in removed]
    return "policies " + " ".join(parts)


def _stale_tokens(desired: Desired, live: LiveState) -> list[LiveToken]:
    """The owner's worker tokens whose worker the spec no longer has."""
    wanted = {t.description for t in desired.tokens}
    return sorted(
        (
            t
            for t in live.tokens
            if _is_owners_token(t, desired.owner) and t.description not in wanted
        ),
        key=lambda t: (t.description, t.create_index),
    )


def _is_owners_token(token: LiveToken, owner: str) -> bool:
    marker = parse_token_description(token.description)
    return marker is not None and marker.owner == owner


def _stale_policies(desired: Desired, live: LiveState) -> list[LivePolicy]:
    """The owner's policies the spec no longer has (another owner's are never stale here)."""
    wanted = {p.name for p in desired.policies}
    return sorted(
        (p for p in live.policies if is_managed_policy(p, desired.owner) and p.name not in wanted),
        key=lambda p: p.name,
    )
