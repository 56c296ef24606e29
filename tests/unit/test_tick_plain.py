"""A plain lock (tick/plain.py: `lockctl run` of a job without a schedule) on the tick core's
pieces, in virtual time (MemoryTickStore + VirtualClock): the acquire or the skip, --wait's
hand-over, the lost lock fenced, min-hold, the job's timeout, a stop; no ledger record ever."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tick_fleet import START, TIMINGS, Body

from provision.consul import ConsulUnavailable
from provision.ledger.records import TickOutcome
from provision.ledger.store import Claim, Completion
from provision.sessions import SessionTerms
from provision.tick.clock import VirtualClock
from provision.tick.core import Identity
from provision.tick.edge import Note, SkipReason, StopHow
from provision.tick.memory import MemoryTickStore
from provision.tick.plain import PlainJob, PlainLock, await_turn, plain_session_name
from provision.tick.store import JobKeys

KEYS = JobKeys("backup", "jobs/backup/.lock")
FENCE_AFTER = 9.0  # fence_bounds(TIMINGS, 2.5): 15 - 5 - 1


class Plain:
    """One plain lock on a virtual clock and an in-memory Consul; its bodies and notes kept."""

    def __init__(
        self,
        store: MemoryTickStore | None = None,
        clock: VirtualClock | None = None,
        duration: float | None = 2.0,
        worker: str = "w1",
        ignores_term: bool = False,
        **timings: float,
    ) -> None:
        self.clock = VirtualClock(START) if clock is None else clock
        self.store = MemoryTickStore(self.clock) if store is None else store
        self.bodies: list[Body] = []
        self.notes: list[tuple[float, Note]] = []
        self.duration, self.ignores_term = duration, ignores_term
        job = PlainJob(KEYS, replace(TIMINGS, **timings))
        self.lock = PlainLock(self.store, self.clock, Identity(worker), job, self.body, self.hear)

    def body(self) -> Body:
        made = Body(self.clock, self.duration, self.ignores_term)
        self.bodies.append(made)
        return made

    def hear(self, note: Note) -> None:
        self.notes.append((self.clock.monotonic(), note))

    def kinds(self) -> list[str]:
        return [note.kind for _, note in self.notes if note.job]

    def until_quiet(self, within: float = 600.0) -> None:
        deadline = self.clock.monotonic() + within
        while not self.lock.quiet.is_set():
            assert self.clock.monotonic() < deadline, "the plain lock never went quiet"
            self.clock.advance(0.25)


def holder_of(store: MemoryTickStore) -> str | None:
    return store.watch_lock(KEYS, 0, 0.0)[0]


def held_elsewhere(plain: Plain, release_at: float | None = None) -> str:
    """Another worker's session holds the lock (a TTL that outlasts the test), and lets it go
    at `release_at` when given."""
    other = plain.store.create_session(SessionTerms("w2", 86400.0, 15.0, "release", 5.0))
    assert plain.store.acquire_lock(KEYS, other, b"w2").won
    if release_at is not None:
        plain.clock.call_at(release_at, lambda: plain.store.release_lock(KEYS, other))
    return other


def test_a_free_lock_is_acquired_the_body_runs_and_the_lock_is_released_without_a_record() -> None:
    plain = Plain()
    plain.lock.acquire()
    assert holder_of(plain.store) == plain.lock.session
    (body,) = plain.bodies
    assert body.run is not None and body.run.lock_index == 1
    plain.until_quiet()
    done = plain.lock.completed
    assert done is not None and done.outcome is TickOutcome.SUCCEEDED and done.exit_status == 0
    assert holder_of(plain.store) is None
    assert plain.store.read_ticks(KEYS) == []  # nothing in the ledger, ever
    assert plain.kinds() == ["claimed", "completed"]


def test_the_session_is_a_plain_locks_and_destroyed_by_the_stop_after_the_run() -> None:
    plain = Plain()
    plain.lock.acquire()
    session = plain.lock.session
    assert session is not None
    terms = next(n.terms for _, n in plain.notes if n.kind == "session-created")
    assert terms is not None and terms.name == plain_session_name("backup", "w1")
    plain.until_quiet()
    plain.lock.stop()
    with pytest.raises(Exception, match="gone"):
        plain.store.renew_session(session)


def test_a_lock_held_by_another_session_is_skipped_and_no_body_starts() -> None:
    plain = Plain()
    held_elsewhere(plain)
    plain.lock.acquire()
    assert plain.lock.quiet.is_set() and plain.bodies == [] and plain.lock.held is None
    assert plain.lock.refusal is not None and not plain.lock.refusal.won
    (skipped,) = [n for _, n in plain.notes if n.kind == "skipped"]
    assert skipped.skip is SkipReason.OTHER


def test_a_lock_in_lock_delay_is_skipped_as_such() -> None:
    plain = Plain()
    other = held_elsewhere(plain)
    plain.store.destroy_session(other)  # its holder died: lock-delay
    plain.lock.acquire()
    (skipped,) = [n for _, n in plain.notes if n.kind == "skipped"]
    assert skipped.skip is SkipReason.LOCK_DELAY and plain.bodies == []


def test_wait_takes_the_lock_the_moment_its_holder_releases_it() -> None:
    plain = Plain()
    held_elsewhere(plain, release_at=7.3)
    plain.lock.acquire()
    while plain.lock.held is None:
        assert plain.lock.refusal is not None
        assert plain.clock.monotonic() < 60
        await_turn(plain.store, plain.clock, plain.lock.job, None, delayed=False)
        plain.lock.acquire()
    claimed = next(t for t, n in plain.notes if n.kind == "claimed")
    assert claimed == pytest.approx(7.3)  # woken by the release itself, not by a later poll
    (body,) = plain.bodies
    assert body.run is not None and body.run.lock_index == 2


def test_wait_for_a_lock_never_freed_gives_up_at_its_timeout() -> None:
    plain = Plain()
    held_elsewhere(plain)
    give_up = plain.clock.monotonic() + 12.0
    plain.lock.acquire()
    waits = 0
    while plain.clock.monotonic() < give_up:
        assert plain.lock.held is None
        left = give_up - plain.clock.monotonic()
        await_turn(plain.store, plain.clock, plain.lock.job, left, delayed=False)
        plain.lock.acquire()
        waits += 1
    assert plain.clock.monotonic() == pytest.approx(give_up)  # never past it
    assert plain.lock.held is None and plain.bodies == []
    assert waits >= 12  # one blocking read a second at most: a stop is seen within it


def test_wait_through_a_lock_delay_takes_the_lock_once_it_ends() -> None:
    plain = Plain()
    other = held_elsewhere(plain)
    destroyed = plain.clock.monotonic()
    plain.store.destroy_session(other)
    plain.lock.acquire()
    while plain.lock.held is None:
        assert plain.lock.refusal is not None
        await_turn(plain.store, plain.clock, plain.lock.job, None, delayed=True)
        plain.lock.acquire()
    claimed = next(t for t, n in plain.notes if n.kind == "claimed")
    assert destroyed + TIMINGS.lock_delay <= claimed <= destroyed + TIMINGS.lock_delay + 2


@pytest.mark.parametrize("how", ["session destroyed", "key deleted", "key taken"])
def test_a_lost_lock_is_seen_by_its_watch_before_the_next_renewal_and_fenced(how: str) -> None:
    plain = Plain(duration=None)
    plain.lock.acquire()
    session = plain.lock.session
    assert session is not None
    lost_at = 2.0

    def lose() -> None:  # while the run's watch waits on the key
        if how == "session destroyed":
            plain.store.destroy_session(session)
        elif how == "key deleted":
            plain.store.delete(KEYS.lock_key)
        else:
            thief = plain.store.create_session(SessionTerms("thief", 15.0, 15.0, "release", 5.0))
            plain.store.delete(KEYS.lock_key)
            assert plain.store.acquire_lock(KEYS, thief, b"thief").won

    plain.clock.call_at(lost_at, lose)
    plain.until_quiet()
    (body,) = plain.bodies
    told_at, how_told = body.told[0]
    assert how_told is StopHow.TERMINATE
    assert told_at == pytest.approx(lost_at)  # at once: before the first renewal (5 s)
    fenced = next(n for _, n in plain.notes if n.kind == "fenced")
    assert "no longer names our session" in fenced.detail
    done = plain.lock.completed
    assert done is not None and done.outcome is TickOutcome.LOST


class SilentRenewals(MemoryTickStore):
    """Consul stops answering renewals: the lock is never confirmed again."""

    def renew_session(self, session_id: str, *, timeout: float | None = None) -> None:
        raise ConsulUnavailable("no answer")


def test_a_lock_no_longer_confirmed_is_fenced_at_its_bound() -> None:
    clock = VirtualClock(START)
    plain = Plain(SilentRenewals(clock), clock, duration=None)
    plain.lock.acquire()
    plain.until_quiet()
    (body,) = plain.bodies
    told_at, how = body.told[0]
    assert how is StopHow.TERMINATE and told_at == pytest.approx(FENCE_AFTER)
    done = plain.lock.completed
    assert done is not None and done.outcome is TickOutcome.LOST


def test_min_hold_keeps_the_lock_after_a_quick_job() -> None:
    plain = Plain(duration=1.0, min_hold=10.0)
    plain.lock.acquire()
    session = plain.lock.session
    seen: list[tuple[bool, str | None]] = []
    plain.clock.call_at(
        5.0, lambda: seen.append((plain.bodies[0].end is not None, holder_of(plain.store)))
    )
    plain.until_quiet()
    assert seen == [(True, session)]  # the job over at 5 s, and the lock still held
    released = next(t for t, n in plain.notes if n.kind == "completed")
    assert released == pytest.approx(10.0)
    assert holder_of(plain.store) is None


def test_a_job_past_its_timeout_is_ended_and_the_lock_released() -> None:
    plain = Plain(duration=None, timeout=3.0)
    plain.lock.acquire()
    plain.until_quiet()
    (body,) = plain.bodies
    assert body.told[0] == (pytest.approx(3.0), StopHow.TERMINATE)
    done = plain.lock.completed
    assert done is not None and done.outcome is TickOutcome.TIMED_OUT
    assert holder_of(plain.store) is None
    assert "timed-out" in plain.kinds()


def test_a_stop_before_the_acquire_takes_no_lock() -> None:
    plain = Plain()
    plain.lock.stop()
    assert plain.lock.quiet.is_set()
    plain.lock.acquire()
    assert plain.bodies == [] and holder_of(plain.store) is None


def test_a_stop_asked_of_the_process_before_the_halt_comes_takes_no_lock() -> None:
    plain = Plain()
    plain.lock.stop_asked = lambda: True  # a signal came; its halt is not on the clock yet
    plain.lock.acquire()
    assert plain.lock.quiet.is_set()
    assert plain.bodies == [] and holder_of(plain.store) is None


class SignalledDuringAcquire(MemoryTickStore):
    """The stop is asked (a signal) while the acquire is out: --wait's waiter woken by the
    holder's release, as that holder's own SIGTERM ended it."""

    asked = False

    def acquire_lock(self, keys: JobKeys, session: str, value: bytes) -> Claim:
        claim = super().acquire_lock(keys, session, value)
        self.asked = True
        return claim


def test_an_acquire_that_wins_after_a_stop_was_asked_starts_no_job_and_lets_go() -> None:
    clock = VirtualClock(START)
    store = SignalledDuringAcquire(clock)
    plain = Plain(store, clock)
    plain.lock.stop_asked = lambda: store.asked
    plain.lock.acquire()
    plain.clock.call_at(0.1, plain.lock.stop)  # the halt, a moment later
    plain.until_quiet()
    # never started: a job must not begin after its runner's SIGTERM
    assert [body.run for body in plain.bodies] == [None]
    done = plain.lock.completed
    assert done is not None and done.outcome is TickOutcome.INTERRUPTED
    assert holder_of(plain.store) is None


class StoppedDuringAcquire(MemoryTickStore):
    """The lock's stop itself runs while the acquire is out (it waited aside for its answer)."""

    lock: PlainLock | None = None
    closed_before_answer = False

    def acquire_lock(self, keys: JobKeys, session: str, value: bytes) -> Claim:
        claim = super().acquire_lock(keys, session, value)
        assert self.lock is not None
        self.lock.stop()
        self.closed_before_answer = self.lock.pool.closed or self.lock.quiet.is_set()
        return claim


def test_a_stop_while_the_acquire_is_out_lets_go_of_the_lock_it_won_before_the_session() -> None:
    """Destroyed first, the session would free the lock only by its end, with lock-delay."""
    clock = VirtualClock(START)
    store = StoppedDuringAcquire(clock)
    plain = Plain(store, clock)
    store.lock = plain.lock
    plain.lock.acquire()
    plain.until_quiet()
    assert not store.closed_before_answer
    assert [body.run for body in plain.bodies] == [None]
    done = plain.lock.completed
    assert done is not None and done.outcome is TickOutcome.INTERRUPTED
    assert holder_of(plain.store) is None and plain.lock.pool.closed


def test_a_stop_while_the_job_runs_ends_it_releases_the_lock_and_destroys_the_session() -> None:
    plain = Plain(duration=None)
    plain.lock.acquire()
    session = plain.lock.session
    assert session is not None
    plain.clock.call_at(3.0, plain.lock.stop)
    plain.until_quiet()
    (body,) = plain.bodies
    assert body.told[0] == (pytest.approx(3.0), StopHow.TERMINATE)
    done = plain.lock.completed
    assert done is not None and done.outcome is TickOutcome.INTERRUPTED
    assert holder_of(plain.store) is None
    with pytest.raises(Exception, match="gone"):
        plain.store.renew_session(session)
    other = plain.store.create_session(SessionTerms("w2", 86400.0, 15.0, "release", 5.0))
    assert plain.store.acquire_lock(KEYS, other, b"w2").won  # released first: no lock-delay


def test_renewals_confirm_the_lock_of_a_long_job() -> None:
    plain = Plain(duration=60.0)
    plain.lock.acquire()
    plain.until_quiet()
    done = plain.lock.completed
    assert done is not None and done.outcome is TickOutcome.SUCCEEDED
    assert plain.bodies[0].told == []


class Counting(MemoryTickStore):
    """The model, counting the calls that end a run: a record's completion, a lock's release."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__(clock)
        self.completes = self.releases = 0

    def complete(self, *args: object, **kwargs: object) -> Completion:
        self.completes += 1
        return super().complete(*args, **kwargs)  # type: ignore[arg-type]

    def release_lock(self, job: JobKeys, session_id: str) -> bool:
        self.releases += 1
        return super().release_lock(job, session_id)


def test_the_runs_end_releases_the_lock_alone_and_completes_no_record() -> None:
    clock = VirtualClock(START)
    store = Counting(clock)
    plain = Plain(store, clock)
    plain.lock.acquire()
    plain.until_quiet()
    assert (store.completes, store.releases) == (0, 1)
