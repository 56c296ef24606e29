"""Typed views of the Consul objects lockctl reads and writes (frozen, so safe to share)."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from provision.system.secrets import Secret


@dataclass(frozen=True)
class Policy:
    """An ACL policy. `rules` is None in list answers, which omit it."""

    id: str
    name: str
    description: str
    rules: str | None
    modify_index: int
    hash: str = ""  # Consul's hash of name, description and rules (in list answers too)

    @classmethod
    def from_api(cls, raw: dict[str, Any]) -> Policy:
        return cls(
            id=raw["ID"],
            name=raw["Name"],
            description=raw.get("Description", ""),
            rules=raw.get("Rules"),
            modify_index=raw.get("ModifyIndex", 0),
            hash=str(raw.get("Hash") or ""),
        )


@dataclass(frozen=True)
class Token:
    """An ACL token. `secret` is None where Consul did not return it (list answers)."""

    accessor_id: str
    description: str
    policy_names: tuple[str, ...]
    local: bool
    secret: Secret | None = field(default=None, repr=False)
    create_index: int = 0

    @classmethod
    def from_api(cls, raw: dict[str, Any]) -> Token:
        secret_id = raw.get("SecretID")
        return cls(
            accessor_id=raw["AccessorID"],
            description=raw.get("Description", ""),
            policy_names=tuple(sorted(p["Name"] for p in raw.get("Policies") or ())),
            local=bool(raw.get("Local", False)),
            secret=Secret(secret_id) if secret_id else None,
            create_index=int(raw.get("CreateIndex") or 0),
        )


@dataclass(frozen=True)
class Session:
    """A Consul session: what a lock is held by."""

    id: str
    name: str
    node: str
    ttl: str
    lock_delay_ns: int
    behavior: str
    checks: tuple[str, ...]
    create_index: int = 0  # the Raft index it was made at: Consul 1.8.7 keeps no creation time

    @classmethod
    def from_api(cls, raw: dict[str, Any]) -> Session:
        return cls(
            id=raw["ID"],
            name=raw.get("Name", ""),
            node=raw.get("Node", ""),
            ttl=raw.get("TTL", ""),
            lock_delay_ns=int(raw.get("LockDelay", 0)),
            behavior=raw.get("Behavior", ""),
            checks=_session_checks(raw),
            create_index=int(raw.get("CreateIndex") or 0),
        )


def _session_checks(raw: dict[str, Any]) -> tuple[str, ...]:
    """Consul 1.7+ answers with NodeChecks and ServiceChecks; older versions with Checks."""
    if raw.get("Checks"):
        return tuple(raw["Checks"])
    service = [check["ID"] for check in raw.get("ServiceChecks") or ()]
    return tuple([*(raw.get("NodeChecks") or ()), *service])


@dataclass(frozen=True)
class NodeCheck:
    """One health check of a node: `check_id` (`serfHealth`: the agent's gossip liveness) and its
    `status` (passing, warning, critical), as Consul's catalog has them."""

    check_id: str
    status: str
    output: str = ""  # Consul's (or the check's) words: untrusted text, printable() before shown

    @classmethod
    def from_api(cls, raw: dict[str, Any]) -> NodeCheck:
        return cls(
            check_id=str(raw.get("CheckID", "")),
            status=str(raw.get("Status", "")),
            output=str(raw.get("Output") or ""),
        )


@dataclass(frozen=True)
class KVEntry:
    """One key. `lock_index` is the fencing token; `session` the holder, if any."""

    key: str
    value: bytes | None
    flags: int
    session: str | None
    lock_index: int
    create_index: int
    modify_index: int

    @classmethod
    def from_api(cls, raw: dict[str, Any]) -> KVEntry:
        encoded = raw.get("Value")
        return cls(
            key=raw["Key"],
            value=base64.b64decode(encoded) if encoded is not None else None,
            flags=int(raw.get("Flags", 0)),
            session=raw.get("Session") or None,
            lock_index=int(raw.get("LockIndex", 0)),
            create_index=int(raw.get("CreateIndex", 0)),
            modify_index=int(raw.get("ModifyIndex", 0)),
        )


@dataclass(frozen=True)
class ReadMeta:
    """Consistency headers of a read: what index it saw and how fresh the answering server was."""

    index: int | None
    known_leader: bool | None
    last_contact_ms: int | None
    date: datetime | None = None  # the answering agent's clock (HTTP Date), whole seconds


@dataclass(frozen=True)
class AclReplication:
    """A server's ACL replication from the primary datacenter, as it reports it. `kind` is
    Consul's ReplicationType: "legacy" for the first moments, then "tokens" (policies and
    global tokens copied)."""

    enabled: bool
    running: bool
    source_datacenter: str
    kind: str
    replicated_token_index: int
    last_error: str

    @classmethod
    def from_api(cls, raw: dict[str, Any]) -> AclReplication:
        return cls(
            enabled=bool(raw.get("Enabled", False)),
            running=bool(raw.get("Running", False)),
            source_datacenter=str(raw.get("SourceDatacenter") or ""),
            kind=str(raw.get("ReplicationType") or ""),
            replicated_token_index=int(raw.get("ReplicatedTokenIndex") or 0),
            last_error=str(raw.get("LastError") or ""),
        )
