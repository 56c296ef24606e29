"""consul/batch.py: concurrent transactions merged, each caller getting its own answer.

Against a small in-memory stand-in for Consul's transaction semantics (apply in order, all or
none, every failed operation listed) so that the merging can be driven deterministically: the
first send is held until the other calls have queued. The same merging against a real cluster:
tests/integration/test_txn_batch.py."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence

import pytest

from provision.consul.batch import MAX_OPERATIONS, TxnBatcher, _Call
from provision.consul.errors import ConsulHTTPError, ConsulUnavailable
from provision.consul.models import KVEntry
from provision.consul.txn import KVOp, TxnAnswer, TxnError


class FakeTxns:
    """Consul's transaction semantics for the verbs the ledger uses; counts the requests."""

    def __init__(self) -> None:
        self.store: dict[str, bytes] = {}
        self.sent: list[int] = []  # operations per request
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Event()
        self.refuse_merged_with: int | None = None  # a 413 for any request this long or longer
        self.down = False
        self.delay = 0.0  # seconds each request takes: senders' batches then overlap

    def send(self, ops: Sequence[KVOp], urgent: bool) -> TxnAnswer:
        self.entered.set()
        self.hold.wait(5)
        time.sleep(self.delay)
        self.sent.append(len(ops))
        if self.down:
            raise ConsulUnavailable("consul: unreachable (a test)")
        if self.refuse_merged_with is not None and len(ops) >= self.refuse_merged_with:
            raise ConsulHTTPError("consul: 413 (a test)", status=413, body="too large")
        store, results, errors = dict(self.store), [], []
        for i, op in enumerate(ops):
            if op.verb == "check-not-exists" and op.key in store:
                errors.append(TxnError(i, f'key "{op.key}" exists'))
            elif op.verb == "set":
                store[op.key] = op.value or b""
                results.append(_entry(op.key, store[op.key]))
            elif op.verb == "get":
                if op.key in store:
                    results.append(_entry(op.key, store[op.key]))
                else:
                    errors.append(TxnError(i, f'key "{op.key}" doesn\'t exist'))
            elif op.verb == "get-tree":
                results += [_entry(k, v) for k, v in sorted(store.items()) if k.startswith(op.key)]
        if errors:
            return TxnAnswer(False, (), tuple(errors), None)
        self.store = store
        return TxnAnswer(True, tuple(results), (), None)


def _entry(key: str, value: bytes) -> KVEntry:
    return KVEntry(key, value, 0, None, 0, 1, 1)


def claim(tick: str) -> list[KVOp]:
    key = f"jobs/{tick}"
    return [KVOp("check-not-exists", key), KVOp("set", key, tick.encode()), KVOp("get", key)]


def run_together(batcher: TxnBatcher, fake: FakeTxns, calls: list[list[KVOp]]) -> list[object]:
    """The first call's send is held until every other call has queued behind it."""
    fake.hold.clear()
    answers: list[object] = [None] * len(calls)

    def one(i: int) -> None:
        try:
            answers[i] = batcher.kv(calls[i], urgent=False)
        except Exception as exc:  # the test looks at what each caller got
            answers[i] = exc

    threads = [threading.Thread(target=one, args=(0,))]
    threads[0].start()
    assert fake.entered.wait(5)
    for i in range(1, len(calls)):
        threads.append(threading.Thread(target=one, args=(i,)))
        threads[-1].start()
    time.sleep(0.2)  # the others are queued (nothing can answer them while the send is held)
    fake.hold.set()
    for thread in threads:
        thread.join(10)
    return answers


def test_a_lone_call_goes_out_as_it_is() -> None:
    fake = FakeTxns()
    answer = TxnBatcher(fake.send).kv(claim("t1"), urgent=True)
    assert answer.applied and [e.key for e in answer.results] == ["jobs/t1", "jobs/t1"]
    assert fake.sent == [3]


def test_calls_queued_behind_a_send_go_out_merged_each_with_its_own_results() -> None:
    fake = FakeTxns()
    calls = [claim(f"t{i}") for i in range(13)]
    answers = run_together(TxnBatcher(fake.send, senders=1), fake, calls)
    assert fake.sent == [3, 36]  # the first alone, the next twelve in one (64 operations at most)
    for i, answer in enumerate(answers):
        assert isinstance(answer, TxnAnswer) and answer.applied
        assert {entry.key for entry in answer.results} == {f"jobs/t{i}"}
        assert answer.results[-1].value == f"t{i}".encode()


def test_no_transaction_holds_more_than_consuls_limit() -> None:
    fake = FakeTxns()
    answers = run_together(
        TxnBatcher(fake.send, senders=1), fake, [claim(f"t{i}") for i in range(60)]
    )
    assert all(isinstance(a, TxnAnswer) and a.applied for a in answers)
    assert max(fake.sent) <= MAX_OPERATIONS and sum(fake.sent) == 180
    assert len(fake.sent) < 60


def test_a_failed_call_gets_its_own_errors_and_the_others_go_again() -> None:
    fake = FakeTxns()
    fake.store["jobs/t2"] = b"taken"  # t2's check-not-exists fails
    answers = run_together(
        TxnBatcher(fake.send, senders=1), fake, [claim(f"t{i}") for i in range(5)]
    )
    taken = answers[2]
    assert isinstance(taken, TxnAnswer) and not taken.applied
    assert taken.failed(0) is not None and taken.failed(0).what == 'key "jobs/t2" exists'
    assert [error.op_index for error in taken.errors] == [0]  # numbered as in its own list
    for i in (0, 1, 3, 4):
        answer = answers[i]
        assert isinstance(answer, TxnAnswer) and answer.applied, i
        assert fake.store[f"jobs/t{i}"] == f"t{i}".encode()
    assert fake.store["jobs/t2"] == b"taken"
    assert fake.sent == [3, 12, 9]  # t0 alone; t1-t4 rolled back by t2; t1, t3, t4 again


def test_calls_on_a_common_key_never_share_a_transaction() -> None:
    fake = FakeTxns()
    calls = [claim("same"), claim("same"), [KVOp("get-tree", "jobs/sa")], claim("other")]
    answers = run_together(TxnBatcher(fake.send, senders=1), fake, calls)
    applied = [isinstance(a, TxnAnswer) and a.applied for a in answers]
    assert applied[:2] == [True, False]  # the second claim of the same tick is refused
    assert answers[1].failed(0) is not None
    tree = answers[2]
    assert isinstance(tree, TxnAnswer) and [e.key for e in tree.results] == ["jobs/same"]
    assert applied[3]


def test_a_request_refused_whole_sends_each_call_on_its_own() -> None:
    fake = FakeTxns()
    fake.refuse_merged_with = 6  # any merged request of two claims or more
    answers = run_together(
        TxnBatcher(fake.send, senders=1), fake, [claim(f"t{i}") for i in range(4)]
    )
    assert all(isinstance(a, TxnAnswer) and a.applied for a in answers)
    assert fake.sent == [3, 9, 3, 3, 3]


def test_an_unreachable_consul_is_every_merged_callers_error() -> None:
    fake = FakeTxns()
    fake.down = True
    answers = run_together(
        TxnBatcher(fake.send, senders=1), fake, [claim(f"t{i}") for i in range(4)]
    )
    assert all(isinstance(a, ConsulUnavailable) for a in answers)
    assert len(fake.sent) == 2


def test_urgent_calls_are_taken_first() -> None:
    fake = FakeTxns()
    batcher = TxnBatcher(fake.send, senders=1)
    fake.hold.clear()
    order: list[str] = []
    big = [KVOp("set", f"big/{i}", b"x") for i in range(62)]  # no room for a claim beside it

    def one(name: str, ops: list[KVOp], urgent: bool) -> None:
        batcher.kv(ops, urgent=urgent)
        order.append(name)

    first = threading.Thread(target=one, args=("first", claim("t0"), False))
    first.start()
    assert fake.entered.wait(5)
    slow = threading.Thread(target=one, args=("bulk", big, False))
    slow.start()
    time.sleep(0.1)
    quick = threading.Thread(target=one, args=("claim", claim("t1"), True))
    quick.start()
    time.sleep(0.1)
    fake.hold.set()
    for thread in (first, slow, quick):
        thread.join(10)
    assert fake.sent == [3, 3, 62]  # the urgent claim came last and went first
    assert sorted(order) == ["bulk", "claim", "first"]


@pytest.mark.parametrize("senders", [1, 2, 4, 8])
def test_many_threads_each_get_their_own_answer(senders: int) -> None:
    fake = FakeTxns()
    fake.delay = 0.003
    batcher = TxnBatcher(fake.send, senders=senders)
    answers: dict[int, TxnAnswer] = {}

    def one(i: int) -> None:
        answers[i] = batcher.kv(claim(f"t{i % 50}"), urgent=i % 3 == 0)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(200)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert len(answers) == 200
    assert batcher._sending == 0  # every sender's turn given back: none lost on the way
    won = [i for i, answer in answers.items() if answer.applied]
    assert sorted(i % 50 for i in won) == list(range(50))  # each tick claimed exactly once
    for answer in answers.values():
        if not answer.applied:
            assert [e.op_index for e in answer.errors] == [0]


def _memberwise(queue: list[_Call]) -> list[_Call]:
    """_take's rule as it was written first: a call joins when it touches no member."""
    first, *rest = queue
    batch, ops = [first], len(first.ops)
    for call in rest:
        fits = ops + len(call.ops) <= MAX_OPERATIONS
        if fits and not any(call.touches(member) for member in batch):
            batch.append(call)
            ops += len(call.ops)
    return batch


@pytest.mark.parametrize("seed", range(40))
def test_a_batch_is_chosen_by_the_union_of_its_keys_as_by_each_member(seed: int) -> None:
    """_take tests each waiting call against the union of the batch's keys and prefixes: the
    same batches as a test against each member, on keys that overlap by name and by prefix."""
    rng = random.Random(seed)
    names = ["a", "a/b", "a/b/c", "a/c", "b", "b/a", "ab"]
    queue = []
    for _ in range(rng.randint(2, 40)):
        ops = [
            KVOp(rng.choice(["get", "set", "check-not-exists", "get-tree"]), rng.choice(names))
            for _ in range(rng.randint(1, 6))
        ]
        queue.append(_Call(ops, urgent=False))
    batcher = TxnBatcher(FakeTxns().send)
    batcher._others.extend(queue)
    assert [id(call) for call in batcher._take()] == [id(call) for call in _memberwise(queue)]
