"""Group commit: transactions that many threads send at the same moment, merged into fewer.

When 300 jobs tick at once, a scheduler sends 100 claims in the same few milliseconds, and
Consul's cost is per transaction (an HTTP request, an RPC to the leader, a Raft entry), not per
operation. So the calls that ask for it (`TxnAPI.kv(batch=True)`: claims, completions) queue
here, and whoever finds a free sender sends everything queued that fits in one transaction:

    a lone call         goes out at once, as it is (nothing waits for company)
    calls at once       up to MAX_OPERATIONS operations, MAX_BATCH_BYTES of values, calls on
                        disjoint keys only, in one transaction; each caller gets the answer its
                        own operations would have had
    a rollback          each failed operation belongs to one call: those calls get their errors
                        (what they would have got alone: their keys are nobody else's, and Consul
                        lists every operation that fails), the others are sent again
    Consul refuses the request itself (400, 413): each call is sent again on its own

Merging keeps each call's meaning because the calls share no key: inside a transaction Consul
applies the operations in order, so an operation sees only what the earlier operations on its
own keys did, exactly as when its call goes alone.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from provision.consul.errors import ConsulHTTPError

MAX_OPERATIONS = 64  # Consul's limit per transaction
MAX_BATCH_BYTES = 256 * 1024  # of values, half of Consul's default txn_max_req_len (base64)
SENDERS = 8  # merged transactions in flight at once
PREFIX_VERBS = frozenset({"get-tree", "delete-tree"})  # operations on every key under a prefix

# The sender of one transaction: (operations, urgent) -> its TxnAnswer (txn.py). The batcher
# builds each caller's answer from the merged one with dataclasses.replace, so it needs no
# import of txn.py (which imports this module).
Send = Callable[[Sequence[Any], bool], Any]


@dataclass
class _Call:
    ops: Sequence[Any]  # KVOp
    urgent: bool
    alone: bool = False  # to be sent on its own (a merged request Consul refused as a whole)
    done: bool = False
    send: bool = False  # handed a sender's turn by the sender before it
    answer: Any = None
    error: BaseException | None = None
    exact: set[str] = field(default_factory=set)
    prefixes: set[str] = field(default_factory=set)
    value_bytes: int = 0
    # set when answered or handed a sender's turn: one waiter woken, not all of them
    wake: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        for op in self.ops:
            (self.prefixes if op.verb in PREFIX_VERBS else self.exact).add(op.key)
        self.value_bytes = sum(len(op.value or b"") for op in self.ops)

    def owns(self, key: str) -> bool:
        return key in self.exact or any(key.startswith(prefix) for prefix in self.prefixes)

    def touches(self, other: _Call) -> bool:
        """Whether the two calls could read or write a common key."""
        return (
            bool(self.exact & other.exact)
            or any(other.owns(key) for key in self.exact)
            or any(self.owns(key) for key in other.exact)
            or any(
                a.startswith(b) or b.startswith(a) for a in self.prefixes for b in other.prefixes
            )
        )


class TxnBatcher:
    """Merges concurrent transactions on disjoint keys; see the module's docs.

    No thread of its own: a caller that finds a sender's turn free sends what is queued, and
    once its own call is answered hands the turn to the oldest waiting caller, if any."""

    def __init__(self, send: Send, *, senders: int = SENDERS) -> None:
        self._send = send
        self._senders = max(senders, 1)
        self._sending = 0
        self._urgent: deque[_Call] = deque()
        self._others: deque[_Call] = deque()
        self._lock = threading.Lock()

    def kv(self, ops: Sequence[Any], urgent: bool) -> Any:
        """Send `ops` as one transaction, maybe merged with others: the answer they would have
        had on their own."""
        mine = _Call(ops, urgent)
        with self._lock:
            (self._urgent if urgent else self._others).append(mine)
            sender = self._sending < self._senders
            if sender:
                self._sending += 1
        while True:
            if sender:  # ends with the turn passed on, ours answered or in another's batch
                self._send_until_answered(mine)
            with self._lock:
                # a turn handed to a call that another sender answered meanwhile is still a
                # turn: take it, to pass it on
                sender, mine.send = mine.send, False
                if not sender:
                    if mine.done:
                        break
                    mine.wake.clear()
            if not sender:
                mine.wake.wait()
        if mine.error is not None:
            raise mine.error
        return mine.answer

    def _send_until_answered(self, mine: _Call) -> None:
        """A sender's turn: send batches until `mine` is answered, then pass the turn on."""
        while True:
            with self._lock:
                if mine.done or not (self._urgent or self._others):
                    self._pass_turn()
                    return
                batch = self._take()
            try:
                self._deliver(batch)
            except BaseException as exc:  # a bug here must not leave a caller waiting for ever
                self._fail([call for call in batch if not call.done], exc)

    def _pass_turn(self) -> None:
        """With the lock held: the oldest waiting call sends next, or the turn is free."""
        for queue in (self._urgent, self._others):
            for call in queue:
                if not call.send:  # one turn per call: a second would be lost with it
                    call.send = True
                    call.wake.set()
                    return
        self._sending -= 1

    def _take(self) -> list[_Call]:
        """With the lock held: the oldest waiting call (urgent ones first) and every later one
        that fits with it."""
        first = (self._urgent or self._others).popleft()
        batch, ops, size = [first], len(first.ops), first.value_bytes
        if first.alone:
            return batch
        # every key and prefix of the batch so far: a call touches one of its members if and
        # only if it touches their union (each test of `touches` is an "any" over members)
        taken = _Call((), first.urgent, exact=set(first.exact), prefixes=set(first.prefixes))
        for queue in (self._urgent, self._others):
            for call in list(queue):
                fits = ops + len(call.ops) <= MAX_OPERATIONS
                fits = fits and size + call.value_bytes <= MAX_BATCH_BYTES and not call.alone
                if fits and not call.touches(taken):
                    queue.remove(call)
                    batch.append(call)
                    ops, size = ops + len(call.ops), size + call.value_bytes
                    taken.exact |= call.exact
                    taken.prefixes |= call.prefixes
        return batch

    def _deliver(self, batch: list[_Call]) -> None:
        """Send the batch; answer each call or put it back in the queue."""
        merged = [op for call in batch for op in call.ops]
        try:
            answer = self._send(merged, any(call.urgent for call in batch))
        except ConsulHTTPError as exc:
            if len(batch) > 1 and exc.status in (400, 413):
                self._again(batch, alone=True)
            else:
                self._fail(batch, exc)
            return
        except BaseException as exc:  # unreachable Consul, a timeout: every caller's error
            self._fail(batch, exc)
            return
        if len(batch) == 1:
            self._answer(batch[0], answer)
        elif answer.applied:
            for call in batch:
                own = tuple(entry for entry in answer.results if call.owns(entry.key))
                self._answer(call, dataclasses.replace(answer, results=own))
        else:
            self._split_rollback(batch, answer)

    def _split_rollback(self, batch: list[_Call], answer: Any) -> None:
        """Each failed operation's call gets its errors (numbered as in its own list); the calls
        that failed nowhere were rolled back for the others' sake and go again."""
        failed: dict[int, list[Any]] = {}
        start = 0
        for i, call in enumerate(batch):
            for error in answer.errors:
                if start <= error.op_index < start + len(call.ops):
                    own = dataclasses.replace(error, op_index=error.op_index - start)
                    failed.setdefault(i, []).append(own)
            start += len(call.ops)
        if not failed:  # errors that name no operation: nothing to tell apart, each alone
            self._again(batch, alone=True)
            return
        for i, call in enumerate(batch):
            if i in failed:
                self._answer(call, dataclasses.replace(answer, errors=tuple(failed[i])))
        self._again([call for i, call in enumerate(batch) if i not in failed], alone=False)

    def _again(self, calls: list[_Call], *, alone: bool) -> None:
        with self._lock:
            for call in reversed(calls):  # ahead of the calls that came later
                call.alone = call.alone or alone
                (self._urgent if call.urgent else self._others).appendleft(call)

    def _answer(self, call: _Call, answer: Any) -> None:
        with self._lock:
            call.answer, call.done = answer, True
        call.wake.set()

    def _fail(self, batch: list[_Call], exc: BaseException) -> None:
        with self._lock:
            for call in batch:
                call.error, call.done = exc, True
        for call in batch:
            call.wake.set()
