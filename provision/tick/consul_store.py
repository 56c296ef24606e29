"""The TickStore over Consul: today's code (provision/consul's client, the Ledger, the sessions
helpers, the operators' reads), each method a thin call into it. Only provision/consul speaks
HTTP; this module translates the refusals the protocol names (store.py) and nothing else."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime

from provision.consul import (
    NO_RETRY,
    Consul,
    ConsulError,
    ConsulHTTPError,
    KVOp,
    NotFound,
    PermissionDenied,
    TxnAnswer,
)
from provision.consul.batch import MAX_BATCH_BYTES, MAX_OPERATIONS
from provision.consul.models import KVEntry
from provision.ledger.control import NOTE_MAX_BYTES, decode_note
from provision.ledger.operator import read_pauses
from provision.ledger.records import TickRecord, decode
from provision.ledger.store import Claim, ClaimTxn, Completion, Ledger
from provision.sessions import SessionTerms, create_session
from provision.system.control_keys import trigger_key
from provision.tick.edge import Note
from provision.tick.store import (
    MAX_WATCH,
    PLAIN,
    ClaimAnswer,
    ClaimCall,
    ClaimTerms,
    CompleteCall,
    ControlState,
    InvalidSession,
    JobKeys,
    SessionGone,
    TurnRead,
    ValueTooLarge,
    check_terms,
    claim_txn,
    records_under,
    refuse_invalid_session,
)

TOO_LARGE = 413  # Consul's answer to a request body or value over its caps
# Consul's answers to a transaction refused as a request, before anything was applied
REFUSED_WHOLE = frozenset({400, TOO_LARGE})

Tails = tuple[str | None, str | None]  # the ends of a run's stdout and stderr, for its record
TailsOf = Callable[[str, datetime], Tails | None]  # a job's name and tick: its run's tails here


@contextmanager
def _sized() -> Iterator[None]:
    """A 413 is the protocol's ValueTooLarge (Consul applied nothing)."""
    try:
        yield
    except ConsulHTTPError as exc:
        if exc.status != TOO_LARGE:
            raise
        raise ValueTooLarge(str(exc)) from exc


def _decoded(tick: datetime, entry: KVEntry | None) -> TickRecord | None:
    return None if entry is None else decode(tick, entry.value, entry.modify_index)


def _known_session(job: JobKeys, claim: Claim) -> ClaimAnswer:
    try:
        return refuse_invalid_session(job, claim)
    except InvalidSession as exc:
        return exc


def _refused_claims(claims: Sequence[_Sendable], answer: TxnAnswer) -> dict[int, TxnAnswer]:
    """The claims (by position) whose operations failed in a rolled-back transaction, each
    with its own answer: its errors, numbered as in its own transaction (batch.py's rule)."""
    refused: dict[int, TxnAnswer] = {}
    start = 0
    for n, claim in enumerate(claims):
        end = start + len(claim.ops)
        own = tuple(
            replace(error, op_index=error.op_index - start)
            for error in answer.errors
            if start <= error.op_index < end
        )
        if own:
            refused[n] = replace(answer, results=(), errors=own)
        start = end
    return refused


@dataclass(frozen=True)
class _Sendable:
    """A claim of claim_many, its transaction and that transaction's operations."""

    call: ClaimCall
    txn: ClaimTxn
    ops: list[KVOp]

    @classmethod
    def of(cls, call: ClaimCall) -> _Sendable:
        txn = claim_txn(call.job, call.record.tick, call.terms)
        return cls(call, txn, txn.ops(call.record, call.holder, call.session))


def _apart(claims: Sequence[_Sendable]) -> list[list[_Sendable]]:
    """The claims in order, in groups of one transaction each: at most MAX_OPERATIONS
    operations, and no lock twice (a claim's keys are its job's alone)."""
    groups: list[list[_Sendable]] = []
    ops, locks = 0, set[str]()
    for claim in claims:
        lock = claim.call.job.lock_key
        if not groups or ops + len(claim.ops) > MAX_OPERATIONS or lock in locks:
            groups.append([])
            ops, locks = 0, set()
        groups[-1].append(claim)
        ops += len(claim.ops)
        locks.add(lock)
    return groups


@dataclass(frozen=True)
class _Completing:
    """A completion of complete_many, its transaction's operations and their values' size."""

    call: CompleteCall
    ops: list[KVOp]
    size: int

    @classmethod
    def of(cls, store: ConsulTickStore, call: CompleteCall) -> _Completing:
        ledger = store._ledger(call.job)
        ops = ledger.completion_ops(call.record, call.session, release=call.release)
        return cls(call, ops, sum(len(op.value or b"") for op in ops))


def _completions_apart(completions: Sequence[_Completing]) -> list[list[_Completing]]:
    """The completions in order, in groups of one transaction each: at most MAX_OPERATIONS
    operations and MAX_BATCH_BYTES of values (a record carries its run's output tails), and
    no lock twice."""
    groups: list[list[_Completing]] = []
    ops = size = 0
    locks = set[str]()
    for completing in completions:
        lock = completing.call.job.lock_key
        over = ops + len(completing.ops) > MAX_OPERATIONS
        over = over or size + completing.size > MAX_BATCH_BYTES
        if not groups or over or lock in locks:
            groups.append([])
            ops, size, locks = 0, 0, set()
        groups[-1].append(completing)
        ops, size = ops + len(completing.ops), size + completing.size
        locks.add(lock)
    return groups


def _failed_parts(sizes: Sequence[int], answer: TxnAnswer) -> Iterator[int]:
    """The parts (by position, each `sizes[n]` operations in turn) of a rolled-back
    transaction that an error names."""
    start = 0
    for n, size in enumerate(sizes):
        if any(start <= error.op_index < start + size for error in answer.errors):
            yield n
        start += size


class ConsulTickStore:
    """A TickStore on a Consul client (its token, retries and agent clock as it was made)."""

    def __init__(self, consul: Consul) -> None:
        self.consul = consul

    def _ledger(self, job: JobKeys) -> Ledger:
        return Ledger(self.consul, job.lock_key, job.control)

    # -- sessions ------------------------------------------------------------------------------
    def create_session(self, terms: SessionTerms) -> str:
        check_terms(terms)
        return create_session(self.consul, terms)

    def renew_session(self, session_id: str, *, timeout: float | None = None) -> None:
        # once, not retried: the next interval is the retry (provision/sessions.py)
        try:
            self.consul.session.renew(session_id, timeout=timeout, retry=NO_RETRY)
        except NotFound as exc:
            raise SessionGone(f"session {session_id}: gone (renew: 404)") from exc

    def destroy_session(self, session_id: str) -> None:
        self.consul.session.destroy(session_id)

    # -- a tick --------------------------------------------------------------------------------
    def claim(
        self,
        job: JobKeys,
        record: TickRecord,
        session_id: str,
        holder: bytes,
        terms: ClaimTerms = PLAIN,
    ) -> Claim:
        with _sized():
            claim = self._ledger(job).claim(record, holder, session_id, terms)
        return refuse_invalid_session(job, claim)

    def claim_many(self, claims: Sequence[ClaimCall]) -> list[ClaimAnswer]:
        answers: list[ClaimAnswer] = []
        for group in _apart([_Sendable.of(call) for call in claims]):
            answers += self._claim_together(group)
        return answers

    def _claim_together(self, claims: Sequence[_Sendable]) -> list[ClaimAnswer]:
        """One transaction, every claim's operations in turn (their keys apart). Applied: each
        claim's answer read from it, as Ledger.claim reads its own. Rolled back (a tick taken,
        a lock held: Consul rolls the whole transaction back, and names every operation that
        failed): a claim whose operations failed has the answer it would have had alone (its
        keys are nobody else's: the same operations fail), the others go again together.
        Refused as a request (a right missing, too large): each claim again on its own. No
        answer: each claim in it unanswered (maybe applied)."""
        if len(claims) == 1:
            return [self._claim_alone(claims[0].call)]
        ops = [op for claim in claims for op in claim.ops]
        try:
            answer = self.consul.txn.kv(ops, urgent=True, batch=True)
        except PermissionDenied:
            return [self._claim_alone(claim.call) for claim in claims]
        except ConsulHTTPError as exc:
            if exc.status not in REFUSED_WHOLE:
                return [exc] * len(claims)
            return [self._claim_alone(claim.call) for claim in claims]
        except ConsulError as exc:
            return [exc] * len(claims)
        if answer.applied:
            return [_known_session(claim.call.job, claim.txn.read(answer)) for claim in claims]
        refused = _refused_claims(claims, answer)
        if not refused:  # errors that name no operation: nothing to tell apart, each alone
            return [self._claim_alone(claim.call) for claim in claims]
        rest = [claim for n, claim in enumerate(claims) if n not in refused]
        again = iter(self._claim_together(rest) if rest else [])
        return [
            _known_session(claim.call.job, claim.txn.read(refused[n]))
            if n in refused
            else next(again)
            for n, claim in enumerate(claims)
        ]

    def _claim_alone(self, call: ClaimCall) -> ClaimAnswer:
        try:
            return self.claim(call.job, call.record, call.session, call.holder, call.terms)
        except ConsulError as exc:
            return exc

    def finished(self, job: JobKeys, record: TickRecord) -> TickRecord:
        """The record a completion writes: a subclass adds what only it knows (the run's
        output tails)."""
        return record

    def complete(
        self, job: JobKeys, record: TickRecord, session_id: str, *, release: bool
    ) -> Completion:
        return self._ledger(job).complete(self.finished(job, record), session_id, release=release)

    def complete_many(self, completions: Sequence[CompleteCall]) -> list[Completion]:
        answers: list[Completion] = []
        finished = [replace(c, record=self.finished(c.job, c.record)) for c in completions]
        for group in _completions_apart([_Completing.of(self, call) for call in finished]):
            answers += self._complete_together(group)
        return answers

    def _complete_together(self, group: Sequence[_Completing]) -> list[Completion]:
        """One transaction, every completion's operations in turn (their keys apart). Applied:
        each recorded (and released). Rolled back (a record changed, a lock not ours: Consul
        names every operation that failed): each completion that failed goes again alone, for
        Ledger.complete's answer (the unlock alone, or the record `lost`), the others again
        together. Refused as a request: each alone. No answer: each unanswered."""
        if len(group) == 1:
            return [self._complete_alone(group[0].call)]
        ops = [op for completing in group for op in completing.ops]
        try:
            answer = self.consul.txn.kv(ops, batch=True)
        except PermissionDenied:
            return [self._complete_alone(completing.call) for completing in group]
        except ConsulHTTPError as exc:
            if exc.status not in REFUSED_WHOLE:
                return [Completion(False, None)] * len(group)
            return [self._complete_alone(completing.call) for completing in group]
        except ConsulError:
            return [Completion(False, None)] * len(group)
        if answer.applied:
            return [Completion(True, completing.call.release) for completing in group]
        failed = set(_failed_parts([len(completing.ops) for completing in group], answer))
        if not failed:  # errors that name no operation: nothing to tell apart, each alone
            return [self._complete_alone(completing.call) for completing in group]
        rest = [completing for n, completing in enumerate(group) if n not in failed]
        again = iter(self._complete_together(rest) if rest else [])
        return [
            self._complete_alone(completing.call) if n in failed else next(again)
            for n, completing in enumerate(group)
        ]

    def _complete_alone(self, call: CompleteCall) -> Completion:
        # the record is finished already (complete_many): the ledger's complete, not ours
        return self._ledger(call.job).complete(call.record, call.session, release=call.release)

    # -- the ledger ----------------------------------------------------------------------------
    def read_tick(
        self, job: JobKeys, tick: datetime, *, stale: bool = False
    ) -> tuple[TickRecord | None, datetime | None]:
        return self._ledger(job).read(tick, stale=stale)

    def read_turns(self, turns: Sequence[tuple[JobKeys, datetime]]) -> list[TurnRead]:
        answers: list[TurnRead] = []
        for start in range(0, len(turns), MAX_OPERATIONS):
            answers += self._read_together(turns[start : start + MAX_OPERATIONS])
        return answers

    def _read_together(self, turns: Sequence[tuple[JobKeys, datetime]]) -> list[TurnRead]:
        """One read-only transaction, ?stale (merged with the client's other reads, as
        Ledger.read's): each tick's key read as a prefix, as Ledger.read reads one (a `get` of
        a key with no record would fail the whole transaction; `get-tree` answers nothing)."""
        keys = [job.tick(tick) for job, tick in turns]
        try:
            answer = self.consul.txn.read([KVOp("get-tree", key) for key in keys], batch=True)
        except PermissionDenied:  # a token that may not read one of them: each on its own
            return [self._read_alone(job, tick) for job, tick in turns]
        except ConsulError as exc:
            return [exc] * len(turns)
        found = {entry.key: entry for entry in answer.results}
        return [
            (_decoded(tick, found.get(key)), answer.date)
            for (_, tick), key in zip(turns, keys, strict=True)
        ]

    def _read_alone(self, job: JobKeys, tick: datetime) -> TurnRead:
        try:
            return self._ledger(job).read(tick, stale=True)
        except ConsulError as exc:
            return exc

    def read_ticks(self, job: JobKeys, *, stale: bool = False) -> list[TickRecord]:
        if not stale:
            return self._ledger(job).records()
        # the KV tree read has no stale mode in the client; a read-only transaction has (?stale)
        answer = self.consul.txn.read([KVOp("get-tree", job.ticks)])
        return records_under(job.ticks, ((e.key, e.value, e.modify_index) for e in answer.results))

    def read_tick_names(self, job: JobKeys) -> tuple[set[datetime], datetime | None]:
        return self._ledger(job).tick_names()

    def record_unrun(self, job: JobKeys, records: Sequence[TickRecord]) -> list[TickRecord]:
        with _sized():
            return self._ledger(job).record_unrun(records)

    def prune(self, job: JobKeys, ticks: Iterable[datetime]) -> int:
        return self._ledger(job).prune(ticks)

    # -- operators and the lock ----------------------------------------------------------------
    def read_control(self, job: JobKeys) -> ControlState:
        pauses = read_pauses(self.consul, job.name)
        trigger, _ = self.consul.kv.get(
            trigger_key(job.name), consistency="consistent", max_bytes=NOTE_MAX_BYTES * 2
        )
        taken, _ = self.consul.kv.get(job.taken, consistency="consistent")
        return ControlState(
            pauses,
            None if trigger is None else decode_note(trigger.value),
            None if taken is None else taken.value or b"",
            0 if taken is None else taken.modify_index,
        )

    def watch_lock(self, job: JobKeys, index: int, wait: float) -> tuple[str | None, int]:
        entry, meta = self.consul.kv.get(
            job.lock_key, consistency="consistent", index=index, wait=min(wait, MAX_WATCH)
        )
        seen = meta.index or 0
        # Consul's advice: an index that goes backwards (a snapshot restore) starts over at 0
        return (None if entry is None else entry.session), (seen if seen >= index else 0)

    # -- a plain lock: the lock alone, no tick ---------------------------------------------------
    def acquire_lock(self, job: JobKeys, session_id: str, holder: bytes) -> Claim:
        # one transaction: the lock and its read back (the token and the key's ModifyIndex)
        ops = [KVOp("lock", job.lock_key, holder, session=session_id), KVOp("get", job.lock_key)]
        answer = self.consul.txn.kv(ops, urgent=True)
        entry = answer.entry(job.lock_key) if answer.applied else None
        if entry is None:
            refusal = answer.failed(0)
            what = "refused" if refusal is None else refusal.what
            return refuse_invalid_session(job, Claim(False, lock_refusal=what, date=answer.date))
        return Claim(True, entry.lock_index, entry.modify_index, date=answer.date)

    def release_lock(self, job: JobKeys, session_id: str) -> bool:
        return self.consul.kv.put(job.lock_key, release=session_id)


class TailedStore(ConsulTickStore):
    """The store on Consul of a process that runs the bodies itself (`lockctl run`, `lockctl
    schedule`, embed): a completion's record carries its run's output tails, which `tails`
    answers for a job's name and tick (None: no run of that tick here)."""

    def __init__(self, consul: Consul, tails: TailsOf) -> None:
        super().__init__(consul)
        self.tails = tails

    def finished(self, job: JobKeys, record: TickRecord) -> TickRecord:
        return with_tails(record, self.tails(job.name, record.tick))


def with_tails(record: TickRecord, tails: Tails | None) -> TickRecord:
    """The record with its run's output tails, if the run was here."""
    return record if tails is None else replace(record, stdout=tails[0], stderr=tails[1])


def note_with_tails(note: Note, tails: TailsOf) -> Note:
    """A completion's note with its record's output tails, as a TailedStore completed it (the
    core's copy has none), for a webhook's body."""
    record = note.record
    if note.kind != "completed" or record is None or record.stdout or record.stderr:
        return note
    return replace(note, record=with_tails(record, tails(note.job, record.tick)))
