"""Consul's auth methods, ACL roles, binding rules, login and logout: one small method per
endpoint (as consul/api.py), with the typed views of what they answer.

Consul 1.8's lists: /v1/acl/auth-methods omits each method's Config (read it by name); roles
and binding rules come whole from their lists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from provision.consul.errors import PermissionDenied
from provision.consul.transport import IDEMPOTENT, Call, Transport, quote_path
from provision.system.secrets import Secret


@dataclass(frozen=True)
class AuthMethodInfo:
    """An auth method; `config` is empty in list answers."""

    name: str
    type: str
    description: str
    max_token_ttl: str  # as Consul shows it ("10m0s"); "" when unset
    config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_api(cls, raw: dict[str, Any]) -> AuthMethodInfo:
        return cls(
            name=str(raw["Name"]),
            type=str(raw.get("Type") or ""),
            description=str(raw.get("Description") or ""),
            max_token_ttl=str(raw.get("MaxTokenTTL") or ""),
            config=dict(raw.get("Config") or {}),
        )


@dataclass(frozen=True)
class Role:
    """An ACL role and the names of the policies it holds (sorted)."""

    id: str
    name: str
    description: str
    policy_names: tuple[str, ...]

    @classmethod
    def from_api(cls, raw: dict[str, Any]) -> Role:
        return cls(
            id=str(raw["ID"]),
            name=str(raw["Name"]),
            description=str(raw.get("Description") or ""),
            policy_names=tuple(sorted(str(p["Name"]) for p in raw.get("Policies") or ())),
        )


@dataclass(frozen=True)
class BindingRule:
    """A binding rule: tokens from `auth_method` whose claims `selector` matches get the role
    (BindType "role") or service identity `bind_name`."""

    id: str
    description: str
    auth_method: str
    selector: str
    bind_type: str
    bind_name: str

    @classmethod
    def from_api(cls, raw: dict[str, Any]) -> BindingRule:
        return cls(
            id=str(raw["ID"]),
            description=str(raw.get("Description") or ""),
            auth_method=str(raw.get("AuthMethod") or ""),
            selector=str(raw.get("Selector") or ""),
            bind_type=str(raw.get("BindType") or ""),
            bind_name=str(raw.get("BindName") or ""),
        )


@dataclass(frozen=True)
class LoginToken:
    """What a login answers: the token (its secret masked), and how long it lives.

    `lifetime`: seconds from its CreateTime to its ExpirationTime, both on Consul's clock (so
    this host's clock does not enter into it); None when Consul gave no expiry."""

    accessor_id: str
    secret: Secret = field(repr=False)
    lifetime: float | None
    auth_method: str = ""

    @classmethod
    def from_api(cls, raw: dict[str, Any]) -> LoginToken:
        return cls(
            accessor_id=str(raw["AccessorID"]),
            secret=Secret(str(raw["SecretID"])),
            lifetime=token_lifetime(raw.get("CreateTime"), raw.get("ExpirationTime")),
            auth_method=str(raw.get("AuthMethod") or ""),
        )


def token_lifetime(created: object, expires: object) -> float | None:
    """Seconds from `created` to `expires` (Consul's RFC 3339 times, nanoseconds and all);
    None when either is missing or unreadable."""
    try:
        start = _rfc3339(str(created))
        end = _rfc3339(str(expires))
    except ValueError:
        return None
    return max((end - start).total_seconds(), 0.0)


_RFC3339 = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)")


def _rfc3339(text: str) -> datetime:
    """Consul writes nanoseconds ("...46.7918347Z"); Python reads at most microseconds."""
    found = _RFC3339.fullmatch(text.strip())
    if found is None:
        raise ValueError(f"not an RFC 3339 time: {text[:40]!r}")
    whole, fraction, zone = found.groups()
    micro = (fraction or "")[:6].ljust(6, "0")
    return datetime.fromisoformat(f"{whole}.{micro}{'+00:00' if zone == 'Z' else zone}")


class IdentityAPI:
    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    # --- auth methods -----------------------------------------------------------------------

    def list_auth_methods(self) -> list[AuthMethodInfo]:
        """Every auth method, without its Config.
        GET /v1/acl/auth-methods"""
        answer = self._transport.request(Call("GET", "/v1/acl/auth-methods"), IDEMPOTENT)
        return [AuthMethodInfo.from_api(raw) for raw in answer.body or ()]

    def read_auth_method(self, name: str) -> AuthMethodInfo:
        """One auth method with its Config.
        GET /v1/acl/auth-method/:name"""
        path = "/v1/acl/auth-method/" + quote_path(name)
        return AuthMethodInfo.from_api(self._transport.request(Call("GET", path), IDEMPOTENT).body)

    def create_auth_method(self, body: dict[str, Any]) -> AuthMethodInfo:
        """Create an auth method from Consul's own fields (Name, Type, Config, ...).
        PUT /v1/acl/auth-method"""
        answer = self._transport.request(Call("PUT", "/v1/acl/auth-method", json_body=body))
        return AuthMethodInfo.from_api(answer.body)

    def update_auth_method(self, body: dict[str, Any]) -> AuthMethodInfo:
        """Replace an auth method's fields (its Name and Type stay).
        PUT /v1/acl/auth-method/:name"""
        path = "/v1/acl/auth-method/" + quote_path(str(body["Name"]))
        answer = self._transport.request(Call("PUT", path, json_body=body), IDEMPOTENT)
        return AuthMethodInfo.from_api(answer.body)

    def delete_auth_method(self, name: str) -> None:
        """Delete an auth method (Consul deletes its binding rules and its tokens with it).
        DELETE /v1/acl/auth-method/:name"""
        path = "/v1/acl/auth-method/" + quote_path(name)
        self._transport.request(Call("DELETE", path), IDEMPOTENT)

    # --- roles ------------------------------------------------------------------------------

    def list_roles(self) -> list[Role]:
        """Every ACL role with its policy links.
        GET /v1/acl/roles"""
        answer = self._transport.request(Call("GET", "/v1/acl/roles"), IDEMPOTENT)
        return [Role.from_api(raw) for raw in answer.body or ()]

    def create_role(self, name: str, description: str, policy_names: list[str]) -> Role:
        """Create a role holding the named policies.
        PUT /v1/acl/role"""
        body = _role_body(name, description, policy_names)
        return Role.from_api(
            self._transport.request(Call("PUT", "/v1/acl/role", json_body=body)).body
        )

    def update_role(
        self, role_id: str, name: str, description: str, policy_names: list[str]
    ) -> Role:
        """Replace a role's name, description and policies.
        PUT /v1/acl/role/:id"""
        body = {"ID": role_id, **_role_body(name, description, policy_names)}
        path = "/v1/acl/role/" + quote_path(role_id)
        answer = self._transport.request(Call("PUT", path, json_body=body), IDEMPOTENT)
        return Role.from_api(answer.body)

    def delete_role(self, role_id: str) -> None:
        """Delete a role.
        DELETE /v1/acl/role/:id"""
        self._transport.request(Call("DELETE", "/v1/acl/role/" + quote_path(role_id)), IDEMPOTENT)

    # --- binding rules ----------------------------------------------------------------------

    def list_binding_rules(self) -> list[BindingRule]:
        """Every binding rule, of every auth method.
        GET /v1/acl/binding-rules"""
        answer = self._transport.request(Call("GET", "/v1/acl/binding-rules"), IDEMPOTENT)
        return [BindingRule.from_api(raw) for raw in answer.body or ()]

    def create_binding_rule(
        self, auth_method: str, description: str, selector: str, role: str
    ) -> BindingRule:
        """Create a rule giving role `role` to logins through `auth_method` that match.
        PUT /v1/acl/binding-rule"""
        body = _rule_body(auth_method, description, selector, role)
        answer = self._transport.request(Call("PUT", "/v1/acl/binding-rule", json_body=body))
        return BindingRule.from_api(answer.body)

    def update_binding_rule(
        self, rule_id: str, auth_method: str, description: str, selector: str, role: str
    ) -> BindingRule:
        """Replace a binding rule's description, selector and role.
        PUT /v1/acl/binding-rule/:id"""
        body = {"ID": rule_id, **_rule_body(auth_method, description, selector, role)}
        path = "/v1/acl/binding-rule/" + quote_path(rule_id)
        answer = self._transport.request(Call("PUT", path, json_body=body), IDEMPOTENT)
        return BindingRule.from_api(answer.body)

    def delete_binding_rule(self, rule_id: str) -> None:
        """Delete a binding rule.
        DELETE /v1/acl/binding-rule/:id"""
        path = "/v1/acl/binding-rule/" + quote_path(rule_id)
        self._transport.request(Call("DELETE", path), IDEMPOTENT)

    # --- login ------------------------------------------------------------------------------

    def login(self, auth_method: str, bearer_token: Secret) -> LoginToken:
        """Exchange a JWT for a token (no token needed); the answer holds its secret. Never
        retried on a 5xx (not idempotent: a 500 here is mostly a refused JWT, CONSUL_FACTS).
        POST /v1/acl/login"""
        body = {"AuthMethod": auth_method, "BearerToken": bearer_token.reveal()}
        answer = self._transport.request(
            Call("POST", "/v1/acl/login", json_body=body, token=None, redact=(bearer_token,))
        )
        return LoginToken.from_api(answer.body)

    def token_known(self, token: Secret) -> bool:
        """Whether the agent knows `token` yet: a login's token reaches the other servers a
        moment after the one that made it, and is refused (403 "ACL not found") meanwhile.
        Asked `stale`: answered by the server the agent resolves tokens with, not the leader.
        GET /v1/acl/token/self?stale"""
        try:
            path, stale = "/v1/acl/token/self", {"stale": ""}
            self._transport.request(Call("GET", path, params=stale, token=token), IDEMPOTENT)
        except PermissionDenied:
            return False
        return True

    def logout(self, token: Secret) -> None:
        """Destroy a token that login made, with that token itself.
        POST /v1/acl/logout"""
        self._transport.request(Call("POST", "/v1/acl/logout", token=token), IDEMPOTENT)


def _role_body(name: str, description: str, policy_names: list[str]) -> dict[str, Any]:
    return {
        "Name": name,
        "Description": description,
        "Policies": [{"Name": policy} for policy in policy_names],
    }


def _rule_body(auth_method: str, description: str, selector: str, role: str) -> dict[str, Any]:
    return {
        "AuthMethod": auth_method,
        "Description": description,
        "Selector": selector,
        "BindType": "role",
        "BindName": role,
    }
