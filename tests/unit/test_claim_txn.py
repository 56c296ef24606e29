"""The claim transaction's one definition (ledger/store.py ClaimTxn), which Consul's ledger and
the in-memory model both send and read: its operations in order for each of the terms, and
how each answer reads, table-tested."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from provision.consul import TxnAnswer, TxnError
from provision.consul.models import KVEntry
from provision.ledger.records import TickOutcome, TickRecord
from provision.ledger.store import ClaimKeys, ClaimTerms, ClaimTxn
from provision.system.control_keys import PAUSED

TICK = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
PREVIOUS = datetime(2026, 1, 1, 11, 59, tzinfo=timezone.utc)
KEYS = ClaimKeys("jobs/a/ticks/t1", "jobs/a/.lock", "jobs/a/ticks/t0", "lockctl/control/a/")
RECORD = TickRecord(TICK, TickOutcome.RUNNING, worker="w1", session="s1")


def _entry(key: str, value: bytes | None = b"", lock_index: int = 0, index: int = 7) -> KVEntry:
    return KVEntry(key, value, 0, None, lock_index, index, index)


@pytest.mark.parametrize(
    ("keys", "terms", "verbs"),
    [
        (
            ClaimKeys("t", "l"),
            ClaimTerms(),
            ["check-not-exists", "lock", "set", "get"],
        ),
        (
            ClaimKeys("t", "l"),
            ClaimTerms(over=41),
            ["check-index", "lock", "set", "get"],
        ),
        (
            KEYS,
            ClaimTerms(PREVIOUS, trigger=("trig-1", 5)),
            ["check-not-exists", "lock", "set", "get", "get-tree", "get-tree", "cas"],
        ),
    ],
)
def test_the_operations_follow_the_terms(
    keys: ClaimKeys, terms: ClaimTerms, verbs: list[str]
) -> None:
    ops = ClaimTxn(keys, terms).ops(RECORD, b"holder", "s1")
    assert [op.verb for op in ops] == verbs
    assert ops[1].session == "s1" and ops[1].value == b"holder"
    if terms.over:
        assert ops[0].index == terms.over
    if terms.trigger is not None:
        assert (ops[-1].key, ops[-1].value, ops[-1].index) == (keys.taken, b"trig-1", 5)


def _refused(failed_op: int, what: str) -> TxnAnswer:
    return TxnAnswer(False, (), (TxnError(failed_op, what),), None)


@pytest.mark.parametrize(
    ("terms", "answer", "tick_taken", "lock_refusal"),
    [
        (ClaimTerms(PREVIOUS), _refused(0, "key exists"), True, None),
        (ClaimTerms(PREVIOUS), _refused(1, "lock is held"), False, "lock is held"),
        # a manual run: operation 6 is the taken-trigger cas (4 + previous + control)
        (ClaimTerms(PREVIOUS, trigger=("t", 0)), _refused(6, "cas failed"), True, None),
        (ClaimTerms(PREVIOUS), _refused(6, "something else"), False, None),
    ],
)
def test_a_refused_claim_says_why(
    terms: ClaimTerms, answer: TxnAnswer, tick_taken: bool, lock_refusal: str | None
) -> None:
    claim = ClaimTxn(KEYS, terms).read(answer)
    assert not claim.won
    assert (claim.tick_taken, claim.lock_refusal) == (tick_taken, lock_refusal)


@pytest.mark.parametrize(
    ("extra", "previous_recorded", "paused"),
    [
        ((), False, None),
        ((_entry(KEYS.previous or ""),), True, None),
        ((_entry(KEYS.previous or ""), _entry((KEYS.control or "") + PAUSED, None)), True, b""),
    ],
)
def test_a_won_claim_reads_its_tokens_and_what_it_asked(
    extra: tuple[KVEntry, ...], previous_recorded: bool, paused: bytes | None
) -> None:
    results = (_entry(KEYS.tick, index=12), _entry(KEYS.lock, b"holder", 3, 12), *extra)
    claim = ClaimTxn(KEYS, ClaimTerms(PREVIOUS)).read(TxnAnswer(True, results, (), None))
    assert (claim.won, claim.lock_index, claim.lock_modify_index, claim.record_index) == (
        True,
        3,
        12,
        12,
    )
    assert (claim.previous_recorded, claim.paused) == (previous_recorded, paused)
