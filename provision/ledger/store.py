"""One job's tick ledger in Consul: read, claim (with the lock, in one transaction), complete,
record missed ticks, prune.

The claim is one transaction, so exactly one runner wins a tick whatever the timing:

    0 check-not-exists  <prefix>ticks/<T>      nobody claimed T (and nobody recorded it missed)
    1 lock              <prefix>.lock           the lock is free and ours now
    2 set               <prefix>ticks/<T>      the record: running, by us
    3 get               <prefix>.lock           its LockIndex: the fencing token

Consul applies all four or none, and a refusal names each operation that failed: 0 (the tick is
taken), 1 (the lock is held: the previous tick still runs, or lock-delay), or both. For a job its
operators may pause, one more operation reads the job's control keys (get-tree of
`lockctl/control/<job>/`, which its workers may read and not write): a claim that finds the
`paused` key there is completed `paused` at once, and its job never starts. It costs a running
job nothing (no request, no Raft entry). Not a check-not-exists that would refuse the claim:
Consul (1.8.7, measured) authorizes check-not-exists as a write, which a worker must not have
on its control keys; check-index and get fail the other way round (on an absent key). Completion
is one transaction too: the record (cas at the index the claim left) and the unlock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from provision.consul import (
    AnswerTooLarge,
    Consul,
    ConsulError,
    ConsulHTTPError,
    KVOp,
    PermissionDenied,
    TxnAnswer,
)
from provision.ledger.control import taken_key
from provision.ledger.records import (
    RECORD_MAX_BYTES,
    RecordProblem,
    TickRecord,
    decode,
    oversized,
    parse_tick_name,
    tick_key,
    ticks_prefix,
)
from provision.outcomes import Outcome
from provision.system.control_keys import PAUSED

CHUNK = 60  # operations per transaction (Consul takes at most 64)
MAX_PRUNED_PER_RUN = 2 * CHUNK
# Bytes of key names a reader takes from one ledger: ~60,000 names, six times the most that
# history_limit (10,000) and its slack keep. More is not a ledger lockctl wrote: refused.
NAMES_MAX_BYTES = 4 * 1024 * 1024
FETCH_BATCH = 16  # records per read transaction: its answer is at most ~90 KB
LOCK_MAX_BYTES = 1024 * 1024  # the lock key's answer: Consul's 512 KB value cap, in base64
LOCK_READS = 3  # reads of the lock key a fetch may take while the lock moves under it


def _answer_bytes(key: str, value_bytes: int) -> int:
    """The most a read of `key` holding `value_bytes` adds to an answer: base64 (4/3), the key
    (JSON may escape it) and the entry's other fields."""
    return 4 * -(-value_bytes // 3) + 2 * len(key) + 256


class LockMoved(ConsulError):
    """The lock key changed while records were read with it, more than LOCK_READS times."""


@dataclass(frozen=True)
class Fetched:
    """Records read by name (oversized ones `unreadable`, with their problem), all at one
    state of the lock key: its session then."""

    records: tuple[TickRecord, ...] = ()
    problems: tuple[RecordProblem, ...] = ()
    lock_session: str | None = None
    date: datetime | None = None

    def then(self, later: Fetched) -> Fetched:
        return Fetched(
            self.records + later.records,
            self.problems + later.problems,
            self.lock_session,
            self.date or later.date,
        )


class _Moved(Exception):
    """The lock key is no longer as read: read it again."""


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
    paused: bytes | None = None  # when won: the paused key's value, if the job is paused


@dataclass(frozen=True)
class ClaimTerms:
    """What a claim asks beyond the tick: `previous`, whether that tick has a record (a
    get-tree of its one key: unlike `get`, it does not fail the transaction when there is
    none); `over`, the ModifyIndex of the tick's `missed` record a catch-up claims over
    (ledger/catchup.py: the claim wins only while that record is as read, so it and a later one
    cannot both win; 0: the tick must have no record); `trigger`, a manual run's (the trigger's
    id, and the index the job's taken-trigger key was read at, 0 when absent): the claim also
    records that trigger taken, and fails if another took one meanwhile."""

    previous: datetime | None = None
    over: int = 0
    trigger: tuple[str, int] | None = None


PLAIN = ClaimTerms()


@dataclass(frozen=True)
class ClaimKeys:
    """The keys one claim's transaction touches."""

    tick: str  # the tick's record
    lock: str
    previous: str | None = None  # the previous tick's record, when the terms ask of it
    control: str | None = None  # the job's control keys' folder, read along (None: not)

    @property
    def taken(self) -> str:
        return taken_key(self.lock)


@dataclass(frozen=True)
class ClaimTxn:
    """One claim's transaction, what it sends and how its answer reads: the one definition,
    for Consul (Ledger.claim) and for the in-memory model (tick/memory.py)."""

    keys: ClaimKeys
    terms: ClaimTerms = PLAIN

    def ops(self, record: TickRecord, holder: bytes, session_id: str) -> list[KVOp]:
        keys, over = self.keys, self.terms.over
        unclaimed = KVOp("check-index", keys.tick, index=over) if over else None
        ops = [
            unclaimed or KVOp("check-not-exists", keys.tick),
            KVOp("lock", keys.lock, holder, session=session_id),
            KVOp("set", keys.tick, record.encode()),
            KVOp("get", keys.lock),
        ]
        if keys.previous is not None:
            ops.append(KVOp("get-tree", keys.previous))
        if keys.control is not None:  # read-only and never failing: the claim is not refused
            ops.append(KVOp("get-tree", keys.control))
        if self.terms.trigger is not None:  # a manual run: ours only if nobody took one
            trigger_id, index = self.terms.trigger
            ops.append(KVOp("cas", keys.taken, trigger_id.encode(), index=index))
        return ops

    def read(self, answer: TxnAnswer) -> Claim:
        keys = self.keys
        if not answer.applied:
            refusal = answer.failed(1)
            taken_op = 4 + (keys.previous is not None) + (keys.control is not None)
            return Claim(
                False,
                tick_taken=answer.failed(0) is not None
                or (self.terms.trigger is not None and answer.failed(taken_op) is not None),
                lock_refusal=None if refusal is None else refusal.what,
                date=answer.date,
            )
        lock, written = answer.entry(keys.lock), answer.entry(keys.tick)
        assert lock is not None and written is not None  # an applied claim returns both
        seen = None if keys.previous is None else answer.entry(keys.previous) is not None
        paused = None if keys.control is None else answer.entry(keys.control + PAUSED)
        return Claim(
            True,
            lock.lock_index,
            lock.modify_index,
            written.modify_index,
            date=answer.date,
            previous_recorded=seen,
            paused=None if paused is None else paused.value or b"",
        )


@dataclass(frozen=True)
class Completion:
    recorded: bool  # the record now says how the run ended
    released: bool | None  # True released; False the lock was not ours; None: no answer


class Ledger:
    def __init__(self, consul: Consul, lock_key: str, control: str | None = None) -> None:
        self.consul = consul
        self.lock_key = lock_key
        self.prefix = ticks_prefix(lock_key)
        self.control = control  # the job's control keys' folder, read by claims (None: not)

    def key(self, tick: datetime) -> str:
        return tick_key(self.lock_key, tick)

    def read(
        self, tick: datetime, *, stale: bool = False
    ) -> tuple[TickRecord | None, datetime | None]:
        """The tick's record (None: unclaimed) and the agent's clock at the answer. `stale`:
        from whichever server the agent asks, not the leader; it may miss the latest claim (for
        a read before a claim, whose transaction decides anyway: never for a read that must see
        a write it follows). A value over RECORD_MAX_BYTES is read no further: `unreadable`
        (merged with a scheduler's other reads, it comes whole: at most Consul's 512 KB)."""
        key = self.key(tick)
        if stale and self.consul.txn.batched:  # a scheduler's: merged with its other jobs' reads
            answer = self.consul.txn.read([KVOp("get-tree", key)], batch=True)
            entry, date = next((e for e in answer.results if e.key == key), None), answer.date
        else:
            consistency = "stale" if stale else "default"
            try:
                cap = _answer_bytes(key, RECORD_MAX_BYTES)
                entry, meta = self.consul.kv.get(key, consistency=consistency, max_bytes=cap)
            except AnswerTooLarge:  # a record, so the tick is taken; not one to decode
                return TickRecord(tick, Outcome.UNREADABLE), None
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
        return self.tick_names()[0]

    def tick_names(self) -> tuple[set[datetime], datetime | None]:
        """The ticks that have a record, from their key names alone (up to NAMES_MAX_BYTES of
        them, else AnswerTooLarge naming the prefix), and the agent's clock at the answer.
        GET /v1/kv/<prefix>?keys&separator=/: a folder under the prefix is one name."""
        try:
            keys, meta = self.consul.kv.key_names(
                self.prefix, separator="/", max_bytes=NAMES_MAX_BYTES
            )
        except AnswerTooLarge:
            raise AnswerTooLarge(
                f"ledger {self.prefix}: key names: more than {NAMES_MAX_BYTES} bytes of them "
                "(a ledger lockctl keeps is far smaller): not read"
            ) from None
        names = (key[len(self.prefix) :] for key in keys if key.startswith(self.prefix))
        return {tick for tick in map(parse_tick_name, names) if tick is not None}, meta.date

    def fetch(
        self,
        ticks: Sequence[datetime],
        until: Callable[[Sequence[TickRecord]], bool] | None = None,
    ) -> Fetched:
        """The records of `ticks` (in that order) and the lock's session, all at one state of
        the lock key: GET it (403 for a token that may not read), then FETCH_BATCH records at a
        time in read-only transactions that check the lock's index, each answer read up to a
        cap. A record over RECORD_MAX_BYTES is `unreadable` with its problem, never decoded; one
        deleted since its name was listed (retention) is left out. The lock moving meanwhile
        (a run claimed or ended) restarts the read, at most LOCK_READS times. `until`: stop
        after the batch whose records, with those before, satisfy it."""
        for _ in range(LOCK_READS):
            lock, meta = self.consul.kv.get(self.lock_key, max_bytes=LOCK_MAX_BYTES)
            check = (
                KVOp("check-not-exists", self.lock_key)
                if lock is None
                else KVOp("check-index", self.lock_key, index=lock.modify_index)
            )
            fetched = Fetched(lock_session=None if lock is None else lock.session, date=meta.date)
            try:
                for start in range(0, len(ticks), FETCH_BATCH):
                    fetched = fetched.then(self._fetch(check, ticks[start : start + FETCH_BATCH]))
                    if until is not None and until(fetched.records):
                        break
            except _Moved:
                continue
            return fetched
        raise LockMoved(
            f"ledger {self.prefix}: the lock key {self.lock_key} kept changing "
            f"while its records were read ({LOCK_READS} times): try again"
        )

    def _fetch(self, check: KVOp, ticks: Sequence[datetime]) -> Fetched:
        """One batch; over its cap, each record on its own, so the others are still read and
        the one too large is named. (Each answer cut short costs its connection: one per such
        record is the least, where halving the batch would cut two or more.)"""
        try:
            return self._read_batch(check, ticks)
        except AnswerTooLarge:
            if len(ticks) == 1:
                problem = oversized(ticks[0], self.key(ticks[0]))
                return Fetched((TickRecord(ticks[0], Outcome.UNREADABLE),), (problem,))
        fetched = Fetched()
        for tick in ticks:
            fetched = fetched.then(self._fetch(check, [tick]))
        return fetched

    def _read_batch(self, check: KVOp, ticks: Sequence[datetime]) -> Fetched:
        keys = {self.key(tick): tick for tick in ticks}
        ops = [check, *(KVOp("get", key) for key in keys)]
        cap = 512 + sum(_answer_bytes(key, RECORD_MAX_BYTES) for key in keys)
        while True:
            answer = self._read_txn(ops, cap)
            if answer.applied:
                break
            if answer.failed(0) is not None:
                raise _Moved
            # a `get` of a key that is gone fails the transaction: read again without it
            gone = {error.op_index for error in answer.errors}
            if not gone:
                raise ConsulError(f"ledger {self.prefix}: reading records refused, no reason given")
            ops = [op for index, op in enumerate(ops) if index not in gone]
            if len(ops) == 1:
                return Fetched()
        records, problems = [], []
        for entry in answer.results:
            tick = keys.get(entry.key)
            if tick is None:
                continue
            size = len(entry.value or b"")
            if size > RECORD_MAX_BYTES:  # within the batch's cap, over a record's
                problems.append(oversized(tick, entry.key, size))
                records.append(TickRecord(tick, Outcome.UNREADABLE))
            else:
                records.append(decode(tick, entry.value, entry.modify_index))
        return Fetched(tuple(records), tuple(problems), date=answer.date)

    def _read_txn(self, ops: list[KVOp], cap: int) -> TxnAnswer:
        """A read transaction whose error, if any, says which ledger it was reading (Consul's
        own message names only PUT /v1/txn)."""
        try:
            return self.consul.txn.kv(ops, max_bytes=cap)
        except (AnswerTooLarge, PermissionDenied):
            raise  # the one is the caller's business; the other names its keys already
        except ConsulHTTPError as exc:
            raise type(exc)(
                f"{exc} (reading the records of {self.prefix})",
                status=exc.status,
                body=exc.body,
                headers=exc.headers,
            ) from None
        except ConsulError as exc:
            raise type(exc)(f"{exc} (reading the records of {self.prefix})") from None

    def claim(
        self, record: TickRecord, holder: bytes, session_id: str, terms: ClaimTerms = PLAIN
    ) -> Claim:
        """Claim the record's tick and take the lock, in one transaction (ClaimTxn says what it
        checks, writes and reads)."""
        previous = None if terms.previous is None else self.key(terms.previous)
        keys = ClaimKeys(self.key(record.tick), self.lock_key, previous, self.control)
        txn = ClaimTxn(keys, terms)
        # the job starts once this is answered; claims of jobs ticking together share a transaction
        answer = self.consul.txn.kv(txn.ops(record, holder, session_id), urgent=True, batch=True)
        return txn.read(answer)

    def complete(self, record: TickRecord, session_id: str, *, release: bool) -> Completion:
        """Write how the run ended (cas at the claim's index) and, with `release`, unlock, in one
        transaction. If the lock was no longer ours the record says `lost`."""
        cas, *unlock = self.completion_ops(record, session_id, release=release)
        try:
            answer = self.consul.txn.kv([cas, *unlock], batch=True)
            if answer.applied:
                return Completion(True, release)
            if answer.failed(0) is not None:  # the record was changed under us: unlock alone
                return Completion(False, self._unlock(session_id) if release else False)
            lost = replace(record, outcome=Outcome.LOST)  # the unlock failed: not ours
            again = self.consul.txn.kv([replace(cas, value=lost.encode())])
            return Completion(again.applied, False)
        except ConsulError:
            return Completion(False, None)

    def completion_ops(self, record: TickRecord, session_id: str, *, release: bool) -> list[KVOp]:
        """A completion's transaction: the record (cas at the claim's index), then the unlock."""
        cas = KVOp("cas", self.key(record.tick), record.encode(), index=record.modify_index)
        return [cas, KVOp("unlock", self.lock_key, session=session_id)] if release else [cas]

    def _unlock(self, session_id: str) -> bool | None:
        try:
            return self.consul.kv.put(self.lock_key, release=session_id)
        except ConsulError:
            return None

    def record_missed(self, records: Iterable[TickRecord]) -> int:
        """`record_unrun`: how many it wrote."""
        return len(self.record_unrun(records))

    def record_unrun(self, records: Iterable[TickRecord]) -> list[TickRecord]:
        """Write the records of ticks nobody claimed, `missed`, `paused` or `buffered` (only
        where no record exists yet: cas at index 0; or, for a record with a ModifyIndex, over
        the record read at that index: a `buffered` one become `missed`), so a tick is recorded
        once, whoever notices. Those written."""
        pending = list(records)[:CHUNK]
        while pending:
            ops = [KVOp("cas", self.key(r.tick), r.encode(), index=r.modify_index) for r in pending]
            answer = self.consul.txn.kv(ops)
            if answer.applied:
                return pending
            taken = {error.op_index for error in answer.errors}  # recorded meanwhile
            if not taken:  # refused for no operation in particular: do not loop
                break
            pending = [r for index, r in enumerate(pending) if index not in taken]
        return []

    def prune(self, ticks: Iterable[datetime]) -> int:
        """Delete the records of `ticks` (retention), at most MAX_PRUNED_PER_RUN. How many."""
        keys = [self.key(tick) for tick in ticks][:MAX_PRUNED_PER_RUN]
        for start in range(0, len(keys), CHUNK):
            self.consul.txn.kv([KVOp("delete", key) for key in keys[start : start + CHUNK]])
        return len(keys)
