"""The TickStore contract: the same tests on Consul and on the in-memory model (APScheduler 4's
tests/test_datastores.py shape), so the model cannot drift from what Consul does.

Each test states one of Consul's measured facts (docs/notes/consul-facts.md) as the tick core
meets it. Waits go through the harness's clock: real on Consul, virtual on the model. No
assertion is on how long something took; the few about time are bounds Consul guarantees
whatever the machine's load (a lock-delay counted from a destroy we sent before, never after).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, TypeVar

import pytest
from tick_harness import LOCK_DELAY, TICK0, TTL, Harness, tick

from provision.consul import NO_RETRY, ConsulServerError
from provision.ledger.control import ControlNote, decode_note, encode_pauses
from provision.ledger.records import TickOutcome, TickRecord
from provision.ledger.store import CHUNK, MAX_PRUNED_PER_RUN, Claim
from provision.ledger.ticks import to_prune
from provision.sessions import SessionTerms
from provision.system.control_keys import paused_key, pauses_key, trigger_key
from provision.tick.store import (
    ClaimCall,
    ClaimTerms,
    InvalidSession,
    SessionGone,
    TermsRefused,
    ValueTooLarge,
    lock_delayed,
)

if TYPE_CHECKING:
    from tests.conftest import LiveCluster

pytestmark = pytest.mark.contract
DEADLINE = 60.0  # seconds a test waits at most for what Consul promises (a loaded machine)
DESTROY_LOCK_DELAY = 8.0  # the holder's, where a claim must be asked inside it
T = TypeVar("T")


# --- sessions ---------------------------------------------------------------------------------


def test_renew_after_destroy_is_session_gone(h: Harness) -> None:
    store = h.store
    session = h.session()
    store.renew_session(session, timeout=5.0)
    store.destroy_session(session)
    with pytest.raises(SessionGone):
        store.renew_session(session, timeout=5.0)
    store.destroy_session(session)  # a gone session's destroy is no error


@pytest.mark.parametrize("ttl", [9.0, 86401.0])
def test_a_ttl_outside_consuls_bounds_is_refused(h: Harness, ttl: float) -> None:
    with pytest.raises(TermsRefused):
        h.store.create_session(SessionTerms("contract", ttl, 1.0, "release", 5.0))


@pytest.mark.parametrize("ttl", [10.0, 86400.0])
def test_a_ttl_at_consuls_bounds_is_taken(h: Harness, ttl: float) -> None:
    session = h.session(ttl=ttl)
    h.store.renew_session(session)


def test_a_session_is_invalidated_after_its_ttl_then_its_lock_is_in_lock_delay(
    h: Harness,
) -> None:
    """The one long real wait of the contract: Consul invalidates a session that is not renewed
    between 1 and 2 TTLs later (measured: 2 TTLs), releases its lock and puts it in lock-delay."""
    store, clock, job = h.store, h.clock, h.job
    made = clock.monotonic()
    session = h.session(ttl=TTL)
    assert h.claim(tick(0), session).won
    deadline = made + 2 * TTL + DEADLINE
    index, held_seen = 0, made  # the last ask whose answer still showed our session
    while True:
        asked = clock.monotonic()
        holder, index = store.watch_lock(job, index, wait=5.0)
        if holder is None:
            freed = clock.monotonic()
            break
        assert holder == session
        held_seen = asked
        assert clock.monotonic() < deadline, "the session outlived 2 x TTL by far"
    assert freed >= made + TTL  # never before its TTL
    with pytest.raises(SessionGone):
        store.renew_session(session)
    record, _ = store.read_tick(job, tick(0))
    assert record is not None and record.outcome is TickOutcome.RUNNING  # the value is kept
    other = h.session()
    while True:
        claim = h.claim(tick(1), other)
        if claim.won:
            break
        assert lock_delayed(claim) and not claim.tick_taken
        assert clock.monotonic() < freed + LOCK_DELAY + DEADLINE
        h.sleep(0.25)
    # the lock-delay counts from the invalidation, which came after the last answer showing us
    assert clock.monotonic() >= held_seen + LOCK_DELAY


# --- the claim: all or nothing ----------------------------------------------------------------


def test_a_claim_wins_the_tick_and_the_lock_in_one_write(h: Harness) -> None:
    session = h.session()
    claim = h.claim(tick(0), session)
    assert claim.won and claim.lock_index >= 1 and claim.date is not None
    assert claim.record_index == claim.lock_modify_index  # one transaction, one Raft index
    holder, _ = h.store.watch_lock(h.job, 0, wait=1.0)
    assert holder == session
    record, date = h.store.read_tick(h.job, tick(0))
    assert record is not None and date is not None
    assert (record.outcome, record.worker, record.session) == (TickOutcome.RUNNING, "w1", session)
    assert record.modify_index == claim.record_index


def test_a_claim_of_a_taken_tick_is_refused_whole(h: Harness) -> None:
    first, second = h.session(), h.session()
    won = h.claim(tick(0), first)
    completion = h.store.complete(h.job, h.claimed(tick(0), won), first, release=True)
    assert (completion.recorded, completion.released) == (True, True)
    before, _ = h.store.read_tick(h.job, tick(0))
    lost = h.claim(tick(0), second)  # the lock is free: only the tick is taken
    assert not lost.won and lost.tick_taken and lost.lock_refusal is None
    after, _ = h.store.read_tick(h.job, tick(0))
    assert after == before  # nothing written
    holder, _ = h.store.watch_lock(h.job, 0, wait=1.0)
    assert holder is None  # its lock operation was rolled back with the rest
    again = h.claim(tick(1), second)
    assert again.won and again.lock_index == won.lock_index + 1  # the refused one took nothing


def test_a_claim_while_the_lock_is_held_is_refused_whole(h: Harness) -> None:
    first, second = h.session(), h.session()
    won = h.claim(tick(0), first)
    lost = h.claim(tick(1), second)
    assert not lost.won and not lost.tick_taken and not lock_delayed(lost)
    assert lost.lock_refusal is not None and "already held" in lost.lock_refusal
    assert h.store.read_tick(h.job, tick(1))[0] is None  # the record was not written
    assert h.store.watch_lock(h.job, 0, wait=1.0)[0] == first
    h.store.complete(h.job, h.claimed(tick(0), won), first, release=True)
    assert h.claim(tick(1), second).lock_index == won.lock_index + 1


def test_a_claim_with_a_session_consul_does_not_know_is_invalid_session(h: Harness) -> None:
    gone = h.session()
    h.store.destroy_session(gone)
    for session in (gone, "00000000-dead-beef-0000-000000000000"):
        with pytest.raises(InvalidSession):
            h.claim(tick(0), session)
    assert h.store.read_tick(h.job, tick(0))[0] is None


def test_a_refused_claim_still_costs_a_raft_index(h: Harness) -> None:
    """Consul refuses a losing claim after its commit: the next write's index is two on."""
    session = h.session()
    missed = TickRecord(tick(0), TickOutcome.MISSED, worker="w1")
    h.store.record_unrun(h.job, [missed])
    first, _ = h.store.read_tick(h.job, tick(0))
    assert not h.claim(tick(0), session).won
    h.store.record_unrun(h.job, [TickRecord(tick(1), TickOutcome.MISSED, worker="w1")])
    second, _ = h.store.read_tick(h.job, tick(1))
    assert first is not None and second is not None
    assert second.modify_index >= first.modify_index + 2  # Consul's other writes only add


def test_a_transaction_over_consuls_request_cap_is_refused(h: Harness) -> None:
    """The cap is on the request's body, values in base64: 400 KB of holder is over it."""
    session = h.session()
    with pytest.raises(ValueTooLarge):
        h.store.claim(h.job, h.record(tick(0), session), session, b"x" * 400_000)
    assert h.store.read_tick(h.job, tick(0))[0] is None
    big = TickRecord(tick(1), TickOutcome.MISSED, worker="w" * 600_000)
    with pytest.raises(ValueTooLarge):
        h.store.record_unrun(h.job, [big])
    assert h.store.read_tick(h.job, tick(1))[0] is None


# --- LockDelay ----------------------------------------------------------------------------------


def test_no_lock_delay_after_a_release(h: Harness) -> None:
    first, second = h.session(), h.session()
    won = h.claim(tick(0), first)
    h.store.complete(h.job, h.claimed(tick(0), won), first, release=True)
    assert h.claim(tick(1), second).won  # at once


def test_lock_delay_after_a_destroy(h: Harness) -> None:
    # a long lock-delay for the holder: the next claim is asked well inside it, however loaded
    # the machine (a claim asked after it would prove nothing)
    first, second = h.session(lock_delay=DESTROY_LOCK_DELAY), h.session()
    assert h.claim(tick(0), first).won
    destroyed = h.clock.monotonic()
    h.store.destroy_session(first)
    # tick 0 is taken too, yet only the lock is named: Consul refuses a lock in lock-delay
    # before it judges the other operations (and before Raft)
    refused = h.claim(tick(0), second)
    assert h.clock.monotonic() - destroyed < DESTROY_LOCK_DELAY, "asked after the lock-delay"
    assert not refused.won and lock_delayed(refused) and not refused.tick_taken
    while True:
        claim = h.claim(tick(1), second)
        if claim.won:
            break
        assert lock_delayed(claim)
        assert h.clock.monotonic() < destroyed + DESTROY_LOCK_DELAY + DEADLINE
        h.sleep(0.25)
    assert h.clock.monotonic() >= destroyed + DESTROY_LOCK_DELAY


# --- LockIndex and ModifyIndex -----------------------------------------------------------------


def test_lock_index_grows_with_every_new_holder_and_modify_index_with_every_write(
    h: Harness,
) -> None:
    first, second = h.session(), h.session()
    claims, indexes = [], []
    for number, session in enumerate((first, first, second, first)):
        claim = h.claim(tick(number), session)
        assert claim.won
        claims.append(claim)
        indexes.append(claim.record_index)
        release = number != 0  # the first run keeps the lock: its holder claims again
        done = h.store.complete(h.job, h.finished(tick(number), claim), session, release=release)
        assert done.recorded
        record, _ = h.store.read_tick(h.job, tick(number))
        assert record is not None and record.outcome is TickOutcome.SUCCEEDED
        indexes.append(record.modify_index)
    tokens = [claim.lock_index for claim in claims]
    # the holder's re-acquire keeps its token; each new holder takes the next
    assert tokens[1] == tokens[0] and tokens[2] == tokens[1] + 1 and tokens[3] == tokens[2] + 1
    assert indexes == sorted(set(indexes))  # every write moved the ModifyIndex on


def test_a_plain_write_of_the_lock_key_keeps_its_holder_and_sets_its_lock_index_to_0(
    h: Harness,
) -> None:
    """Measured: a PUT of a held lock's key (no ?acquire: an operator's, or any token that may
    write the key) keeps its session but writes the request's LockIndex, 0: the holder's
    re-acquire then answers 0, and the next holder 1. The fencing token goes backwards."""
    first, second = h.session(), h.session()
    won = h.claim(tick(0), first)
    assert won.won and won.lock_index >= 1
    h.operator.put(h.job.lock_key, b"an operator's note")
    assert h.store.watch_lock(h.job, 0, wait=1.0)[0] == first  # still held
    again = h.claim(tick(1), first)
    assert again.won and again.lock_index == 0
    h.store.complete(h.job, h.claimed(tick(1), again), first, release=True)
    h.operator.put(h.job.lock_key, b"another note")
    other = h.claim(tick(2), second)
    assert other.won and other.lock_index == 1


# --- completion -------------------------------------------------------------------------------


def test_completion_records_the_end_and_frees_the_lock(h: Harness) -> None:
    session = h.session()
    claim = h.claim(tick(0), session)
    completion = h.store.complete(h.job, h.finished(tick(0), claim), session, release=True)
    assert (completion.recorded, completion.released) == (True, True)
    record, _ = h.store.read_tick(h.job, tick(0))
    assert record is not None and (record.outcome, record.exit_status) == (TickOutcome.SUCCEEDED, 0)
    assert h.store.watch_lock(h.job, 0, wait=1.0)[0] is None


def test_a_completion_after_the_lock_was_lost_records_lost(h: Harness) -> None:
    session = h.session()
    claim = h.claim(tick(0), session)
    h.store.destroy_session(session)  # its lock is released: the run was fenced
    completion = h.store.complete(h.job, h.finished(tick(0), claim), session, release=True)
    assert (completion.recorded, completion.released) == (True, False)
    record, _ = h.store.read_tick(h.job, tick(0))
    assert record is not None and record.outcome is TickOutcome.LOST


def test_a_completion_over_a_changed_record_still_unlocks(h: Harness) -> None:
    session = h.session()
    claim = h.claim(tick(0), session)
    changed = TickRecord(tick(0), TickOutcome.UNREADABLE, worker="someone")
    h.operator.put(h.job.tick(tick(0)), changed.encode())
    completion = h.store.complete(h.job, h.finished(tick(0), claim), session, release=True)
    assert (completion.recorded, completion.released) == (False, True)
    assert h.store.watch_lock(h.job, 0, wait=1.0)[0] is None


# --- the ledger -------------------------------------------------------------------------------


def test_record_unrun_writes_only_where_no_record_exists(h: Harness) -> None:
    session = h.session()
    assert h.claim(tick(0), session).won
    paused = TickRecord(tick(2), TickOutcome.PAUSED, worker="w2", by="ops", reason="disk swap")
    unrun = [
        TickRecord(tick(0), TickOutcome.MISSED, worker="w2"),
        TickRecord(tick(1), TickOutcome.MISSED, worker="w2"),
        paused,
    ]
    written = h.store.record_unrun(h.job, unrun)
    assert [r.tick for r in written] == [tick(1), tick(2)]
    assert h.store.record_unrun(h.job, unrun) == []
    ledger = h.store.read_ticks(h.job)
    outcomes = [(r.tick, r.outcome) for r in ledger]
    assert outcomes == [
        (tick(0), TickOutcome.RUNNING),
        (tick(1), TickOutcome.MISSED),
        (tick(2), TickOutcome.PAUSED),
    ]
    assert (ledger[2].by, ledger[2].reason) == ("ops", "disk swap")


def test_a_buffered_tick_is_claimed_over_its_record_as_read_or_recorded_missed_over_it(
    h: Harness,
) -> None:
    """overlap = "buffer_one": the record `buffered` written where none exists; a claim over it
    at its index wins once (a plain claim, or one over a stale index, is refused: tick taken);
    `missed` written over it at its index replaces it, once."""
    session = h.session()
    buffered = [TickRecord(tick(n), TickOutcome.BUFFERED, worker="w1") for n in (0, 1)]
    assert len(h.store.record_unrun(h.job, buffered)) == 2
    first, _ = h.store.read_tick(h.job, tick(0))
    assert first is not None and first.outcome is TickOutcome.BUFFERED
    assert h.claim(tick(0), session).tick_taken  # a plain claim: the tick has a record
    stale = h.claim(tick(0), session, ClaimTerms(over=first.modify_index + 1))
    assert stale.tick_taken and not stale.won
    won = h.claim(tick(0), session, ClaimTerms(over=first.modify_index))
    assert won.won
    h.store.complete(h.job, h.finished(tick(0), won), session, release=True)
    again = h.claim(tick(0), h.session(), ClaimTerms(over=first.modify_index))
    assert again.tick_taken and not again.won  # over it once: the claim replaced it
    second, _ = h.store.read_tick(h.job, tick(1))
    assert second is not None
    missed = replace(second, outcome=TickOutcome.MISSED)
    assert h.store.record_unrun(h.job, [missed]) == [missed]
    assert h.store.record_unrun(h.job, [missed]) == []  # its index moved on: written once
    ledger = {r.tick: r.outcome for r in h.store.read_ticks(h.job)}
    assert ledger == {tick(0): TickOutcome.SUCCEEDED, tick(1): TickOutcome.MISSED}


def test_record_unrun_writes_one_transaction_at_most(h: Harness) -> None:
    many = [TickRecord(tick(n), TickOutcome.MISSED, worker="w1") for n in range(CHUNK + 1)]
    assert len(h.store.record_unrun(h.job, many)) == CHUNK
    assert len(h.store.read_ticks(h.job)) == CHUNK


def test_prune_deletes_what_retention_names_and_keeps_the_rest(h: Harness) -> None:
    count, keep = 2 * CHUNK + 10, 5
    for start in range(0, count, CHUNK):
        batch = range(start, min(start + CHUNK, count))
        records = [TickRecord(tick(n), TickOutcome.MISSED, worker="w1") for n in batch]
        assert len(h.store.record_unrun(h.job, records)) == len(records)
    ticks = {r.tick for r in h.store.read_ticks(h.job)}
    assert len(ticks) == count
    doomed = to_prune(ticks, keep, now=h.clock.wall())
    assert h.store.prune(h.job, doomed) == MAX_PRUNED_PER_RUN  # at most that many per run
    left = [r.tick for r in h.store.read_ticks(h.job)]
    assert left == sorted(doomed[MAX_PRUNED_PER_RUN:] + sorted(ticks)[-keep:])
    assert h.store.prune(h.job, [*to_prune(set(left), 0, now=h.clock.wall())[:5], tick(999)]) == 6
    assert [r.tick for r in h.store.read_ticks(h.job)] == sorted(ticks)[-keep:]


def test_the_ledger_names_its_ticks_without_their_values_and_says_consuls_clock(
    h: Harness,
) -> None:
    """read_tick_names: the ticks that have a record, whatever their outcome, from the names
    alone; keys that name no tick (a stray key, a folder) are left out; Consul's clock comes in
    the same answer."""
    session = h.session()
    assert h.claim(tick(0), session).won
    unrun = [TickRecord(tick(n), TickOutcome.MISSED, worker="w1") for n in (1, 2)]
    assert len(h.store.record_unrun(h.job, unrun)) == 2
    h.operator.put(h.job.ticks + "not-a-tick", b"{}")
    h.operator.put(h.job.ticks + "folder/2020-03-01T12:01:00Z", b"{}")
    before = h.clock.wall()
    names, date = h.store.read_tick_names(h.job)
    assert names == {tick(0), tick(1), tick(2)}
    assert date is not None and abs((date - before).total_seconds()) < 5
    assert h.store.prune(h.job, [tick(1)]) == 1
    assert h.store.read_tick_names(h.job)[0] == {tick(0), tick(2)}


def test_the_ledger_reads_records_only(h: Harness) -> None:
    """Keys under the ledger's prefix that name no tick are not records, consistent or stale."""
    session = h.session()
    assert h.claim(tick(0), session).won
    h.operator.put(h.job.ticks + "not-a-tick", b"{}")
    h.operator.put(h.job.ticks + "folder/2020-03-01T12:01:00Z", b"{}")
    assert [r.tick for r in h.store.read_ticks(h.job)] == [tick(0)]
    # a stale read may lag on Consul (a follower answers): it sees the claim in time
    deadline = h.clock.monotonic() + DEADLINE
    while [r.tick for r in h.store.read_ticks(h.job, stale=True)] != [tick(0)]:
        assert h.clock.monotonic() < deadline
        h.sleep(0.1)
    while h.store.read_tick(h.job, tick(0), stale=True)[0] is None:
        assert h.clock.monotonic() < deadline
        h.sleep(0.1)
    assert h.store.read_tick(h.job, tick(5), stale=True)[0] is None


# --- the claim's other questions ----------------------------------------------------------------


def test_a_claim_says_whether_the_previous_tick_is_recorded(h: Harness) -> None:
    session = h.session()
    first = h.claim(tick(1), session, ClaimTerms(previous=tick(0)))
    assert first.won and first.previous_recorded is False
    h.store.complete(h.job, h.claimed(tick(1), first), session, release=True)
    second = h.claim(tick(2), session, ClaimTerms(previous=tick(1)))
    assert second.won and second.previous_recorded is True
    assert second.paused is None  # not paused


def test_a_catch_up_claims_over_the_missed_record_it_read(h: Harness) -> None:
    session = h.session()
    h.store.record_unrun(h.job, [TickRecord(tick(0), TickOutcome.MISSED, worker="w1")])
    missed, _ = h.store.read_tick(h.job, tick(0))
    assert missed is not None
    stale = h.claim(tick(0), session, ClaimTerms(over=missed.modify_index + 1000))
    assert not stale.won and stale.tick_taken
    caught = h.claim(tick(0), session, ClaimTerms(over=missed.modify_index))
    assert caught.won
    record, _ = h.store.read_tick(h.job, tick(0))
    assert record is not None and record.outcome is TickOutcome.RUNNING


def test_control_keys_are_read_and_a_paused_claim_says_so(h: Harness) -> None:
    job, at = h.job, h.clock.wall()
    empty = h.store.read_control(job)
    assert empty.pauses.paused is None and empty.pauses.resumed == ()
    assert (empty.trigger, empty.taken, empty.taken_index) == (None, None, 0)
    paused = ControlNote("ops", at, "disk swap")
    resumed = ControlNote("ops", TICK0, "earlier", until=TICK0 + (at - TICK0) / 2)
    trigger = ControlNote("alice", at, "now please", id="trigger-1")
    h.operator.put(paused_key(job.name), paused.encode())
    h.operator.put(pauses_key(job.name), encode_pauses([resumed]))
    h.operator.put(trigger_key(job.name), trigger.encode())
    control = h.store.read_control(job)
    assert control.pauses.paused is not None and control.pauses.paused.reason == "disk swap"
    assert [p.reason for p in control.pauses.resumed] == ["earlier"]
    assert control.pending_trigger is not None and control.pending_trigger.id == "trigger-1"
    session = h.session()
    claim = h.claim(tick(0), session, ClaimTerms(trigger=("trigger-1", control.taken_index)))
    assert claim.won and claim.paused is not None
    assert decode_note(claim.paused).reason == "disk swap"
    taken = h.store.read_control(job)
    assert taken.taken == b"trigger-1" and taken.taken_index > 0
    assert taken.pending_trigger is None
    h.store.complete(h.job, h.claimed(tick(0), claim), session, release=True)
    again = h.claim(tick(1), session, ClaimTerms(trigger=("trigger-1", 0)))
    assert not again.won and again.tick_taken  # another replica took the trigger
    h.operator.delete(paused_key(job.name))
    assert h.store.read_control(job).pauses.paused is None


# --- Consul's clock in its answers -------------------------------------------------------------


def _consuls_date(h: Harness, asked: Callable[[], T], date_of: Callable[[T], object]) -> T:
    """What `asked` answers, once the date in it is shown to be Consul's clock as its HTTP Date
    says it: whole seconds, the fraction dropped (never ahead of the clock after the answer,
    and within the second the clock showed before it was asked)."""
    before = h.clock.wall()
    answer = asked()
    after = h.clock.wall()
    date = date_of(answer)
    assert isinstance(date, datetime), f"{answer!r}: no date"
    assert date.microsecond == 0, f"{date}: finer than Consul's Date (whole seconds)"
    assert before - timedelta(seconds=1) < date <= after, f"{date}: not in [{before}, {after}]"
    h.sleep(0.3)  # the next answer at another fraction of a second
    return answer


def test_every_date_a_store_returns_is_a_whole_second_never_ahead_of_the_clock(
    h: Harness,
) -> None:
    """The tick core reads Consul's clock from its answers' Date header (RFC 7231: whole
    seconds): a store whose dates were finer would judge a tick's window a fraction of a second
    earlier than Consul lets a real replica."""
    first, second = h.session(lock_delay=DESTROY_LOCK_DELAY), h.session()
    h.sleep(0.4)  # off a whole second: a virtual clock starts on one

    def claim_date(claim: Claim) -> object:
        return claim.date

    def read_date(read: object) -> object:
        assert isinstance(read, tuple), read
        return read[1]

    won = _consuls_date(h, lambda: h.claim(tick(0), first), claim_date)
    assert won.won
    taken = _consuls_date(h, lambda: h.claim(tick(0), second), claim_date)
    assert taken.tick_taken
    held = _consuls_date(h, lambda: h.claim(tick(1), second), claim_date)
    assert not held.won and not held.tick_taken
    calls = [ClaimCall(h.job, h.record(tick(2), second), second, b"holder")]
    [together] = _consuls_date(
        h, lambda: h.store.claim_many(calls), lambda answers: claim_date(answers[0])
    )
    assert isinstance(together, Claim) and not together.won
    for stale in (False, True):
        asked = functools.partial(h.store.read_tick, h.job, tick(0), stale=stale)
        read = _consuls_date(h, asked, read_date)
        assert read[0] is not None
    [turn] = _consuls_date(
        h, lambda: h.store.read_turns([(h.job, tick(0))]), lambda turns: read_date(turns[0])
    )
    assert not isinstance(turn, Exception) and turn[0] is not None
    names = _consuls_date(h, lambda: h.store.read_tick_names(h.job), read_date)
    assert names[0] == {tick(0)}
    h.store.destroy_session(first)
    delayed = _consuls_date(h, lambda: h.claim(tick(3), second), claim_date)
    assert lock_delayed(delayed)


# --- the lock's watch -------------------------------------------------------------------------


def test_a_watch_answers_at_once_when_behind_and_wakes_on_a_change(h: Harness) -> None:
    store, job = h.store, h.job
    holder, free_index = store.watch_lock(job, 0, wait=30.0)
    assert holder is None and free_index >= 1
    session = h.session()
    claim = h.claim(tick(0), session)
    holder, held_index = store.watch_lock(job, free_index, wait=30.0)  # behind: at once
    assert holder == session and held_index > free_index
    # nothing changes: the wait runs out, the answer is as it was
    holder, index = store.watch_lock(job, held_index, wait=1.0)
    assert holder == session and index >= held_index
    done = h.finished(tick(0), claim)

    def complete() -> None:  # another thread, or a timer of the virtual clock
        store.complete(job, done, session, release=True)

    h.later(0.5, complete)
    holder, index = store.watch_lock(job, index, wait=DEADLINE)
    assert holder is None and index > held_index


def test_a_watch_answers_the_locks_own_index_and_sleeps_through_other_keys_writes(
    h: Harness,
) -> None:
    """A blocking read of a key that exists answers that key's ModifyIndex (not the KV's), so
    writes of other keys (the ledger beside the lock, an operator's) neither move the index a
    watch waits on nor wake it: only a change of the lock does."""
    store, job = h.store, h.job
    session = h.session()
    claim = h.claim(tick(0), session)
    holder, index = store.watch_lock(job, 0, wait=30.0)
    assert holder == session and index == claim.lock_modify_index
    unrun = [TickRecord(tick(1), TickOutcome.MISSED, worker="w1")]
    assert len(store.record_unrun(job, unrun)) == 1
    h.operator.put(job.ticks + "not-a-tick", b"{}")
    assert store.watch_lock(job, index, wait=1.0) == (session, index)  # its wait ran out
    assert store.watch_lock(job, index - 1, wait=30.0) == (session, index)  # behind: at once


def test_a_watch_of_a_lock_never_taken_wakes_on_a_write_beside_it(h: Harness) -> None:
    """Measured: while the lock's key does not exist, a read of it answers the KV's index, and
    a write beside it (the job's ledger) wakes a watch of it (Consul watches the nearest part of
    its key tree): the watch answers before its wait runs out, at a later index."""
    store, job = h.store, h.job
    holder, index = store.watch_lock(job, 0, wait=1.0)
    assert holder is None
    missed = [TickRecord(tick(1), TickOutcome.MISSED, worker="w1")]
    h.later(0.5, lambda: store.record_unrun(job, missed))
    asked = h.clock.monotonic()
    holder, again = store.watch_lock(job, index, wait=DEADLINE)
    assert holder is None and again > index
    assert h.clock.monotonic() < asked + DEADLINE, "slept through the write beside it"
    assert store.read_tick(job, tick(1))[0] is not None


# --- what real Consul shows of its own bounds ----------------------------------------------------


def test_consul_itself_refuses_a_ttl_outside_its_bounds(live_cluster: LiveCluster) -> None:
    """TermsRefused is checked before asking (Consul's 500 would be retried as a server
    fault); this shows the bounds are Consul's, not the model's."""
    consul = live_cluster.management("worker-1").with_retry(NO_RETRY)
    for ttl in (9.0, 86401.0):
        with pytest.raises(ConsulServerError):
            consul.session.create(name="contract", ttl=ttl, lock_delay=1.0)
