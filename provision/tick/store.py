"""The tick core's store: what it asks of Consul, as one object with small methods.

    sessions      create_session, renew_session, destroy_session
    a tick        claim (check-not-exists + lock + record, one transaction), complete;
                  claim_many, complete_many (several jobs' at once, transactions shared)
    the ledger    read_tick, read_ticks, read_tick_names, record_unrun (missed or paused),
                  prune
    operators     read_control (paused, pauses, trigger, the trigger taken)
    the lock      watch_lock (a blocking read: who holds it, the index to wait on next);
                  acquire_lock, release_lock (a plain lock: the lock alone, no record)

Two implementations: ConsulTickStore (consul_store.py, today's code over provision/consul) and
MemoryTickStore (memory.py, a model of Consul's measured semantics on a Clock). tests/contract
runs the same tests on both, so the model cannot drift from Consul.

Errors: a refusal Consul answers is a TickStoreError, the same class from both stores; the Consul
store also raises what the client raises (ConsulUnavailable, ...) when Consul is not reached.

    ConsulError
    +-- PermissionDenied     Consul refused the token (403): not an outage, no retry fixes it
    +-- TickStoreError
        +-- Refused          a refusal no retry fixes, of a store's own (a seam's check)
        +-- SessionGone      renew of a session Consul no longer knows (404)
        +-- InvalidSession   a claim with a session Consul does not know ("invalid session")
        +-- TermsRefused     a session TTL outside 10s..86400s (Consul: 500)
        +-- ValueTooLarge    a transaction over Consul's 512 KB request cap (413)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from provision.consul import ConsulError, PermissionDenied
from provision.ledger.control import ControlNote, Pauses, taken_key
from provision.ledger.operator import is_pending
from provision.ledger.records import (
    TickRecord,
    decode,
    parse_tick_name,
    tick_key,
    ticks_prefix,
)
from provision.ledger.store import PLAIN, Claim, ClaimKeys, ClaimTerms, ClaimTxn, Completion
from provision.sessions import SessionTerms
from provision.system.control_keys import control_prefix

# Consul's bounds (1.8.7, measured: docs/notes and /work/shared CONSUL_FACTS)
MIN_TTL = 10.0  # seconds: a session's TTL
MAX_TTL = 86400.0
MAX_LOCK_DELAY = 60.0  # a longer LockDelay is accepted, and only 60 s of it applies
REQUEST_MAX_BYTES = 512 * 1024  # a transaction's body (values in base64): txn_max_req_len
VALUE_MAX_BYTES = 512 * 1024  # a KV value: kv_max_value_size
MAX_WATCH = 300.0  # seconds a blocking read waits at most (Consul's own cap)

__all__ = [
    "MAX_LOCK_DELAY",
    "MAX_TTL",
    "MAX_WATCH",
    "MIN_TTL",
    "PLAIN",
    "REFUSALS",
    "REQUEST_MAX_BYTES",
    "VALUE_MAX_BYTES",
    "Claim",
    "ClaimTerms",
    "CompleteCall",
    "Completion",
    "ControlState",
    "InvalidSession",
    "JobKeys",
    "Refused",
    "SessionGone",
    "TermsRefused",
    "TickStore",
    "TickStoreError",
    "ValueTooLarge",
    "check_terms",
    "lock_delayed",
    "records_under",
]


class TickStoreError(ConsulError):
    """A refusal Consul answers, raised alike by both stores."""


class Refused(TickStoreError):
    """The store refuses the request for a reason no retry fixes: a seam's own check (the job's
    command cannot start). With Consul's 403 (REFUSALS), the core says `refused`, never that
    Consul is unavailable."""


REFUSALS = (Refused, PermissionDenied)


class SessionGone(TickStoreError):
    """The session is not Consul's any more (destroyed, or invalidated after its TTL): 404."""


class InvalidSession(TickStoreError):
    """A claim named a session Consul does not know: its lock operation fails with
    `invalid session` (a plain acquire would be 500)."""


def refuse_invalid_session(job: JobKeys, claim: Claim) -> Claim:
    """A claim's answer, unless its lock was refused for a session Consul does not know: a
    transaction's lock fails with this text (409) where a plain acquire answers 500, and either
    way the caller's session is gone (InvalidSession)."""
    if claim.lock_refusal is not None and "invalid session" in claim.lock_refusal:
        raise InvalidSession(f"claim of {job.lock_key}: {claim.lock_refusal}")
    return claim


def claim_txn(job: JobKeys, tick: datetime, terms: ClaimTerms = PLAIN) -> ClaimTxn:
    """The claim transaction of `tick` of `job` (ledger/store.py ClaimTxn)."""
    previous = None if terms.previous is None else job.tick(terms.previous)
    return ClaimTxn(ClaimKeys(job.tick(tick), job.lock_key, previous, job.control), terms)


class TermsRefused(TickStoreError):
    """Consul refuses to make a session with these terms (TTL outside MIN_TTL..MAX_TTL)."""


class ValueTooLarge(TickStoreError):
    """A write over Consul's size caps (413): nothing applied."""


@dataclass(frozen=True)
class JobKeys:
    """Where one job's things are in Consul: its lock, its ledger beside it, its taken-trigger
    key, and its operators' control keys (by its name, outside its prefix)."""

    name: str
    lock_key: str
    key: str | None = None  # a keyed job's key whose lock this is (provision/keyed.py)

    @property
    def unit(self) -> str:
        """What a replica runs on its own: the job (`report`), or one key of it
        (`report/tenant-42`; a job's name has no `/`)."""
        return self.name if self.key is None else f"{self.name}/{self.key}"

    @functools.cached_property  # asked at every read, claim and completion
    def ticks(self) -> str:
        return ticks_prefix(self.lock_key)

    @property
    def control(self) -> str:
        return control_prefix(self.name)

    @property
    def taken(self) -> str:
        return taken_key(self.lock_key)

    def tick(self, tick: datetime) -> str:
        return tick_key(self.lock_key, tick)


@dataclass(frozen=True)
class ControlState:
    """A job's control keys as a consistent read saw them: its pause now and the pauses resumed
    (`pauses`), the trigger key's note, and the id in the job's taken-trigger key with its
    ModifyIndex (0: absent), which a manual run's claim checks."""

    pauses: Pauses
    trigger: ControlNote | None = None
    taken: bytes | None = None
    taken_index: int = 0

    @property
    def pending_trigger(self) -> ControlNote | None:
        """The trigger no replica has taken yet (None: none)."""
        if self.trigger is None or not is_pending(self.trigger, self.taken):
            return None
        return self.trigger


def check_terms(terms: SessionTerms) -> None:
    """TermsRefused unless Consul would make a session with these terms. Checked before asking:
    Consul's refusal is a 500, which a client retries as a server fault."""
    if not MIN_TTL <= terms.ttl <= MAX_TTL:
        raise TermsRefused(
            f"session {terms.name!r}: TTL {terms.ttl:g}s is outside Consul's "
            f"{MIN_TTL:g}s..{MAX_TTL:g}s"
        )


def lock_delayed(claim: Claim) -> bool:
    """Whether a lost claim's lock was refused for lock-delay (its last holder's session ended),
    not because another session holds it: only Consul's text tells them apart."""
    return claim.lock_refusal is not None and "lock delay" in claim.lock_refusal


# records.decode's signature: (the tick its key names, the value, its ModifyIndex)
Decoder = Callable[[datetime, bytes | None, int], TickRecord]


def records_under(
    prefix: str, entries: Iterable[tuple[str, bytes | None, int]], decoder: Decoder = decode
) -> list[TickRecord]:
    """The records among (key, value, ModifyIndex) read under a ledger's `prefix`, oldest
    first; keys that name no tick are not records and are left out (as Ledger.records).
    `decoder`: records.decode, or a cache of it (the in-memory store reads the same values
    again and again)."""
    found = []
    for key, value, modify_index in entries:
        tick = parse_tick_name(key[len(prefix) :]) if key.startswith(prefix) else None
        if tick is not None:
            found.append(decoder(tick, value, modify_index))
    return sorted(found, key=lambda record: record.tick)


# A turn's read (TickStore.read_turns): the tick's record and Consul's clock, or why not.
TurnRead = tuple[TickRecord | None, datetime | None] | ConsulError


@dataclass(frozen=True)
class ClaimCall:
    """One claim of TickStore.claim_many: what `claim` is given."""

    job: JobKeys
    record: TickRecord
    session: str
    holder: bytes
    terms: ClaimTerms = PLAIN


# A claim's answer in TickStore.claim_many: the Claim, or what `claim` would have raised.
ClaimAnswer = Claim | ConsulError


@dataclass(frozen=True)
class CompleteCall:
    """One completion of TickStore.complete_many: what `complete` is given."""

    job: JobKeys
    record: TickRecord
    session: str
    release: bool = True


class TickStore(Protocol):
    """Sessions, a tick's claim and completion, the ledger, control keys, the lock's watch."""

    def create_session(self, terms: SessionTerms) -> str:
        """A new session with these terms (TermsRefused outside Consul's bounds); its ID."""
        ...

    def renew_session(self, session_id: str, *, timeout: float | None = None) -> None:
        """Reset the session's TTL, once, within `timeout`; SessionGone when it is gone."""
        ...

    def destroy_session(self, session_id: str) -> None:
        """End the session: its locks are free after its LockDelay (a gone one: no error)."""
        ...

    def claim(
        self,
        job: JobKeys,
        record: TickRecord,
        session_id: str,
        holder: bytes,
        terms: ClaimTerms = PLAIN,
    ) -> Claim:
        """Claim `record.tick` and take the lock, all or nothing: the tick has no record, the
        lock is free (or ours), then the lock holds `holder` and the tick `record`. Won: the
        LockIndex (fencing token) and ModifyIndexes; lost: whether the tick was taken and why
        the lock was refused (lock_delayed). InvalidSession for a session Consul does not know."""
        ...

    def claim_many(self, claims: Sequence[ClaimCall]) -> list[ClaimAnswer]:
        """`claim` of each (of as many jobs: their keys apart), in order, sent together (Consul:
        one transaction while they all apply; refused whole, each claim is sent again on its
        own, for the answer it alone has). In a claim's place, what `claim` would have raised:
        a request Consul did not answer leaves each of its claims unanswered (maybe applied)."""
        ...

    def complete(
        self, job: JobKeys, record: TickRecord, session_id: str, *, release: bool
    ) -> Completion:
        """Write how the run ended (at the claim's ModifyIndex, record.modify_index) and, with
        `release`, unlock, in one transaction; if the lock was no longer ours, the record says
        `lost`. Never raises: (False, None) when nothing was answered."""
        ...

    def complete_many(self, completions: Sequence[CompleteCall]) -> list[Completion]:
        """`complete` of each (of as many jobs: their keys apart), in order, sent together
        (Consul: one transaction of up to 64 operations while they all apply; a completion
        whose operations fail is sent again on its own, for the answer it alone has, and the
        others together). Never raises: (False, None) in the place of each completion of a
        request Consul did not answer."""
        ...

    def read_tick(
        self, job: JobKeys, tick: datetime, *, stale: bool = False
    ) -> tuple[TickRecord | None, datetime | None]:
        """The tick's record (None: unclaimed) and Consul's clock at the answer; `stale`: any
        server answers, and may miss the latest writes."""
        ...

    def read_turns(self, turns: Sequence[tuple[JobKeys, datetime]]) -> list[TurnRead]:
        """For the turns of several jobs at one instant, what `read_tick(job, tick,
        stale=True)` answers for each (job, tick), in order, read together (Consul: read-only
        transactions of at most 64 operations, not one request per tick). In a turn's place,
        the error of the request it was in, or a refusal that concerns it alone."""
        ...

    def read_ticks(self, job: JobKeys, *, stale: bool = False) -> list[TickRecord]:
        """Every record of the job's ledger, oldest first; `stale` as for read_tick."""
        ...

    def read_tick_names(self, job: JobKeys) -> tuple[set[datetime], datetime | None]:
        """The ticks that have a record, from their keys' names alone (no values: what
        housekeeping needs), and Consul's clock at the answer (a consistent read)."""
        ...

    def record_unrun(self, job: JobKeys, records: Sequence[TickRecord]) -> list[TickRecord]:
        """Write records of ticks nobody ran (missed, paused, blackout, buffered) where no record
        exists yet, or, for a record with a ModifyIndex, over the record as read at it (a
        `buffered` tick become `missed`); those written (at most one transaction's worth)."""
        ...

    def prune(self, job: JobKeys, ticks: Iterable[datetime]) -> int:
        """Delete the records of `ticks` (retention; at most MAX_PRUNED_PER_RUN): how many."""
        ...

    def read_control(self, job: JobKeys) -> ControlState:
        """The job's control keys and its taken-trigger key (consistent reads)."""
        ...

    def watch_lock(self, job: JobKeys, index: int, wait: float) -> tuple[str | None, int]:
        """The session holding the job's lock (None: free) once the KV index passes `index`
        (at once if it has, or for index 0) or `wait` seconds pass; and the index to pass next."""
        ...

    def acquire_lock(self, job: JobKeys, session_id: str, holder: bytes) -> Claim:
        """Take the job's lock alone (a plain lock: no tick, no record), `holder` its value, in
        one transaction that reads it back. Won: the LockIndex (the fencing token) and the key's
        ModifyIndex; lost: why the lock was refused (lock_delayed). InvalidSession for a
        session Consul does not know."""
        ...

    def release_lock(self, job: JobKeys, session_id: str) -> bool:
        """Let the job's lock go (no lock-delay after a release): True released, False it was
        not this session's any more (lost). Not answered: ConsulError."""
        ...
