"""Read the identity objects apply plans against, and the calls that carry out its changes.

The three lists (auth methods, roles, binding rules) plus a read of each auth method the spec
names (the list omits Config): a no-op costs 3 + the spec's methods requests. apply runs the
calls in its phases: methods, roles, rules created or updated after the policies (a role links
policies by name, a rule names its method and role), deletes in the reverse order.
"""

from __future__ import annotations

from collections.abc import Callable

from provision.acl.identity_plan import (
    IdentityChange,
    LiveAuthMethod,
    LiveIdentity,
    LiveRole,
    LiveRule,
)
from provision.acl.writes import ACL_READ_HINT, denied_as
from provision.consul import Consul


def read_live_identity(consul: Consul, method_names: set[str]) -> LiveIdentity:
    """Every auth method, role and binding rule; the Config of those in `method_names`."""
    api = consul.identity
    with denied_as(ACL_READ_HINT, "list auth methods, roles and binding rules"):
        listed = api.list_auth_methods()
        roles = api.list_roles()
        rules = api.list_binding_rules()
        methods = [
            api.read_auth_method(m.name) if m.name in method_names else m
            for m in sorted(listed, key=lambda m: m.name)
        ]
    return LiveIdentity(
        tuple(
            LiveAuthMethod(m.name, m.type, m.description, m.max_token_ttl, m.config)
            for m in methods
        ),
        tuple(LiveRole(r.id, r.name, r.description, r.policy_names) for r in roles),
        tuple(
            LiveRule(r.id, r.auth_method, r.description, r.selector, r.bind_type, r.bind_name)
            for r in rules
        ),
    )


def identity_phases(
    consul: Consul, changes: tuple[IdentityChange, ...]
) -> tuple[list[list[Callable[[], None]]], list[list[Callable[[], None]]]]:
    """The calls of `changes` as (writes, deletes), each a list of phases in their order."""
    writes = [
        [_call(consul, c) for c in changes if c.kind == kind and c.action != "delete"]
        for kind in ("auth-method", "role", "binding-rule")
    ]
    deletes = [
        [_call(consul, c) for c in changes if c.kind == kind and c.action == "delete"]
        for kind in ("binding-rule", "role", "auth-method")
    ]
    return writes, deletes


def _call(consul: Consul, change: IdentityChange) -> Callable[[], None]:
    api = consul.identity

    def call() -> None:
        if change.action == "delete":
            assert change.id is not None
            {
                "auth-method": api.delete_auth_method,
                "role": api.delete_role,
                "binding-rule": api.delete_binding_rule,
            }[change.kind](change.id)
        elif change.method is not None:
            body = change.method.body()
            if change.action == "create":
                api.create_auth_method(body)
            else:
                api.update_auth_method(body)
        elif change.role is not None:
            role = change.role
            if change.action == "create":
                api.create_role(role.name, role.description, list(role.policies))
            else:
                assert change.id is not None
                api.update_role(change.id, role.name, role.description, list(role.policies))
        else:
            assert change.rule is not None
            rule = change.rule
            args = (rule.auth_method, rule.description, rule.selector, rule.role)
            if change.action == "create":
                api.create_binding_rule(*args)
            else:
                assert change.id is not None
                api.update_binding_rule(change.id, *args)

    return call
