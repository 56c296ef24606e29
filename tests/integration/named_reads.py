"""Reads of what a test made, by name or by link, never a list of the whole cluster: the client's
list methods answer with every policy, token, role and binding rule, other tests' too. Consul
filters some lists itself (`?policy=`, `?authmethod=`), which the client does not offer, so these
go through its transport, as test_login.py's token list does."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from provision.consul import Consul, NotFound, PermissionDenied
from provision.consul.identity import BindingRule, Role
from provision.consul.models import Policy, Session, Token
from provision.consul.transport import IDEMPOTENT, Call, quote_path
from provision.spec.names import DEFAULT_OWNER, session_policy_name, token_description

Listed = TypeVar("Listed", Policy, Token, Session)


def carrying(listed: Iterable[Listed], uid: str) -> list[Listed]:
    """Of a list answer for the whole cluster (every test's policies, tokens or sessions), only
    the objects whose name or description carries `uid`, in the order listed: for the tests of
    the list calls themselves, which assert on what they made and nothing else."""
    return [item for item in listed if uid in _label(item)]


def _label(item: Policy | Token | Session) -> str:
    return " ".join((getattr(item, "name", ""), getattr(item, "description", "")))


def _get(consul: Consul, path: str, **params: str) -> Any:
    return consul.transport.request(Call("GET", path, params=params or None), IDEMPOTENT).body


def policy_named(consul: Consul, name: str) -> Policy | None:
    """The policy called `name` (with its rules), or None when there is none.
    GET /v1/acl/policy/name/:name

    Consul 1.8.7 answers a missing name with 403 "ACL not found" (newer versions 404); any other
    403 is a denial and raised. The client's `read_policy_by_name` tells the two apart by
    listing every policy instead.
    """
    try:
        return Policy.from_api(_get(consul, "/v1/acl/policy/name/" + quote_path(name)))
    except NotFound:
        return None
    except PermissionDenied as denied:
        if "ACL not found" in denied.body:
            return None
        raise


def tokens_with_policy(consul: Consul, policy_id: str) -> list[Token]:
    """The tokens linked to one policy, without their secrets.
    GET /v1/acl/tokens?policy="""
    return [Token.from_api(raw) for raw in _get(consul, "/v1/acl/tokens", policy=policy_id) or ()]


def worker_tokens(consul: Consul, worker: str, owner: str = DEFAULT_OWNER) -> list[str]:
    """The accessors of `worker`'s lockctl tokens (of `owner`'s spec): every token apply or
    rotate mints for it carries its session policy, so they are read by that link, not picked
    from the list of every token (in the order Consul lists them)."""
    session_policy = policy_named(consul, session_policy_name(worker))
    if session_policy is None:
        return []
    return [
        t.accessor_id
        for t in tokens_with_policy(consul, session_policy.id)
        if t.description == token_description(worker, owner)
    ]


def role_named(consul: Consul, name: str) -> Role | None:
    """The role called `name`, or None (1.8.7 answers a missing one with 404).
    GET /v1/acl/role/name/:name"""
    try:
        return Role.from_api(_get(consul, "/v1/acl/role/name/" + quote_path(name)))
    except NotFound:
        return None


def auth_method_named(consul: Consul, name: str) -> str | None:
    """The name of the auth method called `name` if there is one, else None.
    GET /v1/acl/auth-method/:name"""
    try:
        return str(_get(consul, "/v1/acl/auth-method/" + quote_path(name))["Name"])
    except NotFound:
        return None


def binding_rules_of(consul: Consul, auth_method: str) -> list[BindingRule]:
    """The binding rules of one auth method ([] when it has none or does not exist).
    GET /v1/acl/binding-rules?authmethod="""
    answer = _get(consul, "/v1/acl/binding-rules", authmethod=auth_method)
    return [BindingRule.from_api(raw) for raw in answer or ()]


def serf_health(consul: Consul, node: str) -> str | None:
    """The status of `node`'s serfHealth check ("passing", "critical"), or None without one.
    GET /v1/health/node/:node"""
    checks = _get(consul, "/v1/health/node/" + quote_path(node)) or ()
    return next((str(c["Status"]) for c in checks if c["CheckID"] == "serfHealth"), None)
