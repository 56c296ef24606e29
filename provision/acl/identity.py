"""What Consul should hold for a spec's workload identities: each auth method (its public keys
read from their file now), one role per worker with an identity (the policies its token
carries), and one binding rule per such worker (BindType role, a selector built from its claims).

Pure but for reading the key files; the result is deterministic and sorted, so `render` writes
it as `identity.json` and `plan` diffs it against Consul.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provision.errors import InputError
from provision.spec.models import AuthMethod, Spec
from provision.spec.names import managed_description, role_name
from provision.system.files import UnreadableFile, read_regular_file

MAX_KEYS_BYTES = 1024 * 1024  # a PEM file of public keys; a JWKS of 1,000 keys is ~500 KB
_PEM = re.compile(
    r"-----BEGIN (PUBLIC KEY|RSA PUBLIC KEY|EC PUBLIC KEY|CERTIFICATE)-----\n"
    r"[A-Za-z0-9+/=\n]+?"
    r"-----END \1-----",
)


@dataclass(frozen=True)
class DesiredAuthMethod:
    """An auth method as Consul's PUT /v1/acl/auth-method takes it (`body`)."""

    name: str
    type: str
    description: str
    max_token_ttl: float  # seconds
    bound_issuer: str
    bound_audiences: tuple[str, ...]
    public_keys: tuple[str, ...]  # PEM blocks, as in the file
    claim_mappings: tuple[tuple[str, str], ...]  # (claim, name): Consul's direction
    keys_file: str

    def body(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "JWTValidationPubKeys": list(self.public_keys),
            "BoundAudiences": list(self.bound_audiences),
            "ClaimMappings": dict(self.claim_mappings),
        }
        if self.bound_issuer:
            config["BoundIssuer"] = self.bound_issuer
        return {
            "Name": self.name,
            "Type": self.type,
            "Description": self.description,
            "MaxTokenTTL": f"{self.max_token_ttl:g}s",
            "Config": config,
        }


@dataclass(frozen=True)
class DesiredRole:
    worker: str
    name: str
    description: str
    policies: tuple[str, ...]  # sorted


@dataclass(frozen=True)
class DesiredRule:
    worker: str
    auth_method: str
    description: str
    selector: str
    role: str


@dataclass(frozen=True)
class DesiredIdentity:
    methods: tuple[DesiredAuthMethod, ...] = ()
    roles: tuple[DesiredRole, ...] = ()
    rules: tuple[DesiredRule, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.methods or self.roles or self.rules)

    def to_record(self) -> dict[str, Any]:
        """identity.json: every object, keys shown by fingerprint (the file is named)."""
        return {
            "generated_by": "lockctl",
            "auth_methods": {
                m.name: {
                    "type": m.type,
                    "max_token_ttl": f"{m.max_token_ttl:g}s",
                    "bound_issuer": m.bound_issuer,
                    "bound_audiences": list(m.bound_audiences),
                    "claim_mappings": dict(m.claim_mappings),
                    "jwt_validation_pub_keys_file": m.keys_file,
                    "jwt_validation_pub_keys": [_fingerprint(k) for k in m.public_keys],
                }
                for m in self.methods
            },
            "roles": {
                r.name: {"worker": r.worker, "policies": list(r.policies)} for r in self.roles
            },
            "binding_rules": {
                r.worker: {"auth_method": r.auth_method, "selector": r.selector, "role": r.role}
                for r in self.rules
            },
        }

    def text(self) -> str:
        return json.dumps(self.to_record(), indent=2, sort_keys=True) + "\n"


NO_IDENTITY = DesiredIdentity()


def selector(claims: tuple[tuple[str, str], ...]) -> str:
    """The binding-rule selector matching exactly these claims: `value.a == "x" and ...`.

    Names and values passed the spec's strict patterns (no quote, backslash or space), so
    they are written as they are; sorted, so the same claims always give the same text."""
    return " and ".join(f'value.{name} == "{value}"' for name, value in sorted(claims))


def desired_identity(spec: Spec, policies: Mapping[str, tuple[str, ...]]) -> DesiredIdentity:
    """The identity objects for `spec`; `policies`: each worker's token's policies (sorted)."""
    methods = tuple(_method(spec, method) for method in spec.auth_methods)
    roles: list[DesiredRole] = []
    rules: list[DesiredRule] = []
    for worker in spec.workers:
        if worker.identity is None:
            continue
        source = managed_description(f'worker "{worker.name}"', spec.owner)
        role = role_name(worker.name)
        roles.append(DesiredRole(worker.name, role, source, policies.get(worker.name, ())))
        rules.append(
            DesiredRule(
                worker.name,
                worker.identity.auth_method,
                source,
                selector(worker.identity.claims),
                role,
            )
        )
    return DesiredIdentity(methods, tuple(roles), tuple(rules))


def _method(spec: Spec, method: AuthMethod) -> DesiredAuthMethod:
    return DesiredAuthMethod(
        name=method.name,
        type=method.type,
        description=managed_description(f'auth_method "{method.name}"', spec.owner),
        max_token_ttl=method.max_token_ttl.seconds,
        bound_issuer=method.bound_issuer or "",
        bound_audiences=method.bound_audiences,
        public_keys=read_public_keys(spec.path, method),
        claim_mappings=tuple(sorted((claim, name) for name, claim in method.claim_mappings)),
        keys_file=method.jwt_validation_pub_keys_file,
    )


def read_public_keys(spec_path: str, method: AuthMethod) -> tuple[str, ...]:
    """The PEM blocks of the method's key file (relative paths are the spec's folder's); an
    unreadable file or one without a PEM public key is an input error at the spec's line."""
    where = (
        f'{spec_path}:{method.keys_line}: auth_method "{method.name}".jwt_validation_pub_keys_file'
    )
    path = Path(method.jwt_validation_pub_keys_file)
    if not path.is_absolute():
        path = Path(spec_path).parent / path
    try:
        data = read_regular_file(path, MAX_KEYS_BYTES)
    except UnreadableFile as exc:
        raise InputError(f"{where}: cannot read {path}: {exc}") from None
    if len(data) > MAX_KEYS_BYTES:
        raise InputError(f"{where}: {path} is over {MAX_KEYS_BYTES} bytes")
    text = data.decode("ascii", errors="replace").replace("\r\n", "\n")
    keys = tuple(match.group(0) + "\n" for match in _PEM.finditer(text))
    if not keys:
        raise InputError(f"{where}: {path} holds no PEM public key or certificate")
    return keys


def _fingerprint(pem: str) -> str:
    return "sha256:" + hashlib.sha256(pem.strip().encode("ascii")).hexdigest()[:16]
