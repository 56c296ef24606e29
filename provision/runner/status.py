"""`lockctl status`: who holds each job's lock, from consistent reads (never ?stale)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from provision.consul import Consul, ConsulError
from provision.runner.lock import holder_record
from provision.spec import Spec


@dataclass(frozen=True)
class LockState:
    job: str
    key: str
    held: bool
    session: str | None = None
    node: str | None = None  # the Consul node the holding session lives on
    worker: str | None = None  # as the holder wrote it into the key
    acquired_at: str | None = None  # UTC, as the holder wrote it
    lock_index: int | None = None
    modify_index: int | None = None

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
    holder = holder_record(entry.value)
    node = None
    try:
        session = consul.session.info(entry.session, consistency="consistent")
        node = session.node if session else None
    except ConsulError:
        pass  # a token with key read but no session read still sees the key
    return LockState(
        job,
        key,
        True,
        session=entry.session,
        node=node,
        worker=holder.get("worker"),
        acquired_at=holder.get("acquired_at"),
        lock_index=entry.lock_index,
        modify_index=entry.modify_index,
    )
