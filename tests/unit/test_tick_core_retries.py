"""Retries on the tick core (tick/held.py, the rules of tick/retries.py), in virtual time against
the in-memory Consul: a failed attempt is tried again on the same replica, under the same lock
(the same fencing token) and for the same tick, never from the next tick's instant on; the lock
lost or a stop while a retry is waited for ends the run, and the record keeps every attempt."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from provision.ledger.attempts import CUT_BY_NEXT_TICK, CUT_BY_STOP
from provision.ledger.records import TickOutcome, TickRecord
from provision.schedule import parse_schedule
from provision.tick.clock import VirtualClock
from provision.tick.core import CoreJob, Identity, TickCore
from provision.tick.edge import BodyEnd, Note, Run, StopHow
from provision.tick.memory import MemoryTickStore
from provision.tick.store import JobKeys
from provision.timings import JobTimings

START = datetime(2026, 1, 1, tzinfo=timezone.utc)
KEYS = JobKeys("report", "jobs/report/.lock")


def job(retries: int, retry_delay: float) -> CoreJob:
    timings = JobTimings(
        ttl=15.0,
        lock_delay=15.0,
        renew_interval=5.0,
        kill_grace=5.0,
        start_deadline=30.0,
        retries=retries,
        retry_delay=retry_delay,
    )
    return CoreJob(KEYS, parse_schedule("@every 10s"), timings, ("w1",))


class Attempt:
    """One attempt's body: ends with `status` after `duration` (0.5 s), ends at once when told."""

    def __init__(self, clock: VirtualClock, status: int) -> None:
        self.clock, self.status = clock, status
        self.run: Run | None = None
        self.end: BodyEnd | None = None
        self.started_at = 0.0
        self._ended: Callable[[], None] = lambda: None

    @property
    def ending(self) -> BodyEnd | None:
        return self.end

    def start(self, run: Run, ended: Callable[[], None]) -> None:
        self.run, self._ended, self.started_at = run, ended, self.clock.monotonic()
        self.clock.call_later(0.5, lambda: self._finish(self.status))

    def stop(self, how: StopHow) -> None:
        self.clock.call_later(0.0, lambda: self._finish(-15))

    def _finish(self, status: int) -> None:
        if self.end is None:
            self.end = BodyEnd(status)
            self._ended()


@dataclass
class Replica:
    """One core on one clock and store; its bodies exit with `statuses`, one per attempt, then 0."""

    job: CoreJob
    statuses: list[int]
    clock: VirtualClock = field(default_factory=lambda: VirtualClock(START))
    bodies: list[tuple[datetime, Attempt]] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    store: MemoryTickStore = field(init=False)
    core: TickCore = field(init=False)

    def __post_init__(self) -> None:
        self.store = MemoryTickStore(self.clock)
        self.core = TickCore(
            self.store, self.clock, Identity("w1"), [self.job], self._body, self.notes.append
        )
        self.core.start()

    def _body(self, name: str, tick: datetime) -> Attempt:
        status = self.statuses.pop(0) if self.statuses else 0
        made = Attempt(self.clock, status)
        self.bodies.append((tick, made))
        return made

    def of(self, tick: datetime) -> list[Attempt]:
        return [body for t, body in self.bodies if t == tick]

    def record(self, tick: datetime) -> TickRecord | None:
        return self.store.read_tick(self.job.keys, tick)[0]


def test_a_failed_attempt_is_retried_under_the_same_lock_for_the_same_tick() -> None:
    replica = Replica(job(retries=2, retry_delay=1.0), statuses=[1, 3])
    replica.clock.advance(9)
    attempts = replica.of(START)
    assert [a.run.attempt for a in attempts if a.run] == [1, 2, 3]
    assert len({a.run.lock_index for a in attempts if a.run}) == 1  # one claim, one token
    starts = [a.started_at for a in attempts]
    assert all(b - a >= 0.5 + 1.0 for a, b in itertools.pairwise(starts))  # ended, then the delay
    record = replica.record(START)
    assert record is not None
    assert (record.outcome, record.attempts, record.retries_cut) == (
        TickOutcome.SUCCEEDED,
        (1, 3, 0),
        None,
    )
    assert [n.kind for n in replica.notes].count("retry-started") == 2


def test_no_retry_starts_from_the_next_tick_on_and_the_record_says_they_were_cut() -> None:
    replica = Replica(job(retries=5, retry_delay=4.0), statuses=[1] * 10)
    replica.clock.advance(12)
    attempts = replica.of(START)
    assert len(attempts) == 3  # at 0, 4.5, 9: the next would start at 13.5, after tick 10
    assert all(a.started_at < 10.0 for a in attempts)
    record = replica.record(START)
    assert record is not None
    assert (record.outcome, record.attempts, record.retries_cut) == (
        TickOutcome.FAILED,
        (1, 1, 1),
        CUT_BY_NEXT_TICK,
    )
    assert replica.of(START + timedelta(seconds=10))  # the next tick ran, after the last attempt


def test_the_lock_lost_while_a_retry_is_waited_for_ends_the_run_lost() -> None:
    replica = Replica(job(retries=3, retry_delay=6.0), statuses=[1] * 10)
    replica.clock.advance(2)  # the first attempt failed at 0.5; the retry is due at 6.5
    (first,) = replica.of(START)
    assert first.run is not None
    replica.store.destroy_session(first.run.session)  # the lock released, the session gone
    replica.clock.advance(8)
    assert len(replica.of(START)) == 1  # no attempt without the lock
    record = replica.record(START)
    assert record is not None and record.outcome is TickOutcome.LOST
    assert record.attempts == (1,)  # the attempt made, as `lockctl run`'s record keeps it


def test_a_stop_while_a_retry_is_waited_for_ends_the_run_and_cuts_its_retries() -> None:
    replica = Replica(job(retries=3, retry_delay=6.0), statuses=[1] * 10)
    replica.clock.advance(2)
    replica.core.stop()
    replica.clock.advance(10)
    assert len(replica.of(START)) == 1
    record = replica.record(START)
    assert record is not None
    assert (record.outcome, record.attempts, record.retries_cut) == (
        TickOutcome.FAILED,
        (1,),
        CUT_BY_STOP,
    )
    assert not replica.core.runs


def test_the_notes_say_a_retrys_delay_and_a_renewals_round_trip() -> None:
    """What `lockctl run` says with them (retrying's delay_ms, renewed's took_ms): measured
    where they happen, on the core's clock."""
    replica = Replica(job(retries=3, retry_delay=6.0), statuses=[1] * 10)
    replica.clock.advance(6)  # the first attempt failed at 0.5 (retry due at 6.5); renewed at 5
    (retrying,) = [n for n in replica.notes if n.kind == "retrying"]
    assert retrying.seconds == 6.0
    (renewed,) = [n for n in replica.notes if n.kind == "renewed"]
    assert renewed.seconds is not None and renewed.seconds >= 0
    assert renewed.session is not None and renewed.job == ""  # the pool's, no job's


def test_a_fence_says_why_and_how_long_since_the_lock_was_confirmed() -> None:
    replica = Replica(job(retries=3, retry_delay=6.0), statuses=[1] * 10)
    replica.clock.advance(2)  # the first attempt failed at 0.5; the retry is due at 6.5
    (first,) = replica.of(START)
    assert first.run is not None
    replica.store.destroy_session(first.run.session)  # the renewal at 5 finds it gone
    replica.clock.advance(8)
    (fenced,) = [n for n in replica.notes if n.kind == "fenced"]
    assert "session is gone" in fenced.detail and "while waiting for a retry" in fenced.detail
    assert fenced.seconds is not None and fenced.seconds >= 5.0  # confirmed at the claim, at 0
