"""Claims and completions merged into shared transactions (consul/batch.py), on the real
cluster: 60 jobs claim their tick at the same moment through one batched client (as a scheduler's
jobs do at :00), some of the ticks taken already and one job's lock held by another session;
each caller gets the answer its own transaction would have had, and Consul saw fewer
transactions than claims."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.conftest import LiveCluster

from provision.consul import Consul
from provision.ledger.records import TickOutcome, TickRecord
from provision.ledger.store import Claim, ClaimTerms, Ledger
from provision.system.deadline import Deadline, attempts

TICK = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)
JOBS = 60


@pytest.fixture
def batched(consul: Consul) -> Consul:
    return Consul(consul.settings, pool_size=16, max_in_flight=16, batch_txns=True)


def at_once(client: Consul, work: Callable[[int], None], calls: Iterable[int]) -> int:
    """`work(i)` for each i, every one in its own thread, all released together; how many
    requests `client` sent for them."""
    calls = list(calls)
    start = threading.Barrier(len(calls))

    def one(i: int) -> None:
        start.wait()
        work(i)

    sent_before = client.requests_sent
    threads = [threading.Thread(target=one, args=(i,)) for i in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return client.requests_sent - sent_before


def record(worker: str) -> TickRecord:
    return TickRecord(TICK, TickOutcome.RUNNING, worker=worker, claimed_at=TICK)


def test_claims_at_once_share_transactions_and_each_gets_its_own_answer(
    consul: Consul, batched: Consul
) -> None:
    root = f"test/batch-{uuid.uuid4().hex[:8]}"
    ledgers = [Ledger(batched, f"{root}/job-{i:02d}/lock") for i in range(JOBS)]
    mine = batched.session.create(name="batch-test", ttl=30, lock_delay=0)
    other = consul.session.create(name="batch-test-other", ttl=30, lock_delay=0)
    try:
        taken = set(range(0, JOBS, 7))  # another worker claimed these ticks already
        for i in taken:
            assert Ledger(consul, ledgers[i].lock_key).claim(record("worker-2"), b"w2", other).won
        held = 5  # this job's lock is held by the other session, its tick not claimed
        assert consul.kv.put(ledgers[held].lock_key, b"w2", acquire=other)

        claims: dict[int, Claim] = {}

        def claim(i: int) -> None:
            claims[i] = ledgers[i].claim(record("worker-1"), b"w1", mine, ClaimTerms(TICK))

        sent = at_once(batched, claim, range(JOBS))

        assert len(claims) == JOBS
        for i, answer in claims.items():
            if i in taken:
                assert not answer.won and answer.tick_taken, i
            elif i == held:
                assert not answer.won and not answer.tick_taken, i
                assert answer.lock_refusal and "already held" in answer.lock_refusal
            else:
                assert answer.won and answer.lock_index == 1, i
                assert answer.previous_recorded is True  # its own record, in its own results
                entry, _ = consul.kv.get(ledgers[i].lock_key)
                assert entry is not None and entry.session == mine
        assert sent < JOBS  # merged: at most 12 claims per transaction

        # the completions of the runs that won, at once too: each releases only its own lock
        won = [i for i, answer in claims.items() if answer.won]
        done: dict[int, bool] = {}

        def complete(i: int) -> None:
            finished = TickRecord(
                TICK,
                TickOutcome.SUCCEEDED,
                worker="worker-1",
                modify_index=claims[i].record_index,
                finished_at=TICK,
            )
            done[i] = ledgers[i].complete(finished, mine, release=True).recorded

        at_once(batched, complete, won)
        assert done == {i: True for i in won}
        for i in won:
            entry, _ = consul.kv.get(ledgers[i].lock_key)
            assert entry is not None and entry.session is None
            (written,) = [r for r in Ledger(consul, ledgers[i].lock_key).records()]
            assert written.outcome is TickOutcome.SUCCEEDED
        entry, _ = consul.kv.get(ledgers[held].lock_key)
        assert entry is not None and entry.session == other  # never touched
    finally:
        consul.session.destroy(mine)
        consul.session.destroy(other)
        consul.kv.delete(root, recurse=True)


def test_reads_before_claims_are_merged_read_only_transactions(
    consul: Consul, batched: Consul, live_cluster: LiveCluster
) -> None:
    """A scheduler's reads of tick records (ranks after the first, before claiming): stale
    read-only transactions, merged, each reader getting its own record or None."""
    root = f"test/batch-read-{uuid.uuid4().hex[:8]}"
    ledgers = [Ledger(batched, f"{root}/job-{i:02d}/lock") for i in range(JOBS)]
    session = consul.session.create(name="batch-read-test", ttl=30, lock_delay=0)
    try:
        claimed = set(range(0, JOBS, 3))
        for i in claimed:
            won = Ledger(consul, ledgers[i].lock_key).claim(record(f"w{i}"), b"w", session)
            assert won.won
            assert (
                Ledger(consul, ledgers[i].lock_key)
                .complete(
                    TickRecord(
                        TICK,
                        TickOutcome.SUCCEEDED,
                        worker=f"w{i}",
                        modify_index=won.record_index,
                        finished_at=TICK,
                    ),
                    session,
                    release=True,
                )
                .recorded
            )
        # A stale read may be answered by a follower that has not applied the last writes yet:
        # wait until every server has (each applies the log in order), then read.
        last = Ledger(consul, ledgers[max(claimed)].lock_key).key(TICK)
        for server in ("server-1", "server-2", "server-3"):
            direct = live_cluster.management(server)
            for _ in attempts(Deadline(10), 0.05):
                entry, _meta = direct.kv.get(last, consistency="stale")
                if entry is not None and b"succeeded" in (entry.value or b""):
                    break
            else:
                raise AssertionError(f"{server} never applied the last completion")
        found: dict[int, object] = {}

        def read(i: int) -> None:
            found[i] = ledgers[i].read(TICK, stale=True)

        assert at_once(batched, read, range(JOBS)) < JOBS
        for i in range(JOBS):
            got, date = found[i]  # type: ignore[misc]
            assert date is not None  # the agent's clock, for the clock check
            if i in claimed:
                assert got is not None and got.worker == f"w{i}", i
                assert got.outcome is TickOutcome.SUCCEEDED
            else:
                assert got is None, i
    finally:
        consul.session.destroy(session)
        consul.kv.delete(root, recurse=True)
