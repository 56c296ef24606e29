"""Consul's transaction endpoint for KV operations: several operations applied all or none.

What a real Consul 1.8.7 answers (measured; docs/notes/consul-facts.md, "Transactions"):
- applied: 200, `Results` holds one KV entry per operation that returns one (lock, set, cas,
  get, unlock), in order; check-not-exists, check-index and delete return none.
- rolled back: 409, `Errors` lists EVERY operation that failed, each with its OpIndex and a
  text (`key "x" exists`, `failed to lock key "x", lock is already held`, `... due to lock
  delay`, `failed to set key "x", index is stale`, `invalid session "..."`), and nothing applied.
- a token that may not touch a key: 409 too (not 403), an error `Permission denied` per
  operation it may not do. This client raises PermissionDenied for it, like any 403.
- more than 64 operations: 413, before anything is applied.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from provision.consul.batch import MAX_OPERATIONS, TxnBatcher
from provision.consul.errors import PermissionDenied
from provision.consul.keys import checked_key
from provision.consul.models import KVEntry
from provision.consul.transport import DEFAULT_TOKEN, Call, Sending, TokenChoice, Transport
from provision.system.text import printable

READ_VERBS = frozenset({"get", "get-tree", "check-index", "check-session", "check-not-exists"})
ERROR_TEXT_LIMIT = 200
DENIED = "Permission denied"


@dataclass(frozen=True)
class KVOp:
    """One KV operation of a transaction: `verb` as Consul names it (lock, unlock, set, cas,
    get, delete, check-not-exists, ...), with the fields that verb takes."""

    verb: str
    key: str
    value: bytes | None = None
    session: str | None = None
    index: int | None = None

    def to_api(self) -> dict[str, Any]:
        body: dict[str, Any] = {"Verb": self.verb, "Key": self.key}
        if self.value is not None:
            body["Value"] = base64.b64encode(self.value).decode()
        if self.session is not None:
            body["Session"] = self.session
        if self.index is not None:
            body["Index"] = self.index
        return {"KV": body}


@dataclass(frozen=True)
class TxnError:
    op_index: int
    what: str  # Consul's text, bounded and printable


@dataclass(frozen=True)
class TxnAnswer:
    """What a transaction did: applied (with its results) or rolled back (with its errors)."""

    applied: bool
    results: tuple[KVEntry, ...]
    errors: tuple[TxnError, ...]
    date: datetime | None  # the answering agent's clock (HTTP Date)
    headers: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    def failed(self, op_index: int) -> TxnError | None:
        """The error of operation `op_index`, if it failed."""
        return next((error for error in self.errors if error.op_index == op_index), None)

    def entry(self, key: str) -> KVEntry | None:
        """The last result for `key` (a get after a lock reads the key as the lock left it)."""
        return next((entry for entry in reversed(self.results) if entry.key == key), None)


class TxnAPI:
    """`batched`: calls with `batch=True` at the same moment go out merged (batch.py)."""

    def __init__(self, transport: Transport, *, batched: bool = False) -> None:
        self._transport = transport
        self._batcher = TxnBatcher(self._send) if batched else None
        self._readers = TxnBatcher(self._send_read) if batched else None

    @property
    def batched(self) -> bool:
        return self._batcher is not None

    def kv(
        self,
        operations: Sequence[KVOp],
        *,
        token: TokenChoice = DEFAULT_TOKEN,
        urgent: bool = False,
        batch: bool = False,
        max_bytes: int | None = None,
    ) -> TxnAnswer:
        """Apply KV operations atomically. PermissionDenied when the token may not do one.
        `urgent`: ahead of other waiting calls (a tick's claim). `batch`: may share one
        transaction with other calls on other keys, for the same answer. `max_bytes`: the
        answer is read up to that many bytes, else AnswerTooLarge (never batched). PUT /v1/txn"""
        _check(operations)
        if batch and self._batcher is not None and token is DEFAULT_TOKEN and max_bytes is None:
            answer: TxnAnswer = self._batcher.kv(operations, urgent)
        else:
            answer = self._send(operations, urgent, token, max_bytes=max_bytes)
        return self._allowed(answer, operations)

    def read(self, operations: Sequence[KVOp], *, batch: bool = False) -> TxnAnswer:
        """Read-only operations (get, get-tree, check-*) in one transaction, answered by
        whichever server the agent asks (stale: Consul serves a read-only transaction without
        Raft, and lets a follower answer it). `batch`: merged with other reads sent at the same
        moment. PUT /v1/txn?stale"""
        if any(op.verb not in READ_VERBS for op in operations):
            raise ValueError(f"a read-only transaction has only {', '.join(sorted(READ_VERBS))}")
        _check(operations)
        if batch and self._readers is not None:
            answer: TxnAnswer = self._readers.kv(operations, False)
        else:
            answer = self._send_read(operations, False)
        return self._allowed(answer, operations)

    def _allowed(self, answer: TxnAnswer, operations: Sequence[KVOp]) -> TxnAnswer:
        """The answer, or PermissionDenied when the token may not do one of its operations
        (named with its verb and key: an operation's number alone says nothing to a reader)."""
        denied = [error.op_index for error in answer.errors if error.what == DENIED]
        if denied:
            raise PermissionDenied(
                f"consul: PUT /v1/txn on {self._transport.settings.address}: 409 {DENIED} "
                f"({_named(operations, denied)})",
                status=403,
                body=DENIED,
                headers=answer.headers,
            )
        return answer

    def _send_read(self, operations: Sequence[KVOp], urgent: bool) -> TxnAnswer:
        return self._send(operations, urgent, stale=True)

    def _send(
        self,
        operations: Sequence[KVOp],
        urgent: bool,
        token: TokenChoice = DEFAULT_TOKEN,
        *,
        stale: bool = False,
        max_bytes: int | None = None,
    ) -> TxnAnswer:
        """One transaction, as Consul answered it (errors of denied operations included)."""
        answer = self._transport.request(
            Call(
                "PUT",
                "/v1/txn",
                params={"stale": ""} if stale else None,
                json_body=[op.to_api() for op in operations],
                token=token,
                answers=(409,),
                max_bytes=max_bytes,
            ),
            Sending(urgent=urgent, idempotent=stale),
        )
        body = answer.body if isinstance(answer.body, dict) else {}
        errors = tuple(_error(raw) for raw in body.get("Errors") or ())
        results = tuple(
            KVEntry.from_api(raw["KV"]) for raw in body.get("Results") or () if "KV" in raw
        )
        return TxnAnswer(answer.status == 200, results, errors, answer.date, answer.headers)

    def acquire_and_read(
        self, key: str, value: bytes, session_id: str, *, token: TokenChoice = DEFAULT_TOKEN
    ) -> KVEntry | None:
        """Acquire `key` for the session and read it back in ONE transaction (one round trip,
        applied by the leader, so the read is consistent); None when it was refused: the key is
        held or in lock-delay (PermissionDenied when the token may not write it)."""
        operations = [KVOp("lock", key, value, session=session_id), KVOp("get", key)]
        answer = self.kv(operations, token=token)
        return answer.entry(key) if answer.applied else None


def _check(operations: Sequence[KVOp]) -> None:
    if not 0 < len(operations) <= MAX_OPERATIONS:
        raise ValueError(f"a transaction has 1..{MAX_OPERATIONS} operations")
    for op in operations:
        checked_key(op.key)  # a key in the body must be the one a call by path names


def _named(operations: Sequence[KVOp], indexes: list[int]) -> str:
    """`operation 0 (get test/x/ticks/...), 2 (...)`: the first few, keys made printable."""
    shown = []
    for index in indexes[:3]:
        op = operations[index] if 0 <= index < len(operations) else None
        what = "" if op is None else f" ({op.verb} {printable(op.key, 120)})"
        shown.append(f"{index}{what}")
    more = f" and {len(indexes) - 3} more" if len(indexes) > 3 else ""
    return "operation " + ", ".join(shown) + more


def _error(raw: Any) -> TxnError:
    raw = raw if isinstance(raw, dict) else {}
    index = raw.get("OpIndex")
    what = printable(str(raw.get("What", "")), ERROR_TEXT_LIMIT)
    return TxnError(index if isinstance(index, int) else -1, what)
