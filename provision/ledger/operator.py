"""The operators' actions on a job: pause, resume, trigger, abort, and what the job's control
keys say now.

An operator's token (CONSUL_HTTP_TOKEN / _FILE, as `apply` uses) writes the keys; the job's
workers may only read them (the rendered lock policy), so a worker cannot pause, resume or
trigger. Who asked is the operator token's Description (GET /v1/acl/token/self), never its
secret: that is what `status` and `history` show.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timezone

from provision.consul import Consul, KVOp, PermissionDenied
from provision.consul.models import KVEntry, ReadMeta
from provision.errors import LockctlError
from provision.ledger.aborts import AbortNote
from provision.ledger.control import (
    BY_LIMIT,
    NO_PAUSES,
    NOTE_MAX_BYTES,
    PAUSES_MAX_BYTES,
    ControlNote,
    Pauses,
    decode_note,
    decode_pauses,
    ended,
    pause_end,
    pause_holds,
    taken_key,
)
from provision.ledger.holder import holder_record
from provision.ledger.records import parse_tick_name
from provision.system.control_keys import abort_key, paused_key, pauses_key, trigger_key
from provision.system.text import printable

EndAsked = tuple[str | None, str | None] | None  # `--for`, `--until` as given
CONTROL_TRIES = 3  # the job's control keys changed between the reads and the write: read again


@dataclass(frozen=True)
class PauseState:
    """Whether `job` is paused, and the note of who paused it (None: not paused)."""

    job: str
    note: ControlNote | None
    date: datetime | None = None  # Consul's clock when it was read (None: not known)

    @property
    def paused(self) -> bool:
        return self.note is not None

    @property
    def ended(self) -> bool:
        """A time-boxed pause whose end Consul's clock has passed: its key stays until `lockctl
        resume`, but the ticks from its end on run."""
        if self.note is None or self.note.ends is None:
            return False
        return not pause_holds(self.note, self.date or datetime.now(timezone.utc))

    def said(self) -> str:
        """`by alice at ... until ...: why`, `(ended)` after it once its end has passed."""
        assert self.note is not None
        return self.note.said() + (" (ended; `lockctl resume` removes it)" if self.ended else "")


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
    entry, meta = _paused_read(consul, job)
    return PauseState(job, None if entry is None else decode_note(entry.value), meta.date)


def _paused_read(consul: Consul, job: str) -> tuple[KVEntry | None, ReadMeta]:
    return consul.kv.get(paused_key(job), consistency="consistent", max_bytes=NOTE_MAX_BYTES * 2)


def _paused_entry(consul: Consul, job: str) -> KVEntry | None:
    return _paused_read(consul, job)[0]


def _pauses_entry(consul: Consul, job: str) -> KVEntry | None:
    return consul.kv.get(pauses_key(job), consistency="consistent", max_bytes=PAUSES_MAX_BYTES * 2)[
        0
    ]


def pause(
    consul: Consul,
    job: str,
    reason: str | None,
    now: datetime | None = None,
    ends: EndAsked = None,
) -> PauseChange:
    """Pause `job`: write its paused key (cas index 0: only if it is not paused already, so
    the first pause's note is kept). Every claim of its ticks fails from then on; with `ends`
    (`--for`, `--until`: the CLI's text), only the claims of ticks before the instant it names,
    reckoned from Consul's clock (the Date of a read of the key), as the claims are."""
    entry, meta = _paused_read(consul, job)
    local = now or datetime.now(timezone.utc)
    end = None if ends is None else pause_end(*ends, meta.date or local)  # refused even if paused
    if entry is not None:
        return PauseChange(PauseState(job, decode_note(entry.value), meta.date), False)
    note = ControlNote(operator_name(consul), local, reason, ends=end)
    if consul.kv.put(paused_key(job), note.encode(), cas=0):
        return PauseChange(PauseState(job, note), True)
    return PauseChange(pause_state(consul, job), False)


def resume(consul: Consul, job: str, now: datetime | None = None) -> PauseChange:
    """Resume `job`: delete its paused key (its next tick is claimed as usual) and keep the
    pause, ended now, in its `pauses` key, in one transaction at the indexes read (two resumes
    at once end it once): a tick it held that nobody recorded yet is still recorded paused."""
    for _ in range(CONTROL_TRIES):
        paused = _paused_entry(consul, job)
        if paused is None:
            return PauseChange(PauseState(job, None), False)
        kept = _pauses_entry(consul, job)
        earlier = decode_pauses(None if kept is None else kept.value)
        value = ended(decode_note(paused.value), now or datetime.now(timezone.utc), earlier)
        ops = [
            KVOp("delete-cas", paused_key(job), index=paused.modify_index),
            KVOp("cas", pauses_key(job), value, index=0 if kept is None else kept.modify_index),
        ]
        if consul.txn.kv(ops).applied:
            return PauseChange(PauseState(job, None), True)
    raise LockctlError(f"job {job}: its control keys kept changing: not resumed, try again")


def read_pauses(consul: Consul, job: str) -> Pauses:
    """The job's pause now and the pauses resumed (two consistent reads: a caller reads them
    only for ticks nobody ran, to record each `paused` or `missed`)."""
    kept = _pauses_entry(consul, job)
    resumed = decode_pauses(None if kept is None else kept.value)
    return Pauses(pause_state(consul, job).note, resumed)


def readable_pauses(consul: Consul, job: str) -> Pauses:
    """`read_pauses`, or none when this token may not read the job's control keys (a policy
    rendered before them): its ticks nobody ran are then missed, and page."""
    try:
        return read_pauses(consul, job)
    except PermissionDenied:
        return NO_PAUSES


def readable_pause_state(consul: Consul, job: str) -> PauseState | None:
    """`pause_state`, or None when this token may not read it (status with a narrow token)."""
    try:
        return pause_state(consul, job)
    except PermissionDenied:
        return None


def readable_pending_trigger(consul: Consul, job: str, lock_key: str) -> ControlNote | None:
    """The trigger of `job` no replica has taken yet (who asked, when, why), or None: none, or
    this token may not read the job's control keys or its taken-trigger key."""
    try:
        entry, _ = consul.kv.get(
            trigger_key(job), consistency="consistent", max_bytes=NOTE_MAX_BYTES * 2
        )
        if entry is None:
            return None
        note = decode_note(entry.value)
        taken, _ = consul.kv.get(taken_key(lock_key), consistency="consistent")
    except PermissionDenied:
        return None
    return note if is_pending(note, None if taken is None else taken.value) else None


def is_pending(note: ControlNote, taken: bytes | None) -> bool:
    """Whether the trigger `note` waits for a replica (pure): the job's taken-trigger key,
    `taken`, does not name it (a note with no id was never lockctl's: pending for good)."""
    return note.id is None or taken != note.id.encode()


class TriggerRefused(LockctlError):
    """`lockctl trigger` refused: the job is paused, or a trigger of it is pending (exit 1)."""


def trigger(
    consul: Consul, job: str, lock_key: str, reason: str | None, now: datetime | None = None
) -> ControlNote:
    """Ask the running schedulers to run `job` once now: write its trigger key (who asks, when,
    why, an id) in one transaction that checks the job is not paused and that the trigger it
    replaces, if any, was taken already (the job's taken-trigger key names it): at most one
    pending trigger per job. The note written; TriggerRefused when it is paused or pending."""
    who = operator_name(consul)
    for _ in range(CONTROL_TRIES):
        # a time-boxed pause that ended still refuses (its key stays until resume): the check
        # below is its key's absence, which a release before `ends` checks too
        paused = pause_state(consul, job).note
        current, _ = consul.kv.get(
            trigger_key(job), consistency="consistent", max_bytes=NOTE_MAX_BYTES * 2
        )
        pending = None if current is None else decode_note(current.value)
        taken = None
        if paused is None and pending is not None:
            entry, _ = consul.kv.get(taken_key(lock_key), consistency="consistent")
            taken = None if entry is None else entry.value
        refusal = trigger_refusal(job, paused, pending, taken)
        if refusal is not None:
            raise TriggerRefused(refusal)
        note = ControlNote(who, now or datetime.now(timezone.utc), reason, uuid.uuid4().hex[:16])
        replaced = (
            KVOp("check-not-exists", trigger_key(job))
            if current is None
            else KVOp("check-index", trigger_key(job), index=current.modify_index)
        )
        ops = [KVOp("check-not-exists", paused_key(job)), replaced]
        if consul.txn.kv([*ops, KVOp("set", trigger_key(job), note.encode())]).applied:
            return note
    raise TriggerRefused(f"job {job}: its control keys kept changing: not triggered, try again")


def trigger_refusal(
    job: str, paused: ControlNote | None, pending: ControlNote | None, taken: bytes | None
) -> str | None:
    """Why a trigger of `job` is refused, or None (pure): the job is paused; or its trigger
    key holds a trigger no replica took (the job's taken-trigger key, `taken`, does not name
    it; a note with no id was never lockctl's, and is pending for good: deleted by hand)."""
    if paused is not None:
        return f"job {job} is paused {paused.said()}: not triggered (lockctl resume {job} first)"
    if pending is not None and is_pending(pending, taken):
        return (
            f"job {job} has a trigger pending, asked {pending.said()}: at most one at a time "
            "(a running `lockctl schedule` of the job takes it within seconds)"
        )
    return None


class NotRunning(LockctlError):
    """`lockctl abort`: no run of the job holds its lock now (exit 1): nothing to stop."""


def abort(
    consul: Consul,
    job: str,
    lock_key: str,
    reason: str | None,
    now: datetime | None = None,
    key: str | None = None,
) -> AbortNote:
    """Ask the replica running `job` to stop its run now: the run is the one holding the job's
    lock (its tick from the holder's record, its session from Consul), named in the job's
    `abort` key with who asks, when, why and an id, written in one transaction that checks the
    lock is still held by that session (a run that ended meanwhile is not running: refused).
    The note written; NotRunning when nothing runs, or the holder is not a scheduled run. With
    `key`, `lock_key` is that key's lock, and the note names the key too."""
    entry, _ = consul.kv.get(lock_key, consistency="consistent", max_bytes=NOTE_MAX_BYTES * 2)
    if entry is None or entry.session is None:
        raise NotRunning(f"job {job} is not running: nothing aborted")
    tick_text = holder_record(entry.value).get("tick")
    tick = None if tick_text is None else parse_tick_name(tick_text)
    if tick is None:
        raise NotRunning(
            f"job {job} is held by a run without a tick (a `lockctl run` of a job without a "
            "schedule, or not lockctl's): nothing aborted (`lockctl break` ends its session)"
        )
    note = ControlNote(
        operator_name(consul), now or datetime.now(timezone.utc), reason, uuid.uuid4().hex[:16]
    )
    written = AbortNote(note, tick, entry.session, key)
    ops = [
        KVOp("check-session", lock_key, session=entry.session),
        # the same run still: a later tick claimed under the same (pooled) session meanwhile
        # moved the key's ModifyIndex, and this note, naming the tick read, would stop nothing
        KVOp("check-index", lock_key, index=entry.modify_index),
        KVOp("set", abort_key(job), written.encode()),
    ]
    if not consul.txn.kv(ops).applied:
        raise NotRunning(f"job {job} is not running (its run just ended): nothing aborted")
    return written
