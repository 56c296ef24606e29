"""The replica's sessions (provision/scheduler/sessions.py) on the real cluster: one per distinct
(TTL, LockDelay) however many jobs' first ticks come at once, renewed while no job runs, and a
lost one fences the jobs holding a lock under it at that moment, and only those.

The jobs are process trees: a shell that starts a child and a TERM-ignoring grandchild."""

from __future__ import annotations

import io
import json
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from procscan import pids_with

from provision.consul import Consul
from provision.consul.models import Session
from provision.ledger.records import TickOutcome
from provision.ledger.store import Ledger
from provision.runner.events import EventLog
from provision.runner.stop import StopRequest
from provision.scheduler.counts import SessionState
from provision.scheduler.exposition import health_verdict
from provision.scheduler.loop import JobTicks
from provision.scheduler.sessions import SessionPool
from provision.scheduler.timer import TickTimer
from provision.timings import JobTimings
from provision.workers.config import JobConfig

if TYPE_CHECKING:
    pass

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("subreaper")]

WORKER = "worker-1"
TIMINGS = JobTimings(ttl=10.0, lock_delay=4.0, renew_interval=1.0, kill_grace=1.0, min_hold=0.0)


@pytest.fixture
def prefix(consul: Consul) -> Iterator[str]:
    prefix = f"test/sessions-{uuid.uuid4().hex[:8]}/"
    yield prefix
    consul.kv.delete(prefix, recurse=True)


def _job(prefix: str, name: str, command: str, timings: JobTimings = TIMINGS) -> JobConfig:
    return JobConfig(
        name,
        f"{prefix}{name}/.lock",
        replace(timings, start_deadline=1.0),
        "@every 1s",
        history_limit=20,
        command=("sh", "-c", command),
    )


def _live(consul: Consul, ids: Iterable[str]) -> list[Session]:
    """Those of the sessions `ids` that Consul still has, each read by its ID."""
    found = (consul.session.info(session_id) for session_id in sorted(set(ids)))
    return [session for session in found if session is not None]


def _ours(consul: Consul, pool: SessionPool) -> list[str]:
    return [s.id for s in _live(consul, pool.sessions)]


def test_jobs_whose_first_ticks_come_together_share_one_session_per_timing_pair(
    consul: Consul, prefix: str
) -> None:
    events = EventLog("lockctl-schedule", WORKER, io.StringIO())
    pool = SessionPool(consul, WORKER, events)
    other = replace(TIMINGS, lock_delay=5.0)
    asked: list[str] = []
    threads = [
        threading.Thread(target=lambda t=t: asked.append(pool.session_for(t)))
        for t in [TIMINGS] * 40 + [other] * 40
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert len(set(asked)) == 2  # one per (TTL, LockDelay), not one per job
        assert len(_ours(consul, pool)) == 2
        made = _live(consul, asked)
        assert {(s.ttl, s.lock_delay_ns) for s in made} == {("10s", 4 * 10**9), ("10s", 5 * 10**9)}
    finally:
        pool.close()
    assert _ours(consul, pool) == [] and _live(consul, asked) == []


def test_a_kept_session_outlives_its_ttl_between_ticks(consul: Consul) -> None:
    """Renewed by the pool's one thread, with no job running to renew it."""
    events = EventLog("lockctl-schedule", WORKER, io.StringIO())
    pool = SessionPool(consul, WORKER, events)
    pool.start()
    try:
        session = pool.session_for(TIMINGS)
        time.sleep(2 * TIMINGS.ttl + 2)  # Consul expires an unrenewed 10s session by 20 s
        assert consul.session.info(session) is not None
    finally:
        pool.close()


def _events(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.startswith("{")]


def test_a_lost_session_fences_the_jobs_holding_a_lock_under_it_and_only_those(
    consul: Consul, prefix: str, tmp_path: Path
) -> None:
    marker = tmp_path / "long.pids"
    # a process tree that holds its lock for long: a child, and a grandchild ignoring SIGTERM
    mark = str(3000 + uuid.uuid4().int % 1000)  # a unique sleep: its processes found in /proc
    long_tree = f'echo $$ >> {marker}; (trap "" TERM; sleep {mark}) & sleep {mark} & wait'
    long_job = _job(prefix, "long", long_tree)
    quick_job = _job(prefix, "quick", "true")
    stop, stream = StopRequest(), io.StringIO()
    scheduler_events = EventLog("lockctl-schedule", WORKER, stream)
    pool = SessionPool(consul, WORKER, scheduler_events)
    pool.start()
    jobs = [
        JobTicks(consul, job, WORKER, EventLog(job.name, WORKER, stream), stop, sessions=pool)
        for job in (long_job, quick_job)
    ]
    timer = TickTimer(jobs, stop)
    thread = threading.Thread(target=timer.run)
    thread.start()
    try:
        deadline = time.time() + 10
        while not marker.exists() and time.time() < deadline:
            time.sleep(0.1)
        assert marker.exists(), stream.getvalue()
        (shared,) = pool.sessions  # both jobs' timings are the same: one session
        time.sleep(1.5 - time.time() % 1)  # mid-second: the quick job's run is usually over
        lost_at = time.time()
        consul.session.destroy(shared)  # what Consul does to a session whose node failed
        time.sleep(4)
    finally:
        stop.request()
        thread.join(30)
        pool.close()
    assert not thread.is_alive()
    assert pids_with(f"sleep {mark}") == []  # the whole fenced tree, the TERM-ignorer too
    seen = _events(stream)
    fenced = [e for e in seen if e["event"] in ("fenced", "lost")]
    assert fenced and long_job.name in {e["job"] for e in fenced}, fenced
    long_records = Ledger(consul, long_job.lock_key).records()
    assert [r.outcome for r in long_records] == [TickOutcome.LOST]
    # the other job lost a run only if it held its lock at that moment (a loaded machine can
    # stretch its `true` to the middle of the second): claimed before, never after
    quick = Ledger(consul, quick_job.lock_key).records()
    quick_lost = [r for r in quick if r.outcome is TickOutcome.LOST]
    assert len(quick_lost) <= 1, quick
    assert all(r.claimed_at and r.claimed_at.timestamp() < lost_at for r in quick_lost), quick
    # and runs on under a new session
    after = [r for r in quick if r.claimed_at and r.claimed_at.timestamp() > lost_at + 0.5]
    assert len(after) >= 2 and all(r.outcome is TickOutcome.SUCCEEDED for r in after), quick
    assert {r.session for r in after} - {shared}  # a new session
    created = [e for e in seen if e["event"] == "session-created"]
    assert len(created) >= 2  # the first, and the one made after the loss


def test_a_lost_shared_session_is_counted_by_the_loops_holding_locks_under_it_only(
    consul: Consul, prefix: str
) -> None:
    """The pool's renewer finds the session gone: the job loops under it say so in their
    counts (what /healthz reads), the loop under the other timings' session does not. Before,
    the news went to the scheduler's own events only, and /healthz never showed it."""
    now = [1000.0]
    pool = SessionPool(consul, WORKER, EventLog("lockctl-schedule", WORKER), clock=lambda: now[0])
    other = replace(TIMINGS, lock_delay=2.0)
    jobs = [_job(prefix, "a", "true"), _job(prefix, "b", "true"), _job(prefix, "c", "true", other)]
    loops = [JobTicks(consul, job, WORKER, EventLog(job.name, WORKER), StopRequest(), sessions=pool)
             for job in jobs]  # fmt: skip
    try:
        for loop in loops:
            loop._ensure_session()  # what each loop's first tick does before its claim
        assert {loop.counts.snapshot().session for loop in loops} == {SessionState.VALID}
        lost = loops[0]._session_id
        assert lost is not None and lost == loops[1]._session_id != loops[2]._session_id
        consul.session.destroy(lost)  # as Consul does when the node fails its check
        now[0] += TIMINGS.renew_interval  # renewals due
        pool.renew_due()
        states = [loop.counts.snapshot().session for loop in loops]
        assert states == [SessionState.LOST, SessionState.LOST, SessionState.VALID]
        verdict = health_verdict([(loop.job.name, loop.counts.snapshot()) for loop in loops])
        assert verdict.status == 503 and "session was lost" in verdict.text, verdict
    finally:
        pool.close()
