"""The contract's harness: one TickStore, the Clock it lives on, an operator's hand, and a job
of the test's own (a unique name and key prefix); conftest.py makes one for each store:

    memory   MemoryTickStore on a VirtualClock: every wait is virtual, the test takes no time
    consul   ConsulTickStore on the session's real cluster (worker-1's agent, a management
             token) and a SystemClock learning the agent's clock: waits are real

A test reads only what it made, under its own prefix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Protocol

import pytest

from provision.consul import Consul
from provision.ledger.records import TickOutcome, TickRecord
from provision.ledger.store import Claim
from provision.sessions import SessionTerms
from provision.tick.clock import Clock
from provision.tick.store import PLAIN, ClaimTerms, JobKeys, TickStore

TTL = 10.0  # Consul's least
LOCK_DELAY = 2.0  # short, so the real waits are too; long enough to ask within it when loaded
TICK0 = datetime(2020, 3, 1, 12, 0, tzinfo=timezone.utc)  # ticks in the past: never suspect

STORES = [
    pytest.param("memory", id="memory"),
    pytest.param("consul", id="consul", marks=pytest.mark.cluster),
]


def tick(n: int) -> datetime:
    """The test's n-th tick (a minute apart)."""
    return TICK0 + timedelta(minutes=n)


class Operator(Protocol):
    """What an operator's token writes beside the store (pause, trigger): plain KV."""

    def put(self, key: str, value: bytes) -> object: ...

    def delete(self, key: str) -> None: ...


class ConsulOperator:
    def __init__(self, consul: Consul) -> None:
        self.consul = consul

    def put(self, key: str, value: bytes) -> object:
        return self.consul.kv.put(key, value)

    def delete(self, key: str) -> None:
        self.consul.kv.delete(key)


@dataclass
class Harness:
    kind: str  # memory or consul
    store: TickStore
    clock: Clock
    job: JobKeys
    operator: Operator
    later: Callable[[float, Callable[[], None]], object]  # run a callback that many seconds on
    made: list[str] = field(default_factory=list)
    records: dict[datetime, TickRecord] = field(default_factory=dict)  # as last claimed

    def session(self, ttl: float = TTL, lock_delay: float = LOCK_DELAY) -> str:
        terms = SessionTerms(f"contract {self.job.name}", ttl, lock_delay, "release", ttl / 2)
        session_id = self.store.create_session(terms)
        self.made.append(session_id)
        return session_id

    def record(self, at: datetime, session_id: str, worker: str = "w1") -> TickRecord:
        return TickRecord(
            at, TickOutcome.RUNNING, worker=worker, session=session_id, claimed_at=self.clock.wall()
        )

    def claim(self, at: datetime, session_id: str, terms: ClaimTerms = PLAIN) -> Claim:
        record = self.record(at, session_id)
        self.records[at] = record
        return self.store.claim(self.job, record, session_id, b"holder", terms)

    def claimed(self, at: datetime, claim: Claim) -> TickRecord:
        """The record of the last claim of `at` as that claim left it (complete's cas index)."""
        return replace(self.records[at], modify_index=claim.record_index)

    def finished(self, at: datetime, claim: Claim) -> TickRecord:
        """The same record, completed `succeeded`."""
        return self.claimed(at, claim).completed(
            TickOutcome.SUCCEEDED, finished_at=self.clock.wall(), exit_status=0
        )

    def sleep(self, seconds: float) -> None:
        self.clock.sleep_until(self.clock.monotonic() + seconds)
