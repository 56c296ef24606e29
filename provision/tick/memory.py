"""A TickStore in memory: a model of Consul's measured semantics (1.8.7), on a Clock, so a test
or a simulation runs the tick core against "Consul" in virtual time, deterministically.

What it follows (each shown on real Consul too by tests/contract; docs/tick-core.md lists them):
- sessions: a TTL within 10s..86400s; invalidated lazily, at `invalidate_after` x TTL after the
  last renew (Consul: anywhere in TTL..2xTTL; measured 2xTTL, the default); renew of a gone
  session is SessionGone (404); destroying one that is gone is no error.
- Raft indexes (measured on the leader): a session's create, destroy and invalidation, and every
  write (a KV PUT, a transaction, refused or not) cost one; reads, renewals, the destroy of a
  gone session (ACLs on: answered before Raft) and a lock refused for lock-delay cost none.
- LockDelay (at most 60 s of it) on every key a session held when it was invalidated or
  destroyed; none after a release. A lock refused for lock-delay is refused before Raft: the
  transaction costs no index and names only its lock operation.
- a transaction applies all of its operations or none; every operation is judged and every
  failure named; a refused one still costs one Raft index (refused after the commit).
- LockIndex +1 on each acquire by a new holder (the holder's re-acquire keeps it); a plain write
  (PUT, set, cas) keeps a held key's session and sets its LockIndex to 0; every write
  takes the transaction's Raft index as ModifyIndex, except one that changes nothing; a lock
  with a session Consul does not know fails with `invalid session`.
- a release (unlock, ?release=) clears the session and sets the value to null.
- request bodies over 512 KB (values in base64) and KV values over 512 KB are refused (413).
- a read of a key answers its ModifyIndex (the KV's index while it is absent); a blocking read
  returns at once when that passed the one given, else when the key changes (while it is
  absent: when any key is written) or `wait` runs out; it waits on the Clock, so in virtual
  time it is time passing.
- every answer's date (a claim's, a read's) is Consul's clock as its HTTP Date header says it:
  whole seconds, the fraction dropped.
- stale reads see the KV as it was `stale_lag` seconds ago (a lag real Consul cannot be made
  to show on demand: tested on the model only).

Not modelled: ACLs, node health checks (serfHealth), Behavior `delete`, leader elections and
unavailability, answer byte caps of readers, Consul's wait jitter.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
import threading
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from provision.consul import ConsulError, KVOp, TxnAnswer, TxnError
from provision.consul.batch import MAX_OPERATIONS
from provision.consul.keys import checked_key
from provision.consul.models import KVEntry
from provision.ledger.control import Pauses, decode_note, decode_pauses
from provision.ledger.records import TickRecord, decode, parse_tick_name
from provision.ledger.store import CHUNK, MAX_PRUNED_PER_RUN, Claim, Completion
from provision.outcomes import Outcome
from provision.sessions import SessionTerms
from provision.system.control_keys import paused_key, pauses_key, trigger_key
from provision.tick.clock import Clock
from provision.tick.store import (
    MAX_LOCK_DELAY,
    MAX_WATCH,
    PLAIN,
    REQUEST_MAX_BYTES,
    VALUE_MAX_BYTES,
    ClaimAnswer,
    ClaimCall,
    ClaimTerms,
    CompleteCall,
    ControlState,
    JobKeys,
    SessionGone,
    TickStoreError,
    TurnRead,
    ValueTooLarge,
    check_terms,
    claim_txn,
    records_under,
    refuse_invalid_session,
)

FIRST_INDEX = 1  # Consul's indexes are never 0: a blocking read at index 0 returns at once


@dataclass
class _Session:
    id: str
    ttl: float
    lock_delay: float  # what applies: at most MAX_LOCK_DELAY
    born: int  # creation order: two invalidations due at once happen in it
    ends_at: float  # monotonic: when Consul invalidates it unless renewed


class _Refused(Exception):
    """One operation of a transaction fails (Consul's text)."""


class _Work:
    """A transaction's view of the KV: the store's entries under its own changes."""

    def __init__(self, store: MemoryTickStore, index: int) -> None:
        self.store, self.index = store, index
        self.changes: dict[str, KVEntry | None] = {}

    def get(self, key: str) -> KVEntry | None:
        return self.changes[key] if key in self.changes else self.store._kv.get(key)

    def tree(self, prefix: str) -> list[KVEntry]:
        keys = set(self.store._keys_under(prefix)) | {
            k for k in self.changes if k.startswith(prefix)
        }
        found = (self.get(key) for key in sorted(keys))
        return [entry for entry in found if entry is not None]

    def write(self, key: str, value: bytes | None, session: str | None, lock_index: int) -> KVEntry:
        """The key after this write; one that changes nothing keeps its ModifyIndex (Consul
        skips it)."""
        old = self.get(key)
        if old is not None and (old.value, old.session, old.lock_index) == (
            value,
            session,
            lock_index,
        ):
            return old
        created = self.index if old is None else old.create_index
        new = KVEntry(key, value, 0, session, lock_index, created, self.index)
        self.changes[key] = new
        return new

    def delete(self, key: str) -> None:
        if self.get(key) is not None:  # deleting what is absent changes nothing
            self.changes[key] = None


class MemoryTickStore:
    """Consul, as far as the tick core sees it, in memory and on `clock`.

    `invalidate_after`: a session not renewed is invalidated this many TTLs after its last
    renew (1.0..2.0: Consul's lazy expiry; 2.0 as measured). `stale_lag`: seconds a stale read
    lags behind (0: stale reads see the latest writes). `seed`: session IDs are drawn from it,
    so two runs with one seed name their sessions alike. Safe across threads; a watch_lock
    waits on the clock outside the store's lock.

    Beside the TickStore methods, what a test or simulation needs: `put` and `delete` (an
    operator's writes: pause, trigger) and `raft_index` (what Consul's Raft log would be at).
    """

    def __init__(
        self,
        clock: Clock,
        *,
        invalidate_after: float = 2.0,
        stale_lag: float = 0.0,
        seed: int = 0,
    ) -> None:
        if not 1.0 <= invalidate_after <= 2.0:
            raise ValueError("Consul invalidates a session between 1 and 2 TTLs after its renew")
        if stale_lag < 0:
            raise ValueError("a stale read lags behind, never ahead")
        self._clock = clock
        self._invalidate_after = invalidate_after
        self._stale_lag = stale_lag
        self._seed = seed
        self._made = 0  # sessions made: the next ID's number
        self._index = FIRST_INDEX  # Raft's
        self._kv_index = FIRST_INDEX  # the KV table's (tombstones included): what reads return
        self._kv: dict[str, KVEntry] = {}
        self._keys: list[str] = []  # self._kv's keys, sorted: prefix reads
        self._sessions: dict[str, _Session] = {}
        # no session runs out before this: a renewal only moves an end later and a destroy
        # takes one away, so it stays a safe lower bound until _expire looks again
        self._first_end = math.inf
        self._delays: dict[str, float] = {}  # key -> monotonic end of its lock-delay
        self._history: dict[str, list[tuple[float, KVEntry | None]]] = {}  # for stale reads
        self._watchers: dict[str, list[threading.Event]] = {}
        self._guard = threading.RLock()

    # -- what a test or a simulation reads and does besides ----------------------------------------
    @property
    def raft_index(self) -> int:
        """Consul's Raft index: one per write, refused transactions included."""
        return self._index

    def put(self, key: str, value: bytes) -> int:
        """Write a key as an operator's token would (PUT /v1/kv/:key); its ModifyIndex."""
        if len(value) > VALUE_MAX_BYTES:
            raise ValueTooLarge(f"{key}: {len(value)} bytes, over Consul's {VALUE_MAX_BYTES}")
        checked_key(key)
        with self._guard:
            work = self._begin()
            old = work.get(key)
            # a held key keeps its session; its LockIndex becomes the request's: 0 (measured)
            written = work.write(key, value, None if old is None else old.session, 0)
            self._commit(work)
            return written.modify_index

    def delete(self, key: str) -> None:
        """Delete a key as an operator's token would (DELETE /v1/kv/:key)."""
        checked_key(key)
        with self._guard:
            work = self._begin()
            work.delete(key)
            self._commit(work)

    # -- sessions ------------------------------------------------------------------------------
    def create_session(self, terms: SessionTerms) -> str:
        check_terms(terms)
        if terms.behavior != "release":
            raise ValueError(f"session behavior {terms.behavior!r}: only `release` is modelled")
        with self._guard:
            self._expire()
            self._made += 1
            self._index += 1
            session_id = str(uuid.UUID(int=(self._seed % 2**64) << 64 | self._made))
            delay = min(max(terms.lock_delay, 0.0), MAX_LOCK_DELAY)
            ends_at = self._clock.monotonic() + terms.ttl * self._invalidate_after
            self._sessions[session_id] = _Session(session_id, terms.ttl, delay, self._made, ends_at)
            self._first_end = min(self._first_end, ends_at)
            return session_id

    def renew_session(self, session_id: str, *, timeout: float | None = None) -> None:
        # `timeout` is the client's: the model answers at once
        with self._guard:
            self._expire()
            session = self._sessions.get(session_id)
            if session is None:
                raise SessionGone(f"session {session_id}: gone (renew: 404)")
            session.ends_at = self._clock.monotonic() + session.ttl * self._invalidate_after

    def destroy_session(self, session_id: str) -> None:
        with self._guard:
            self._expire()
            session = self._sessions.get(session_id)
            if session is not None:  # a gone one: Consul (ACLs on) answers before Raft
                self._end(session, self._clock.monotonic())

    # -- a tick --------------------------------------------------------------------------------
    def claim(
        self,
        job: JobKeys,
        record: TickRecord,
        session_id: str,
        holder: bytes,
        terms: ClaimTerms = PLAIN,
    ) -> Claim:
        txn = claim_txn(job, record.tick, terms)  # Ledger.claim's transaction, as Consul runs it
        return refuse_invalid_session(job, txn.read(self._txn(txn.ops(record, holder, session_id))))

    def claim_many(self, claims: Sequence[ClaimCall]) -> list[ClaimAnswer]:
        # on Consul, one transaction while all apply, else each again alone: each one's answer
        return [_claimed(self, call) for call in claims]

    def complete(
        self, job: JobKeys, record: TickRecord, session_id: str, *, release: bool
    ) -> Completion:
        # Ledger.complete's steps (ledger/store.py)
        cas = KVOp("cas", job.tick(record.tick), record.encode(), index=record.modify_index)
        unlock = [KVOp("unlock", job.lock_key, session=session_id)] if release else []
        try:
            answer = self._txn([cas, *unlock])
            if answer.applied:
                return Completion(True, release)
            if answer.failed(0) is not None:  # the record was changed under us: unlock alone
                return Completion(
                    False, self._release(job.lock_key, session_id) if release else False
                )
            lost = replace(record, outcome=Outcome.LOST)  # the unlock failed: not ours
            again = self._txn([replace(cas, value=lost.encode())])
            return Completion(again.applied, False)
        except TickStoreError:
            return Completion(False, None)

    def complete_many(self, completions: Sequence[CompleteCall]) -> list[Completion]:
        # on Consul, one transaction while all apply, else each again alone: each one's answer
        return [self.complete(c.job, c.record, c.session, release=c.release) for c in completions]

    def acquire_lock(self, job: JobKeys, session_id: str, holder: bytes) -> Claim:
        # ConsulTickStore's transaction: the lock, and its read back
        lock = KVOp("lock", job.lock_key, holder, session=session_id)
        answer = self._txn([lock, KVOp("get", job.lock_key)])
        entry = answer.entry(job.lock_key) if answer.applied else None
        if entry is None:
            refusal = answer.failed(0)
            what = "refused" if refusal is None else refusal.what
            return refuse_invalid_session(job, Claim(False, lock_refusal=what, date=answer.date))
        return Claim(True, entry.lock_index, entry.modify_index, date=answer.date)

    def release_lock(self, job: JobKeys, session_id: str) -> bool:
        checked_key(job.lock_key)
        return self._release(job.lock_key, session_id)

    def _release(self, key: str, session_id: str) -> bool:
        """PUT /v1/kv/:key?release= with an empty body: the value becomes null."""
        with self._guard:
            work = self._begin()
            entry = work.get(key)
            held = entry is not None and entry.session == session_id
            if entry is not None and held:
                work.write(key, None, None, entry.lock_index)
            self._commit(work)
            return held

    # -- the ledger ----------------------------------------------------------------------------
    def read_tick(
        self, job: JobKeys, tick: datetime, *, stale: bool = False
    ) -> tuple[TickRecord | None, datetime | None]:
        with self._guard:
            self._expire()
            entry = self._read(job.tick(tick), stale)
            date = self._date()
        if entry is None:
            return None, date
        return _decoded(tick, entry.value, entry.modify_index), date

    def read_turns(self, turns: Sequence[tuple[JobKeys, datetime]]) -> list[TurnRead]:
        # one request on Consul; here each read as read_tick answers it (the same instant)
        return [self.read_tick(job, tick, stale=True) for job, tick in turns]

    def read_ticks(self, job: JobKeys, *, stale: bool = False) -> list[TickRecord]:
        with self._guard:
            self._expire()
            if stale and self._stale_lag:
                keys = sorted(k for k in self._history if k.startswith(job.ticks))
            else:
                keys = self._keys_under(job.ticks)
            found = [(key, self._read(key, stale)) for key in keys]
        entries = ((key, e.value, e.modify_index) for key, e in found if e is not None)
        return records_under(job.ticks, entries, _decoded)

    def read_tick_names(self, job: JobKeys) -> tuple[set[datetime], datetime | None]:
        # Ledger.tick_names: GET ?keys&separator=/, a folder under the prefix is one name
        with self._guard:
            self._expire()
            names = {key[len(job.ticks) :].split("/")[0] for key in self._keys_under(job.ticks)}
            date = self._date()
        return {tick for tick in map(parse_tick_name, names) if tick is not None}, date

    def record_unrun(self, job: JobKeys, records: Sequence[TickRecord]) -> list[TickRecord]:
        # Ledger.record_unrun's loop: cas at each record's index (0: none), the refused ones
        # dropped and tried again
        pending = list(records)[:CHUNK]
        while pending:
            ops = [KVOp("cas", job.tick(r.tick), r.encode(), index=r.modify_index) for r in pending]
            answer = self._txn(ops)
            if answer.applied:
                return pending
            taken = {error.op_index for error in answer.errors}
            if not taken:
                break
            pending = [r for index, r in enumerate(pending) if index not in taken]
        return []

    def prune(self, job: JobKeys, ticks: Iterable[datetime]) -> int:
        keys = [job.tick(tick) for tick in ticks][:MAX_PRUNED_PER_RUN]
        for start in range(0, len(keys), CHUNK):
            self._txn([KVOp("delete", key) for key in keys[start : start + CHUNK]])
        return len(keys)

    # -- operators and the lock ----------------------------------------------------------------
    def read_control(self, job: JobKeys) -> ControlState:
        with self._guard:
            self._expire()
            paused, kept = self._kv.get(paused_key(job.name)), self._kv.get(pauses_key(job.name))
            trigger, taken = self._kv.get(trigger_key(job.name)), self._kv.get(job.taken)
        pauses = Pauses(
            None if paused is None else decode_note(paused.value),
            decode_pauses(None if kept is None else kept.value),
        )
        return ControlState(
            pauses,
            None if trigger is None else decode_note(trigger.value),
            None if taken is None else taken.value or b"",
            0 if taken is None else taken.modify_index,
        )

    def watch_lock(self, job: JobKeys, index: int, wait: float) -> tuple[str | None, int]:
        key = job.lock_key
        woken = threading.Event()  # set by a write of the key (_store), an invalidation's too
        with self._guard:
            self._expire()
            if self._key_index(key) > index:
                return self._holder(key), self._key_index(key)
            deadline = self._clock.monotonic() + min(max(wait, 0.0), MAX_WATCH)
            self._watchers.setdefault(key, []).append(woken)
        try:
            while True:
                with self._guard:
                    self._expire()
                    if woken.is_set() or self._clock.monotonic() >= deadline:
                        return self._holder(key), self._key_index(key)
                    # wake for the next invalidation too: nothing else would notice it is due
                    ends = (session.ends_at for session in self._sessions.values())
                    wake = min(deadline, min(ends, default=deadline))
                self._clock.sleep_until(wake, woken)
        finally:
            with self._guard:
                self._watchers[key].remove(woken)
                if not self._watchers[key]:
                    del self._watchers[key]

    def _date(self) -> datetime:
        """Consul's clock as an answer's Date header says it (RFC 7231): whole seconds, the
        fraction dropped; the tick core judges a window by it."""
        return self._clock.wall().replace(microsecond=0)

    def _key_index(self, key: str) -> int:
        """What a read of `key` answers as X-Consul-Index: the key's ModifyIndex while it exists
        (a write of another key moves nothing a watch of it waits on), else the KV's index."""
        entry = self._kv.get(key)
        return self._kv_index if entry is None else entry.modify_index

    def _holder(self, key: str) -> str | None:
        entry = self._kv.get(key)
        return None if entry is None else entry.session

    # -- the model: transactions ---------------------------------------------------------------
    def _txn(self, ops: Sequence[KVOp]) -> TxnAnswer:
        """PUT /v1/txn as Consul applies it: the body's size (413), then lock-delay (refused
        before Raft), then every operation in order on one Raft index, all or none."""
        if not 0 < len(ops) <= MAX_OPERATIONS:
            raise ValueError(f"a transaction has 1..{MAX_OPERATIONS} operations")
        for op in ops:
            checked_key(op.key)
        if _size_bound(ops) > REQUEST_MAX_BYTES:  # else it cannot be over: not worth encoding
            _refuse_oversized(ops)
        with self._guard:
            self._expire()
            now, date = self._clock.monotonic(), self._date()
            delayed = tuple(
                TxnError(number, f'failed to lock key "{op.key}" due to lock delay')
                for number, op in enumerate(ops)
                if op.verb == "lock" and self._delays.get(op.key, now) > now
            )
            if delayed:
                return TxnAnswer(False, (), delayed, date)
            work = self._begin()
            results: list[KVEntry] = []
            errors: list[TxnError] = []
            for number, op in enumerate(ops):
                try:
                    results.extend(self._apply(work, op))
                except _Refused as refused:
                    errors.append(TxnError(number, str(refused)))
            if errors:
                return TxnAnswer(False, (), tuple(errors), date)
            self._commit(work)
            return TxnAnswer(True, tuple(results), (), date)

    def _apply(self, work: _Work, op: KVOp) -> list[KVEntry]:
        """One operation on the transaction's view: its results (a write's without its value,
        as Consul answers), or _Refused with Consul's text."""
        entry, key = work.get(op.key), op.key
        if op.verb == "get":
            if entry is None:
                raise _Refused(f'key "{key}" doesn\'t exist')
            return [entry]
        if op.verb == "get-tree":
            return work.tree(key)
        if op.verb == "check-not-exists":
            if entry is not None:
                raise _Refused(f'key "{key}" exists')
            return []
        if op.verb == "check-index":
            if entry is None:
                raise _Refused(f'key "{key}" doesn\'t exist')
            if entry.modify_index != op.index:
                raise _Refused(f"current modify index {entry.modify_index} != {op.index}")
            return []
        if op.verb == "delete":
            work.delete(key)
            return []
        new = self._write_op(work, op, entry)  # answered without its value, as Consul does
        indexes = (new.lock_index, new.create_index, new.modify_index)
        return [KVEntry(key, None, new.flags, new.session, *indexes)]

    def _write_op(self, work: _Work, op: KVOp, entry: KVEntry | None) -> KVEntry:
        key, session = op.key, None if entry is None else entry.session
        lock_index = 0 if entry is None else entry.lock_index
        # a plain write keeps the key's session and writes the operation's LockIndex, which
        # lockctl never sends: 0 (Consul's one write of a KV entry, as a PUT measured it)
        if op.verb == "set":
            return work.write(key, op.value, session, 0)
        if op.verb == "cas":
            wanted = op.index or 0  # index 0: only where the key does not exist
            current = 0 if entry is None else entry.modify_index
            if wanted != current:
                raise _Refused(f'failed to set key "{key}", index is stale')
            return work.write(key, op.value, session, 0)
        if op.verb == "lock":
            if op.session not in self._sessions:
                raise _Refused(f'invalid session "{op.session}"')
            if session is not None and session != op.session:
                raise _Refused(f'failed to lock key "{key}", lock is already held')
            # a new holder takes the next LockIndex; the holder's re-acquire keeps it
            taken = lock_index if session == op.session else lock_index + 1
            return work.write(key, op.value, op.session, taken)
        if op.verb == "unlock":
            if entry is None or session != op.session:
                raise _Refused(
                    f'failed to unlock key "{key}", lock isn\'t held, or is held by another session'
                )
            return work.write(key, op.value, None, lock_index)
        raise ValueError(f"KV verb {op.verb!r} is not modelled")

    def _begin(self) -> _Work:
        """A write through Raft: one more index, whether or not it changes anything."""
        self._expire()
        self._index += 1
        return _Work(self, self._index)

    def _commit(self, work: _Work) -> None:
        at = self._clock.monotonic()
        for key, entry in work.changes.items():
            self._store(key, entry, work.index, at)

    # -- the model: sessions' ends, the KV and its history ----------------------------------------
    def _expire(self) -> None:
        """Invalidate the sessions whose TTL ran out by now, in the order they ran out, each at
        its own moment (its LockDelay counts from then, and stale reads see it then)."""
        now = self._clock.monotonic()
        if now < self._first_end:  # no session can have run out yet
            return
        due = sorted(
            (s for s in self._sessions.values() if s.ends_at <= now),
            key=lambda s: (s.ends_at, s.born),
        )
        for session in due:
            self._end(session, session.ends_at)
        self._first_end = min((s.ends_at for s in self._sessions.values()), default=math.inf)

    def _end(self, session: _Session, at: float) -> None:
        """Destroy or invalidate `session` at `at` (one Raft index): every key it holds is
        released (its value kept) and in lock-delay from then."""
        del self._sessions[session.id]
        self._index += 1
        held = [key for key, entry in self._kv.items() if entry.session == session.id]
        for key in held:
            self._store(
                key, replace(self._kv[key], session=None, modify_index=self._index), self._index, at
            )
            if session.lock_delay > 0:
                self._delays[key] = at + session.lock_delay

    def _store(self, key: str, entry: KVEntry | None, index: int, at: float) -> None:
        if entry is None:
            if key not in self._kv:  # made and deleted by one transaction: nothing to undo
                return
            del self._kv[key]
            self._keys.pop(bisect.bisect_left(self._keys, key))
        else:
            if key not in self._kv:
                bisect.insort(self._keys, key)
            self._kv[key] = entry
        self._kv_index = index
        if self._stale_lag:
            self._remember(key, entry, at)
        for watched, events in self._watchers.items():
            # a watch of an absent key wakes on any write: Consul watches the nearest part of
            # its tree, so at least a write beside it wakes it (the model: a superset)
            if watched == key or watched not in self._kv:
                for woken in events:
                    woken.set()

    def _keys_under(self, prefix: str) -> list[str]:
        start = bisect.bisect_left(self._keys, prefix)
        end = start
        while end < len(self._keys) and self._keys[end].startswith(prefix):
            end += 1
        return self._keys[start:end]

    def _remember(self, key: str, entry: KVEntry | None, at: float) -> None:
        """Keep the key's versions a stale read may still see: those after the lag's horizon,
        and the last one before it."""
        versions = self._history.setdefault(key, [])
        versions.append((at, entry))
        horizon = self._clock.monotonic() - self._stale_lag
        while len(versions) > 1 and versions[1][0] <= horizon:
            versions.pop(0)

    def _read(self, key: str, stale: bool) -> KVEntry | None:
        """The key now, or, for a stale read, as it was `stale_lag` seconds ago."""
        if not stale or not self._stale_lag:
            return self._kv.get(key)
        versions = self._history.get(key, [])
        horizon = self._clock.monotonic() - self._stale_lag
        seen = bisect.bisect_right([at for at, _ in versions], horizon)
        return versions[seen - 1][1] if seen else None


def _claimed(store: MemoryTickStore, call: ClaimCall) -> ClaimAnswer:
    try:
        return store.claim(call.job, call.record, call.session, call.holder, call.terms)
    except ConsulError as exc:
        return exc


@functools.lru_cache(maxsize=4096)
def _decoded(tick: datetime, value: bytes | None, modify_index: int) -> TickRecord:
    """`decode`, cached: a record is read again at every replica's turn, fate look and catch-up
    until it is written again (a new value or index is a new key here), and is frozen."""
    return decode(tick, value, modify_index)


def _refuse_oversized(ops: Sequence[KVOp]) -> None:
    """ValueTooLarge (Consul's 413) for a body over REQUEST_MAX_BYTES, as the client sends it."""
    size = len(json.dumps([op.to_api() for op in ops]).encode())
    if size > REQUEST_MAX_BYTES:
        raise ValueTooLarge(f"transaction of {size} bytes, over Consul's {REQUEST_MAX_BYTES}")


def _size_bound(ops: Sequence[KVOp]) -> int:
    """At least the bytes of the transaction's JSON body: every text at its longest escape
    (12 bytes a character: an escaped surrogate pair), the value in base64, and 100 bytes of
    names, quotes and index an operation."""
    texts = sum(len(op.verb) + len(op.key) + len(op.session or "") for op in ops)
    values = sum((len(op.value) + 2) // 3 * 4 for op in ops if op.value is not None)
    return 12 * texts + values + 100 * len(ops) + 2
