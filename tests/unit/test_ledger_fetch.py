"""How the ledger's readers fetch records (provision/ledger/store.py `tick_names`, `fetch`)
against a fake Consul that answers as the real one does and enforces the reader's byte caps:
what is read, what is cut short, and what a reader is told. No cluster."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from provision.consul import AnswerTooLarge, ConsulServerError
from provision.consul.models import KVEntry, ReadMeta
from provision.consul.txn import KVOp, TxnAnswer, TxnError
from provision.ledger.records import RECORD_MAX_BYTES, TickOutcome, tick_key
from provision.ledger.store import FETCH_BATCH, LOCK_READS, Ledger, LockMoved

LOCK = "locks/job/.lock"
T = datetime(2026, 12, 1, tzinfo=timezone.utc)
GOOD = json.dumps({"format": 1, "outcome": "succeeded", "worker": "w"}).encode()


def day(n: int) -> datetime:
    return T - timedelta(days=n)


@dataclass
class FakeKV:
    store: dict[str, bytes]
    index: dict[str, int]
    sent: list[int] = field(default_factory=list)  # bytes of each answer, as far as read
    lock_changes: int = 0  # writes to the lock key to make after each read of it

    def entry(self, key: str) -> KVEntry:
        value = self.store[key]
        return KVEntry(key, value, 0, "s-1" if key == LOCK else None, 1, 1, self.index[key])

    def get(self, key: str, *, max_bytes: int | None = None, **_: Any) -> tuple[Any, ReadMeta]:
        entry = self.entry(key) if key in self.store else None
        size = 0 if entry is None else _size(entry)
        self._answer(size, max_bytes)
        if key == LOCK and self.lock_changes:
            self.lock_changes -= 1
            self.index[LOCK] += 1  # a run claimed or ended right after
        return entry, ReadMeta(1, True, 0, T)

    def key_names(self, prefix: str, **options: Any) -> tuple[list[str], ReadMeta]:
        names = sorted(key for key in self.store if key.startswith(prefix))
        self._answer(len(json.dumps(names)), options.get("max_bytes"))
        return names, ReadMeta(1, True, 0, T)

    def _answer(self, size: int, cap: int | None) -> None:
        self.sent.append(size if cap is None else min(size, cap + 1))
        if cap is not None and size > cap:
            raise AnswerTooLarge("consul: answer over the cap")


@dataclass
class FakeTxn:
    kv_area: FakeKV

    def kv(self, ops: list[KVOp], *, max_bytes: int | None = None, **_: Any) -> TxnAnswer:
        store, errors, results = self.kv_area.store, [], []
        for index, op in enumerate(ops):
            if op.verb == "check-index" and self.kv_area.index.get(op.key) != op.index:
                errors.append(TxnError(index, "index is stale"))
            elif op.verb == "check-not-exists" and op.key in store:
                errors.append(TxnError(index, "key exists"))
            elif op.verb == "get" and op.key not in store:
                errors.append(TxnError(index, "key doesn't exist"))
            elif op.verb == "get":
                results.append(self.kv_area.entry(op.key))
        size = sum(_size(entry) for entry in results) + 40
        self.kv_area._answer(size, max_bytes)
        if errors:
            return TxnAnswer(False, (), tuple(errors), T)
        return TxnAnswer(True, tuple(results), (), T)


def _size(entry: KVEntry) -> int:
    """What Consul's JSON for the entry weighs: base64 value, key, other fields."""
    return len(base64.b64encode(entry.value or b"")) + len(entry.key) + 120


class FakeConsul:
    def __init__(self, store: dict[str, bytes]) -> None:
        self.kv = FakeKV(dict(store), {key: 7 for key in store})
        self.txn = FakeTxn(self.kv)


def ledger_of(values: dict[int, bytes], *, lock: bool = True) -> tuple[Ledger, FakeConsul]:
    store = {tick_key(LOCK, day(n)): value for n, value in values.items()}
    if lock:
        store[LOCK] = b'{"worker":"w"}'
    consul = FakeConsul(store)
    return Ledger(consul, LOCK), consul  # type: ignore[arg-type]


def test_small_records_come_in_batches_with_the_lock_checked() -> None:
    ledger, consul = ledger_of(dict.fromkeys(range(40), GOOD))
    fetched = ledger.fetch([day(n) for n in range(40)])
    assert [r.tick for r in fetched.records] == [day(n) for n in range(40)]
    assert {r.outcome for r in fetched.records} == {TickOutcome.SUCCEEDED}
    assert fetched.lock_session == "s-1" and fetched.problems == ()
    assert len(consul.kv.sent) == 1 + -(-40 // FETCH_BATCH)  # the lock, then 3 transactions


def test_a_record_over_the_cap_is_named_and_never_read_whole() -> None:
    """500 KB among small records: the batch is cut short, then each record is read on its
    own; the large one is cut short after a few KB, named, and the others are read."""
    values = dict.fromkeys(range(10), GOOD) | {3: b"A" * 500_000}
    ledger, consul = ledger_of(values)
    fetched = ledger.fetch([day(n) for n in range(10)])
    outcomes = {r.tick: r.outcome for r in fetched.records}
    assert outcomes[day(3)] is TickOutcome.UNREADABLE
    assert [o for t, o in outcomes.items() if t != day(3)] == [TickOutcome.SUCCEEDED] * 9
    (problem,) = fetched.problems
    assert problem.line() == (
        f"{tick_key(LOCK, day(3))}: value: more than {RECORD_MAX_BYTES} bytes, over the "
        f"{RECORD_MAX_BYTES}-byte cap of a tick record: not read"
    )
    assert max(consul.kv.sent) < FETCH_BATCH * 6000  # no answer came near 500 KB


def test_a_record_within_the_batch_but_over_its_own_cap_is_not_decoded() -> None:
    ledger, _ = ledger_of({0: GOOD, 1: b'{"format":1,"outcome":"succeeded","p":"' + b"A" * 5000})
    fetched = ledger.fetch([day(0), day(1)])
    assert [r.outcome for r in fetched.records] == [TickOutcome.SUCCEEDED, TickOutcome.UNREADABLE]
    assert [p.why for p in fetched.problems] == [
        f"{5000 + 39} bytes, over the {RECORD_MAX_BYTES}-byte cap of a tick record: not read"
    ]


def test_records_deleted_since_their_names_were_listed_are_left_out() -> None:
    ledger, consul = ledger_of({0: GOOD, 1: GOOD, 2: GOOD})
    del consul.kv.store[tick_key(LOCK, day(1))]  # retention, between the listing and the read
    fetched = ledger.fetch([day(0), day(1), day(2)])
    assert [r.tick for r in fetched.records] == [day(0), day(2)]


def test_no_lock_key_is_a_free_lock() -> None:
    ledger, _ = ledger_of({0: GOOD}, lock=False)
    fetched = ledger.fetch([day(0)])
    assert fetched.lock_session is None and len(fetched.records) == 1


@pytest.mark.parametrize(
    ("changes", "read"), [(1, True), (LOCK_READS - 1, True), (LOCK_READS, False)]
)
def test_a_lock_that_moves_during_the_read_restarts_it_a_few_times(
    changes: int, read: bool
) -> None:
    """The records and the lock's holder must be one moment (else a run that just completed
    looks abandoned): a batch checks the lock's index, and a lock that moved is read again."""
    ledger, consul = ledger_of({0: GOOD})
    consul.kv.lock_changes = changes
    if read:
        assert len(ledger.fetch([day(0)]).records) == 1
    else:
        with pytest.raises(LockMoved, match=r"ledger locks/job/ticks/: the lock key locks/job/"):
            ledger.fetch([day(0)])


def test_more_key_names_than_the_cap_are_refused_naming_the_prefix() -> None:
    names = {n: GOOD for n in range(3)}
    ledger, consul = ledger_of(names)
    assert ledger.tick_names()[0] == {day(0), day(1), day(2)}
    for n in range(200_000):  # far past what history_limit (10,000) keeps
        consul.kv.store[f"locks/job/ticks/junk-{n:06}"] = b""
    with pytest.raises(AnswerTooLarge, match=r"^ledger locks/job/ticks/: key names: more than"):
        ledger.tick_names()


def test_until_stops_after_the_batch_that_satisfies_it() -> None:
    ledger, consul = ledger_of(dict.fromkeys(range(100), GOOD))
    fetched = ledger.fetch([day(n) for n in range(100)], until=lambda read: len(read) >= 20)
    assert len(fetched.records) == 2 * FETCH_BATCH and len(consul.kv.sent) == 3


def test_an_error_while_reading_records_names_the_ledger() -> None:
    """Consul's own message names only `PUT /v1/txn`: the reader adds which ledger."""
    ledger, consul = ledger_of({0: GOOD})

    def failing(ops: list[KVOp], **_: Any) -> TxnAnswer:
        raise ConsulServerError(
            "consul: PUT /v1/txn on x: 500 No cluster leader", status=500, body=""
        )

    consul.txn.kv = failing  # type: ignore[method-assign]
    with pytest.raises(ConsulServerError) as raised:
        ledger.fetch([day(0)])
    assert str(raised.value) == (
        "consul: PUT /v1/txn on x: 500 No cluster leader (reading the records of locks/job/ticks/)"
    )
    assert raised.value.status == 500
