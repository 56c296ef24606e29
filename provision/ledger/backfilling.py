"""`lockctl backfill` against Consul: the job's ledger read for the plan (ledger/backfill.py),
and the backfill note written with the operator's token, at most one pending per job."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timezone

from provision.consul import Consul, KVOp, PermissionDenied
from provision.errors import LockctlError
from provision.ledger.backfill import (
    BACKFILL_MAX_BYTES,
    BackfillLedger,
    BackfillNote,
    decode_backfill,
    may_backfill,
    pending,
)
from provision.ledger.operator import CONTROL_TRIES, operator_name, pause_state
from provision.ledger.store import Ledger
from provision.system.control_keys import backfill_key, paused_key


class BackfillRefused(LockctlError):
    """`lockctl backfill` refused: over catchup_limit without --yes, the job is paused, or a
    backfill of it is pending (exit 1)."""


@dataclass(frozen=True)
class LedgerNow:
    """The job's ledger for a backfill, and Consul's clock at its read (the range's `now`)."""

    ledger: BackfillLedger
    now: datetime


def read_ledger(consul: Consul, lock_key: str) -> LedgerNow:
    """Every record of the job (one read of its ledger) and Consul's clock (one read of its
    names, which carries the Date)."""
    ledger = Ledger(consul, lock_key)
    _, date = ledger.tick_names()
    records = {record.tick: record for record in ledger.records()}
    now = date or datetime.now(timezone.utc)
    return LedgerNow(BackfillLedger(records), now)


def ask_backfill(
    consul: Consul, job: str, ticks: tuple[datetime, ...], reason: str | None, seen: LedgerNow
) -> BackfillNote:
    """Write the job's backfill key: `ticks`, who asks (the token's Description), why, an id; in
    one transaction that checks the job is not paused and that the backfill it replaces (if
    any) was as read and no longer pending (`seen`: the ledger read for the plan)."""
    who = operator_name(consul)
    key = backfill_key(job)
    for _ in range(CONTROL_TRIES):
        paused = pause_state(consul, job).note
        if paused is not None:
            raise BackfillRefused(
                f"job {job} is paused {paused.said()}: not backfilled (lockctl resume {job} first)"
            )
        current, _ = consul.kv.get(key, consistency="consistent", max_bytes=BACKFILL_MAX_BYTES * 2)
        earlier = None if current is None else decode_backfill(current.value)
        if earlier is not None and pending(earlier, seen.ledger.records, seen.now):
            raise BackfillRefused(
                f"job {job} has a backfill pending, asked {earlier.said()}: at most one at a "
                "time (the running `lockctl schedule`s of the job run its ticks)"
            )
        # asked at Consul's clock: the replicas judge its age on theirs, never an operator's
        note = BackfillNote(who, seen.now, ticks, reason, uuid.uuid4().hex[:16])
        replaced = (
            KVOp("check-not-exists", key)
            if current is None
            else KVOp("check-index", key, index=current.modify_index)
        )
        ops = [KVOp("check-not-exists", paused_key(job)), replaced]
        if consul.txn.kv([*ops, KVOp("set", key, note.encode())]).applied:
            return note
    raise BackfillRefused(f"job {job}: its control keys kept changing: not backfilled, try again")


@dataclass(frozen=True)
class PendingBackfill:
    """A backfill some ticks of which no replica has run yet: its note, and how many are left."""

    note: BackfillNote
    left: int

    def said(self) -> str:
        """`2 of 3 ticks left, asked by alice at ...: why (backfill 1f2e...)`."""
        total = len(self.note.ticks)
        return (
            f"{self.left} of {total} ticks left, asked {self.note.said()} (backfill {self.note.id})"
        )


def readable_pending_backfill(consul: Consul, job: str, lock_key: str) -> PendingBackfill | None:
    """The job's backfill while it is pending (`lockctl status`), or None: none, over, or this
    token may not read the job's control keys or ledger. One read of the key; the note's ticks'
    records only when it is young enough to be pending."""
    try:
        entry, meta = consul.kv.get(
            backfill_key(job), consistency="consistent", max_bytes=BACKFILL_MAX_BYTES * 2
        )
        note = None if entry is None else decode_backfill(entry.value)
        now = meta.date or datetime.now(timezone.utc)
        if note is None or not pending(note, {}, now):
            return None
        records = {r.tick: r for r in Ledger(consul, lock_key).fetch(note.ticks).records}
    except PermissionDenied:
        return None
    left = sum(may_backfill(records.get(tick)) for tick in note.ticks)
    return PendingBackfill(note, left) if left else None
