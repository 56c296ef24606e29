"""What the specs a test applies make in Consul, so that the test deletes that at its end, and
nothing else. The names come from rendering each spec, as apply does.

A name that carries the test's uid is the test's own by construction. Any other (a worker named
after a real node: `session-worker-1`, the worker's token, its role) is looked up when the test
first writes a spec naming it: one that is there already belongs to someone else and is left
alone, whatever the test's apply did to it (lockctl keys a worker's token and its session
policy by the worker's name alone, cluster-wide)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from provision.acl.render import RenderResult, render_policies
from provision.consul import Consul, ConsulError
from provision.errors import LockctlError
from provision.spec import load_spec
from provision.system.templates import find_templates_dir
from tests.integration.named_reads import (
    auth_method_named,
    policy_named,
    role_named,
    worker_tokens,
)

# Deleted in this order: an auth method takes its binding rules and login tokens with it.
KINDS = ("auth-method", "role", "token", "policy")


def _exists(consul: Consul, kind: str, name: str, owner: str) -> bool:
    if kind == "auth-method":
        return auth_method_named(consul, name) is not None
    if kind == "role":
        return role_named(consul, name) is not None
    if kind == "token":
        return bool(worker_tokens(consul, name, owner))
    return policy_named(consul, name) is not None


def _delete(consul: Consul, kind: str, name: str, owner: str) -> None:
    if kind == "auth-method":
        if auth_method_named(consul, name) is not None:
            consul.identity.delete_auth_method(name)
    elif kind == "role":
        role = role_named(consul, name)
        if role is not None:
            consul.identity.delete_role(role.id)
    elif kind == "token":
        for accessor in worker_tokens(consul, name, owner):
            consul.acl.delete_token(accessor)
    else:
        policy = policy_named(consul, name)
        if policy is not None:
            consul.acl.delete_policy(policy.id)


def _names(rendered: RenderResult) -> Iterator[tuple[str, str]]:
    """(kind, name) of everything apply makes for a rendered spec (a token: by its worker)."""
    yield from (("auth-method", m.name) for m in rendered.identity.methods)
    yield from (("role", r.name) for r in rendered.identity.roles)
    yield from (("token", t.worker) for t in rendered.tokens)
    yield from (("policy", p.name) for p in rendered.policies)


class SpecObjects:
    """The objects named by the specs a test wrote, and which of them were someone else's."""

    def __init__(self, management: Callable[[], Consul], uid: str) -> None:
        self.management = management  # of the Consul the test applies to
        self.uid = uid
        self.named: set[tuple[str, str]] = set()
        self.theirs: set[tuple[str, str]] = set()
        self.owner: dict[tuple[str, str], str] = {}  # the owner of the spec that named it first

    def note(self, spec_path: Path) -> None:
        """Call before the spec at `spec_path` is applied (an invalid one makes nothing)."""
        try:
            rendered = render_policies(load_spec(spec_path), find_templates_dir())
        except LockctlError:
            return
        consul = self.management()
        for kind, name in _names(rendered):
            if (kind, name) in self.named:
                continue
            self.named.add((kind, name))
            self.owner[(kind, name)] = rendered.owner
            if self.uid not in name and _exists(consul, kind, name, rendered.owner):
                self.theirs.add((kind, name))

    def delete(self) -> None:
        """Delete what the test made: every object its specs named that was not there before."""
        consul = self.management()
        mine = sorted(self.named - self.theirs, key=lambda item: (KINDS.index(item[0]), item[1]))
        failed = []
        for kind, name in mine:
            try:
                _delete(consul, kind, name, self.owner[(kind, name)])
            except ConsulError as exc:  # the others are still deleted; this one is reported
                failed.append(f"{kind} {name}: {exc}")
        assert not failed, f"left behind: {'; '.join(failed)}"
