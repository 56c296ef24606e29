"""The operators' actions on a job: pause, resume, and what the job's control keys say now.

An operator's token (CONSUL_HTTP_TOKEN / _FILE, as `apply` uses) writes the keys; the job's
workers may only read them (the rendered lock policy), so a worker cannot pause, resume or
trigger. Who asked is the operator token's Description (GET /v1/acl/token/self), never its
secret: that is what `status` and `history` show.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from provision.consul import Consul, PermissionDenied
from provision.ledger.control import BY_LIMIT, NOTE_MAX_BYTES, ControlNote, decode_note
from provision.system.control_keys import paused_key
from provision.system.text import printable


@dataclass(frozen=True)
class PauseState:
    """Whether `job` is paused, and the note of who paused it (None: not paused)."""

    job: str
    note: ControlNote | None

    @property
    def paused(self) -> bool:
        return self.note is not None


@dataclass(frozen=True)
class PauseChange:
    """What `pause` or `resume` did: `changed` False when the job already was as asked."""

    state: PauseState
    changed: bool


def operator_name(consul: Consul) -> str:
    """Who the token in use is, in words: its Description, else its accessor ID (never the
    secret). GET /v1/acl/token/self"""
    token = consul.acl.read_self_token()
    said = token.description.strip() or f"token {token.accessor_id}"
    return printable(said, BY_LIMIT)


def pause_state(consul: Consul, job: str) -> PauseState:
    """The job's paused key, as a consistent read sees it."""
    entry, _ = consul.kv.get(
        paused_key(job), consistency="consistent", max_bytes=NOTE_MAX_BYTES * 2
    )
    return PauseState(job, None if entry is None else decode_note(entry.value))


def pause(consul: Consul, job: str, reason: str | None, now: datetime | None = None) -> PauseChange:
    """Pause `job`: write its paused key (cas index 0: only if it is not paused already, so
    the first pause's note is kept). Every claim of its ticks fails from then on."""
    note = ControlNote(operator_name(consul), now or datetime.now(timezone.utc), reason)
    if consul.kv.put(paused_key(job), note.encode(), cas=0):
        return PauseChange(PauseState(job, note), True)
    return PauseChange(pause_state(consul, job), False)


def resume(consul: Consul, job: str) -> PauseChange:
    """Resume `job`: delete its paused key (its next tick is claimed as usual)."""
    before = pause_state(consul, job)
    if not before.paused:
        return PauseChange(before, False)
    consul.kv.delete(paused_key(job))
    return PauseChange(PauseState(job, None), True)


def readable_pause_state(consul: Consul, job: str) -> PauseState | None:
    """`pause_state`, or None when this token may not read it (status with a narrow token)."""
    try:
        return pause_state(consul, job)
    except PermissionDenied:
        return None
