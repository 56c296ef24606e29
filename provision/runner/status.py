"""`lockctl status`: who holds each job's lock, from consistent reads (never ?stale).

What Consul vouches for (the key's session and that session's node) is kept apart from what the
holder claims (the record it wrote into the key's value, which anyone with write on the key can
write). Every string here that came from Consul is already printable and bounded
(provision/system/text.py); the CLI still prints them as plain text, never as markup.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from provision.consul import Consul, ConsulError
from provision.runner.lock import CLAIM_LIMIT, claimed_worker, holder_record
from provision.spec import Spec
from provision.system.text import printable


@dataclass(frozen=True)
class LockState:
    job: str
    key: str
    held: bool
    session: str | None = None  # Consul's word: the session on the key
    node: str | None = None  # Consul's word: the node the holding session lives on
    claims: dict[str, str] = field(default_factory=dict)  # the holder's record, as written
    claim_matches_node: bool | None = None  # None: no claimed worker, or the node is unknown
    lock_index: int | None = None
    modify_index: int | None = None

    @property
    def forged(self) -> bool:
        """The record names another worker than the node Consul says the session is on."""
        return self.claim_matches_node is False

    def to_record(self) -> dict[str, Any]:
        """One lock's entry in `lockctl status --json`: every field, under its own name."""
        return asdict(self)


def lock_states(consul: Consul, spec: Spec) -> list[LockState]:
    """One consistent read per job's lock key, plus the holding session's node."""
    return [_state(consul, job.name, job.lock_key) for job in spec.jobs]


def _state(consul: Consul, job: str, key: str) -> LockState:
    entry, _ = consul.kv.get(key, consistency="consistent")
    if entry is None or entry.session is None:
        lock_index = entry.lock_index if entry else None
        return LockState(job, key, False, lock_index=lock_index)
    node = _node_of(consul, entry.session)
    claims = holder_record(entry.value)
    return LockState(
        job,
        key,
        True,
        session=printable(entry.session, CLAIM_LIMIT),
        node=None if node is None else printable(node, CLAIM_LIMIT),
        claims=claims,
        claim_matches_node=_matches(claimed_worker(entry), node),
        lock_index=entry.lock_index,
        modify_index=entry.modify_index,
    )


def _node_of(consul: Consul, session_id: str) -> str | None:
    try:
        session = consul.session.info(session_id, consistency="consistent")
    except ConsulError:
        return None  # a token with key read but no session read still sees the key
    return session.node if session else None


def _matches(claimed: str | None, node: str | None) -> bool | None:
    """Compared raw, before escaping: escaped text could look like a plain name."""
    if claimed is None or node is None:
        return None
    return claimed == node
