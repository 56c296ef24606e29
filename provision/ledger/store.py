"""One job's tick ledger in Consul: read, claim (with the lock, in one transaction), complete,
record missed ticks, prune.

The claim is one transaction, so exactly one runner wins a tick whatever the timing:

    0 check-not-exists  <prefix>ticks/<T>      nobody claimed T (and nobody recorded it missed)
    1 lock              <prefix>.lock           the lock is free and ours now
    2 set               <prefix>ticks/<T>      the record: running, by us
    3 get               <prefix>.lock           its LockIndex: the fencing token

Consul applies all four or none, and a refusal names each operation that failed: 0 (the tick is
taken), 1 (the lock is held: the previous tick still runs, or lock-delay), or both. Completion
is one transaction too: the record (cas at the index the claim left) and the unlock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime

from provision.consul import Consul, ConsulError, KVOp
from provision.ledger.records import (
    TickOutcome,
    TickRecord,
    decode,
    parse_tick_name,
    tick_key,
    ticks_prefix,
)

CHUNK = 60  # operations per transaction (Consul takes at most 64)
MAX_PRUNED_PER_RUN = 2 * CHUNK


@dataclass(frozen=True)
class Claim:
    """What a claim transaction did."""

    won: bool
    lock_index: int = 0  # when won: the fencing token
    lock_modify_index: int = 0
    record_index: int = 0  # when won: the record's ModifyIndex (completion's cas index)
    tick_taken: bool = False  # operation 0 failed: someone claimed or recorded the tick
    lock_refusal: str | None = None  # operation 1 failed: Consul's reason
    date: datetime | None = None  # the agent's clock at the answer
    # when won and asked: whether the schedule's previous tick has a record (run, running, or
    # recorded missed); read in the claim's own transaction, so it costs no request
    previous_recorded: bool | None = None


@dataclass(frozen=True)
class Completion:
    recorded: bool  # the record now says how the run ended
    released: bool | None  # True released; False the lock was not ours; None: no answer


class Ledger:
    def __init__(self, consul: Consul, lock_key: str) -> None:
        self.consul = consul
        self.lock_key = lock_key
        self.prefix = ticks_prefix(lock_key)

    def key(self, tick: datetime) -> str:
        return tick_key(self.lock_key, tick)

    def read(
        self, tick: datetime, *, stale: bool = False
    ) -> tuple[TickRecord | None, datetime | None]:
        """The tick's record (None: unclaimed) and the agent's clock at the answer. `stale`:
        from whichever server the agent asks, not the leader; it may miss the latest claim (for
        a read before a claim, whose transaction decides anyway: never for a read that must see
        a write it follows)."""
        key = self.key(tick)
        if stale and self.consul.txn.batched:  # a scheduler's: merged with its other jobs' reads
            answer = self.consul.txn.read([KVOp("get-tree", key)], batch=True)
            entry, date = next((e for e in answer.results if e.key == key), None), answer.date
        else:
            consistency = "stale" if stale else "default"
            entry, meta = self.consul.kv.get(key, consistency=consistency)
            date = meta.date
        if entry is None:
            return None, date
        return decode(tick, entry.value, entry.modify_index), date

    def records(self) -> list[TickRecord]:
        """Every record, oldest first (one read of the prefix); keys that name no tick are
        not records and are left alone."""
        found = []
        for entry in self.consul.kv.tree(self.prefix):
            tick = parse_tick_name(entry.key[len(self.prefix) :])
            if tick is not None and entry.key.startswith(self.prefix):
                found.append(decode(tick, entry.value, entry.modify_index))
        return sorted(found, key=lambda record: record.tick)

    def ticks(self) -> set[datetime]:
        """The ticks that have a record (their key names only: one cheap read, no values)."""
        names = (key[len(self.prefix) :] for key in self.consul.kv.keys(self.prefix))
        return {tick for tick in map(parse_tick_name, names) if tick is not None}

    def claim(
        self,
        record: TickRecord,
        holder: bytes,
        session_id: str,
        previous: datetime | None = None,
    ) -> Claim:
        """Claim the record's tick and take the lock, in one transaction; with `previous`, the
        answer also says whether that tick has a record (a get-tree of its one key: unlike
        `get`, it does not fail the transaction when there is none)."""
        key = self.key(record.tick)
        ops = [
            KVOp("check-not-exists", key),
            KVOp("lock", self.lock_key, holder, session=session_id),
            KVOp("set", key, record.encode()),
            KVOp("get", self.lock_key),
        ]
        if previous is not None:
            ops.append(KVOp("get-tree", self.key(previous)))
        # the job starts once this is answered; claims of jobs ticking together share a transaction
        answer = self.consul.txn.kv(ops, urgent=True, batch=True)
        if not answer.applied:
            refusal = answer.failed(1)
            return Claim(
                False,
                tick_taken=answer.failed(0) is not None,
                lock_refusal=None if refusal is None else refusal.what,
                date=answer.date,
            )
        lock, written = answer.entry(self.lock_key), answer.entry(key)
        assert lock is not None and written is not None  # an applied claim returns both
        seen = None if previous is None else answer.entry(self.key(previous)) is not None
        return Claim(
            True,
            lock.lock_index,
            lock.modify_index,
            written.modify_index,
            date=answer.date,
            previous_recorded=seen,
        )

    def complete(self, record: TickRecord, session_id: str, *, release: bool) -> Completion:
        """Write how the run ended (cas at the claim's index) and, with `release`, unlock, in one
        transaction. If the lock was no longer ours the record says `lost`."""
        cas = KVOp("cas", self.key(record.tick), record.encode(), index=record.modify_index)
        unlock = [KVOp("unlock", self.lock_key, session=session_id)] if release else []
        try:
            answer = self.consul.txn.kv([cas, *unlock], batch=True)
            if answer.applied:
                return Completion(True, release)
            if answer.failed(0) is not None:  # the record was changed under us: unlock alone
                return Completion(False, self._unlock(session_id) if release else False)
            lost = replace(record, outcome=TickOutcome.LOST)  # the unlock failed: not ours
            again = self.consul.txn.kv([replace(cas, value=lost.encode())])
            return Completion(again.applied, False)
        except ConsulError:
            return Completion(False, None)

    def _unlock(self, session_id: str) -> bool | None:
        try:
            return self.consul.kv.put(self.lock_key, release=session_id)
        except ConsulError:
            return None

    def record_missed(self, records: Iterable[TickRecord]) -> int:
        """Write `missed` records for ticks nobody claimed (only where no record exists yet:
        cas at index 0), so a tick is recorded missed once, whoever notices. How many written."""
        ops = [KVOp("cas", self.key(r.tick), r.encode(), index=0) for r in records][:CHUNK]
        while ops:
            answer = self.consul.txn.kv(ops)
            if answer.applied:
                return len(ops)
            taken = {error.op_index for error in answer.errors}  # recorded meanwhile
            if not taken:  # refused for no operation in particular: do not loop
                break
            ops = [op for index, op in enumerate(ops) if index not in taken]
        return 0

    def prune(self, ticks: Iterable[datetime]) -> int:
        """Delete the records of `ticks` (retention), at most MAX_PRUNED_PER_RUN. How many."""
        keys = [self.key(tick) for tick in ticks][:MAX_PRUNED_PER_RUN]
        for start in range(0, len(keys), CHUNK):
            self.consul.txn.kv([KVOp("delete", key) for key in keys[start : start + CHUNK]])
        return len(keys)
