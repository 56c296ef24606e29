"""The TickStore's plain lock (acquire_lock / release_lock: the lock alone, no tick, no record,
`lockctl run` of a job without a schedule), the same tests on Consul and on the model."""

from __future__ import annotations

import pytest
from tick_harness import Harness, tick

from provision.tick.store import InvalidSession, lock_delayed

pytestmark = pytest.mark.contract
DEADLINE = 60.0  # seconds a test waits at most for what Consul promises (a loaded machine)
DESTROY_LOCK_DELAY = 8.0  # the holder's, where an acquire must be asked inside it


def test_an_acquire_takes_the_free_lock_with_its_value_and_writes_no_record(h: Harness) -> None:
    session = h.session()
    won = h.store.acquire_lock(h.job, session, b"plain holder")
    assert won.won and won.lock_index == 1 and won.lock_modify_index > 0
    holder, _ = h.store.watch_lock(h.job, 0, 0.0)
    assert holder == session
    assert h.store.read_ticks(h.job) == []  # no ledger record


def test_an_acquire_of_a_held_lock_is_refused_not_for_lock_delay(h: Harness) -> None:
    first, second = h.session(), h.session()
    assert h.store.acquire_lock(h.job, first, b"first").won
    refused = h.store.acquire_lock(h.job, second, b"second")
    assert not refused.won and refused.lock_refusal and not lock_delayed(refused)
    assert h.store.watch_lock(h.job, 0, 0.0)[0] == first


def test_the_holders_acquire_again_keeps_its_lock_index(h: Harness) -> None:
    session = h.session()
    first = h.store.acquire_lock(h.job, session, b"a")
    again = h.store.acquire_lock(h.job, session, b"a")
    assert again.won and again.lock_index == first.lock_index


def test_a_release_frees_the_lock_at_once_and_the_next_holder_gets_a_new_lock_index(
    h: Harness,
) -> None:
    first, second = h.session(), h.session()
    won = h.store.acquire_lock(h.job, first, b"first")
    assert h.store.release_lock(h.job, first) is True
    assert h.store.watch_lock(h.job, 0, 0.0)[0] is None
    after = h.store.acquire_lock(h.job, second, b"second")  # no lock-delay after a release
    assert after.won and after.lock_index == won.lock_index + 1


def test_a_release_of_a_lock_not_ours_says_so_and_leaves_it_held(h: Harness) -> None:
    first, second = h.session(), h.session()
    assert h.store.acquire_lock(h.job, first, b"first").won
    assert h.store.release_lock(h.job, second) is False
    assert h.store.watch_lock(h.job, 0, 0.0)[0] == first


def test_an_acquire_after_the_holders_destroy_waits_out_its_lock_delay(h: Harness) -> None:
    first, second = h.session(lock_delay=DESTROY_LOCK_DELAY), h.session()
    won = h.store.acquire_lock(h.job, first, b"first")
    destroyed = h.clock.monotonic()
    h.store.destroy_session(first)
    refused = h.store.acquire_lock(h.job, second, b"second")
    assert h.clock.monotonic() - destroyed < DESTROY_LOCK_DELAY, "asked after the lock-delay"
    assert not refused.won and lock_delayed(refused)
    assert h.store.release_lock(h.job, first) is False  # the destroy released it already
    while True:
        taken = h.store.acquire_lock(h.job, second, b"second")
        if taken.won:
            break
        assert lock_delayed(taken)
        assert h.clock.monotonic() < destroyed + DESTROY_LOCK_DELAY + DEADLINE
        h.sleep(0.25)
    assert h.clock.monotonic() >= destroyed + DESTROY_LOCK_DELAY
    assert taken.lock_index == won.lock_index + 1


def test_an_acquire_with_a_destroyed_session_is_invalid_session(h: Harness) -> None:
    session = h.session()
    h.store.destroy_session(session)
    with pytest.raises(InvalidSession):
        h.store.acquire_lock(h.job, session, b"gone")


def test_a_plain_lock_and_a_ticks_claim_exclude_each_other(h: Harness) -> None:
    plain, ticked = h.session(), h.session()
    assert h.store.acquire_lock(h.job, plain, b"plain").won
    assert not h.claim(tick(0), ticked).won
    assert h.store.release_lock(h.job, plain)
    assert h.claim(tick(0), ticked).won
    assert not h.store.acquire_lock(h.job, plain, b"plain").won


def test_a_watch_wakes_when_the_holder_releases(h: Harness) -> None:
    holder = h.session()
    won = h.store.acquire_lock(h.job, holder, b"holder")
    h.later(0.5, lambda: h.store.release_lock(h.job, holder))
    seen, _ = h.store.watch_lock(h.job, won.lock_modify_index, 30.0)
    assert seen is None
