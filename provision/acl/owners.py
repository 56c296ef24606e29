"""Whose live ACL objects are whose: the refusal when a spec would write over an object another
spec's owner manages. Pure, no I/O.

Every object lockctl manages names its owner in its description (`provision.spec.names`); a
spec touches only its own owner's. An object the spec wants (by policy, role or auth method
name, or a token for one of its workers) that carries another owner's marker is never updated
or adopted: the plan is refused before anything is written.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from provision.acl.state import Desired, LiveState
from provision.errors import InputError
from provision.spec.names import parse_managed, parse_token_description
from provision.spec.problems import shown

SHOWN_AT_MOST = 3  # objects named in the one-line error beyond the first (then a count)


class OwnerConflict(InputError):
    """The spec names an object another owner's spec manages; nothing was written (exit 2)."""


@dataclass(frozen=True)
class Foreign:
    """A live object the spec wants, marked as another owner's."""

    what: str  # `policy lock-report`, `role worker-w1`, `auth-method k8s`, `token of worker w1`
    owner: str


def foreign_objects(desired: Desired, live: LiveState) -> list[Foreign]:
    """The objects `desired` would write that carry another owner's marker, sorted."""
    found = _foreign_named(
        "policy", {p.name for p in desired.policies}, live.policies, desired.owner
    )
    found += _foreign_named(
        "auth-method",
        {m.name for m in desired.identity.methods},
        live.identity.methods,
        desired.owner,
    )
    found += _foreign_named(
        "role", {r.name for r in desired.identity.roles}, live.identity.roles, desired.owner
    )
    workers = {t.worker for t in desired.tokens}
    for token in live.tokens:
        marker = parse_token_description(token.description)
        if marker is not None and marker.source in workers and marker.owner != desired.owner:
            found.append(Foreign(f"token of worker {marker.source}", marker.owner))
    return sorted(set(found), key=lambda f: (f.what, f.owner))


class _Described(Protocol):  # a live policy, auth method or role: what _foreign_named reads
    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...


def _foreign_named(
    kind: str, wanted: set[str], live: Iterable[_Described], owner: str
) -> list[Foreign]:
    found = []
    for current in live:
        if current.name not in wanted:
            continue
        marker = parse_managed(current.description)
        if marker is not None and marker.owner != owner:
            found.append(Foreign(f"{kind} {current.name}", marker.owner))
    return found


def refuse_foreign_objects(desired: Desired, live: LiveState) -> None:
    """Raise OwnerConflict, one line naming the object and both owners, when `desired` would
    write over any object of another owner."""
    found = foreign_objects(desired, live)
    if not found:
        return
    first = found[0]
    more = ""
    if len(found) > 1:
        others = ", ".join(
            f'{f.what} of owner "{shown(f.owner)}"' for f in found[1 : 1 + SHOWN_AT_MOST]
        )
        rest = len(found) - 1 - SHOWN_AT_MOST
        more = f" (and {len(found) - 1} more: {others}{', ...' if rest > 0 else ''})"
    raise OwnerConflict(
        f'{first.what} in Consul is managed by owner "{shown(first.owner)}", not by this '
        f'spec\'s owner "{desired.owner}"{more}: two specs on one cluster must not share a job, '
        "worker or auth method name (rename it in one of them); nothing was written"
    )
