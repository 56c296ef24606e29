"""The model's own knobs and the facts real Consul cannot be made to show on demand, or only with
waits too long for the suite: tested on MemoryTickStore only (test_tick_store.py shows the rest on
both stores). Each says which of Consul's measured facts (CONSUL_FACTS) it stands for.
"""

from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta

import pytest
from tick_harness import TICK0, tick

from provision.consul import KVOp
from provision.ledger.records import TickOutcome, TickRecord
from provision.sessions import SessionTerms
from provision.tick.clock import SystemClock, VirtualClock
from provision.tick.memory import MemoryTickStore, _size_bound
from provision.tick.store import JobKeys, SessionGone, ValueTooLarge, lock_delayed

pytestmark = pytest.mark.contract
JOB = JobKeys("model", "test/model/.lock")


def _terms(ttl: float = 10.0, lock_delay: float = 1.0) -> SessionTerms:
    return SessionTerms("model", ttl, lock_delay, "release", ttl / 2)


def _claim(store: MemoryTickStore, at: datetime, session: str) -> bool:
    record = TickRecord(at, TickOutcome.RUNNING, worker="w1", session=session)
    return store.claim(JOB, record, session, b"holder").won


def test_a_stale_read_lags_by_the_lag_given() -> None:
    """Consul answered a `?stale` read that missed a write made just before it (measured once;
    not on demand): the model's stale reads see the KV as it was `stale_lag` seconds ago."""
    clock = VirtualClock()
    store = MemoryTickStore(clock, stale_lag=2.0)
    session = store.create_session(_terms())
    assert _claim(store, tick(0), session)
    assert store.read_tick(JOB, tick(0))[0] is not None  # consistent: at once
    assert store.read_tick(JOB, tick(0), stale=True)[0] is None
    assert store.read_ticks(JOB, stale=True) == []
    clock.advance(1.9)
    assert store.read_tick(JOB, tick(0), stale=True)[0] is None
    clock.advance(0.1)
    assert store.read_tick(JOB, tick(0), stale=True)[0] is not None
    assert [r.tick for r in store.read_ticks(JOB, stale=True)] == [tick(0)]
    store.prune(JOB, [tick(0)])
    assert store.read_tick(JOB, tick(0), stale=True)[0] is not None  # the delete lags too
    clock.advance(2.0)
    assert store.read_tick(JOB, tick(0), stale=True)[0] is None


def test_raft_index_costs() -> None:
    """Measured on 1.8.7's leader (commit_index): a losing claim costs one entry whether the
    tick is taken or the lock held; a session's create and destroy one; reads, renewals, the
    destroy of a gone session and a lock refused for lock-delay (refused before Raft, in
    Consul's Txn.preCheck: 0 for 20 calls) none; an oversized body never gets that far (413)."""
    clock = VirtualClock()
    store = MemoryTickStore(clock)
    first, second = store.create_session(_terms()), store.create_session(_terms())
    assert _claim(store, tick(0), first)

    def cost(action: object) -> int:
        before = store.raft_index
        assert callable(action)
        action()
        return store.raft_index - before

    assert cost(lambda: _claim(store, tick(0), second)) == 1  # taken (and held)
    assert cost(lambda: _claim(store, tick(1), second)) == 1  # held
    assert cost(lambda: store.read_tick(JOB, tick(0))) == 0
    assert cost(lambda: store.read_ticks(JOB)) == 0
    assert cost(lambda: store.read_control(JOB)) == 0
    assert cost(lambda: store.watch_lock(JOB, 0, 1.0)) == 0
    assert cost(lambda: store.renew_session(first)) == 0
    assert cost(lambda: store.destroy_session(first)) == 1
    assert cost(lambda: store.destroy_session(first)) == 0  # gone: answered before Raft
    assert cost(lambda: _claim(store, tick(1), second)) == 0  # lock-delay: before Raft
    before = store.raft_index
    with pytest.raises(ValueTooLarge):
        store.claim(JOB, TickRecord(tick(1), TickOutcome.RUNNING), second, b"x" * 400_000)
    assert store.raft_index == before
    assert cost(lambda: store.create_session(_terms())) == 1


@pytest.mark.parametrize("after", [2.0, 1.5, 1.0])
def test_a_session_is_invalidated_exactly_when_told(after: float) -> None:
    """Consul invalidates lazily, between 1 and 2 TTLs after the last renew (measured: 2, in 4
    of 4 runs): the model picks one moment, `invalidate_after` TTLs, and renewals push it."""
    clock = VirtualClock()
    store = MemoryTickStore(clock, invalidate_after=after)
    session = store.create_session(_terms(ttl=10.0, lock_delay=0.0))
    assert _claim(store, tick(0), session)
    clock.advance(5.0)
    store.renew_session(session)  # the moment is now 5 + after x 10
    clock.advance(after * 10.0 - 0.001)
    store.renew_session(session)  # still there: renewed again, from here
    clock.advance(after * 10.0 - 0.001)
    assert store.watch_lock(JOB, 0, 1.0)[0] == session
    clock.advance(0.001)
    assert store.watch_lock(JOB, 0, 1.0)[0] is None
    with pytest.raises(SessionGone):
        store.renew_session(session)


def test_lock_delay_counts_from_the_invalidation_and_is_capped_at_60s() -> None:
    """LockDelay starts when Consul invalidates the session, not when anyone notices; a longer
    one than 60 s is accepted and 60 s of it applies (a real wait too long for the suite)."""
    clock = VirtualClock()
    store = MemoryTickStore(clock)
    session = store.create_session(_terms(ttl=10.0, lock_delay=120.0))
    other = store.create_session(_terms(ttl=3600.0))
    assert _claim(store, tick(0), session)
    clock.advance(20.0 + 59.0)  # invalidated at 20 s, unnoticed until now
    refused = store.claim(JOB, TickRecord(tick(1), TickOutcome.RUNNING), other, b"h")
    assert not refused.won and lock_delayed(refused)
    clock.advance(0.999)
    assert not _claim(store, tick(1), other)
    clock.advance(0.001)
    assert _claim(store, tick(1), other)


def test_a_watch_waits_in_virtual_time_until_a_change_or_its_wait() -> None:
    """A blocking read on a VirtualClock is time passing: it returns when the key changes (here
    when Consul invalidates its holder) or when its wait runs out, never in real time."""
    clock = VirtualClock()
    store = MemoryTickStore(clock)
    session = store.create_session(_terms(ttl=10.0, lock_delay=0.0))
    assert _claim(store, tick(0), session)
    _, index = store.watch_lock(JOB, 0, 30.0)
    started = clock.monotonic()
    assert store.watch_lock(JOB, index, 5.0) == (session, index)
    assert clock.monotonic() == started + 5.0  # the wait ran out
    holder, later = store.watch_lock(JOB, index, 300.0)
    assert holder is None and later > index
    assert clock.monotonic() == started + 20.0  # woken by the invalidation, at 2 x TTL


def test_a_watch_on_the_system_clock_wakes_on_another_threads_write() -> None:
    """The model is safe across threads: on a SystemClock its watch blocks in real time and a
    write from another thread wakes it (no timing asserted: the wait is a generous bound)."""
    store = MemoryTickStore(SystemClock())
    session = store.create_session(_terms(ttl=3600.0))
    assert _claim(store, tick(0), session)
    _, index = store.watch_lock(JOB, 0, 1.0)
    answer: list[tuple[str | None, int]] = []
    watcher = threading.Thread(target=lambda: answer.append(store.watch_lock(JOB, index, 120.0)))
    watcher.start()
    store.destroy_session(session)
    watcher.join(150.0)
    assert answer and answer[0][0] is None and answer[0][1] > index


def test_a_write_that_changes_nothing_keeps_its_modify_index() -> None:
    """Measured: the holder's re-acquire with the same value left ModifyIndex as it was."""
    store = MemoryTickStore(VirtualClock())
    first = store.put("test/model/x", b"a")
    assert store.put("test/model/x", b"a") == first
    assert store.put("test/model/x", b"b") > first


def test_session_ids_are_drawn_from_the_seed() -> None:
    """A simulation's seed replays it exactly, session IDs included."""

    def ids(seed: int) -> list[str]:
        store = MemoryTickStore(VirtualClock(), seed=seed)
        return [store.create_session(_terms()) for _ in range(3)]

    assert ids(7) == ids(7) and ids(7) != ids(8) and len(set(ids(7))) == 3


def test_what_the_model_refuses_to_pretend() -> None:
    clock = VirtualClock()
    with pytest.raises(ValueError, match="between 1 and 2"):
        MemoryTickStore(clock, invalidate_after=2.5)
    with pytest.raises(ValueError, match="never ahead"):
        MemoryTickStore(clock, stale_lag=-1.0)
    store = MemoryTickStore(clock)
    with pytest.raises(ValueError, match="only `release`"):
        store.create_session(SessionTerms("model", 10.0, 1.0, "delete", 5.0))
    with pytest.raises(ValueTooLarge):
        store.put("test/model/big", b"x" * (512 * 1024 + 1))
    store.delete("test/model/absent")  # deleting what is absent is no error


def test_claimed_records_are_dated_on_the_clock() -> None:
    clock = VirtualClock(TICK0)
    store = MemoryTickStore(clock)
    session = store.create_session(_terms(ttl=3600.0))
    record = TickRecord(tick(0), TickOutcome.RUNNING, session=session)
    clock.advance(42.0)
    claim = store.claim(JOB, record, session, b"h")
    assert claim.date == TICK0 + timedelta(seconds=42)
    assert store.read_tick(JOB, tick(0))[1] == TICK0 + timedelta(seconds=42)


@pytest.mark.parametrize(
    "ops",
    [
        [KVOp("set", "k", b"")],
        [KVOp("lock", "a/" + "é" * 40, b"\xff" * 1000, session="s" * 36)],
        [KVOp("cas", "x" * 512, b"\x00" * 7, index=2**63)] * 64,
        [KVOp("check-index", "k", index=0), KVOp("delete", "k"), KVOp("get-tree", "p/")],
        [KVOp("set", "k", "\U0001f600".encode() * 100, session="\U0001f600" * 10)],
    ],
)
def test_the_size_bound_is_never_under_the_body_consul_is_sent(ops: list[KVOp]) -> None:
    """The model encodes a transaction to check Consul's 413 only when a cheap bound says it
    may be over: a bound under the real body would let an oversized one through."""
    body = len(json.dumps([op.to_api() for op in ops]).encode())
    assert body <= _size_bound(ops)
