"""The TickStore contract for the calls of several jobs at once (the turns of a burst of ticks):
`read_turns` answers each (job, tick) as `read_tick(stale=True)` does, `claim_many` answers
each claim as `claim` alone would, and `complete_many` each completion as `complete` alone
would (a stop's runs), whatever the others in its transaction did. The same tests on Consul and
on the in-memory model (test_tick_store.py's harness)."""

from __future__ import annotations

import pytest
from tick_harness import Harness, tick

from provision.consul import ConsulError
from provision.ledger.records import TickOutcome, TickRecord
from provision.ledger.store import Claim
from provision.tick.store import ClaimAnswer, ClaimCall, CompleteCall, InvalidSession, JobKeys

pytestmark = pytest.mark.contract
DEADLINE = 60.0  # seconds a stale read may lag behind a write, at most (a loaded machine)


def jobs(h: Harness, count: int) -> list[JobKeys]:
    """The harness's job and `count - 1` more under its own prefix (cleaned up with it)."""
    more = [
        JobKeys(f"{h.job.name}-{n}", f"test/{h.job.name}/job-{n}/.lock") for n in range(1, count)
    ]
    return [h.job, *more]


def call(h: Harness, job: JobKeys, session: str, n: int = 0) -> ClaimCall:
    record = TickRecord(tick(n), TickOutcome.RUNNING, worker="w1", session=session)
    return ClaimCall(job, record, session, f"holder of {job.name}".encode())


def won(answer: ClaimAnswer) -> Claim:
    assert isinstance(answer, Claim) and answer.won, answer
    return answer


def test_read_turns_answers_each_tick_as_read_tick_does(h: Harness) -> None:
    """Stale, as the turn's read_tick: a write just made may be missed for a while (any
    server answers), so the record is waited for; the ticks without one never show one."""
    a, b = jobs(h, 2)
    session = h.session()
    assert h.claim(tick(0), session).won  # a's tick 0 has a record; b's and a's tick 1 none
    turns = [(a, tick(0)), (b, tick(0)), (a, tick(1))]
    deadline = h.clock.monotonic() + DEADLINE
    while True:
        answers = h.store.read_turns(turns)
        assert len(answers) == len(turns)
        read = [answer for answer in answers if not isinstance(answer, ConsulError)]
        assert len(read) == len(turns), answers
        assert all(date is not None for _, date in read)
        assert read[1][0] is None and read[2][0] is None
        if read[0][0] is not None:
            break
        assert h.clock.monotonic() < deadline, "the claimed record never showed"
        h.sleep(0.2)
    assert read[0][0] == h.store.read_tick(a, tick(0))[0]  # as a consistent read has it
    assert read[0][0].session == session
    assert h.store.read_turns([]) == []


def test_claim_many_wins_every_free_tick_each_with_its_own_lock(h: Harness) -> None:
    session = h.session()
    group = jobs(h, 3)
    answers = h.store.claim_many([call(h, job, session) for job in group])
    claims = [won(answer) for answer in answers]
    for job, claim in zip(group, claims, strict=True):
        record, _ = h.store.read_tick(job, tick(0))
        assert record is not None and record.session == session
        assert record.modify_index == claim.record_index
        assert h.store.watch_lock(job, 0, wait=1.0)[0] == session
        done = record.completed(TickOutcome.SUCCEEDED, finished_at=h.clock.wall(), exit_status=0)
        completion = h.store.complete(job, done, session, release=True)
        assert (completion.recorded, completion.released) == (True, True)


def test_claim_many_a_taken_tick_refuses_only_its_own_claim(h: Harness) -> None:
    """Consul rolls a whole transaction back for one failed operation: the claims beside a
    refused one are sent again on their own, and win as they would have alone."""
    first, second = h.session(), h.session()
    a, b, c = jobs(h, 3)
    taken = h.claim(tick(0), first)  # a's tick 0, and a's lock, are first's
    assert taken.won
    answers = h.store.claim_many([call(h, job, second) for job in (b, a, c)])
    assert len(answers) == 3
    won(answers[0])
    won(answers[2])
    refused = answers[1]
    assert isinstance(refused, Claim) and not refused.won and refused.tick_taken
    assert h.store.watch_lock(a, 0, wait=1.0)[0] == first  # untouched
    for job in (b, c):
        assert h.store.watch_lock(job, 0, wait=1.0)[0] == second


def test_claim_many_an_unknown_session_is_invalid_in_its_place_only(h: Harness) -> None:
    live, gone = h.session(), h.session()
    h.store.destroy_session(gone)
    a, b = jobs(h, 2)
    answers = h.store.claim_many([call(h, a, gone), call(h, b, live)])
    assert isinstance(answers[0], InvalidSession)
    won(answers[1])
    assert h.store.read_tick(a, tick(0))[0] is None  # nothing written for the refused one


def test_claim_many_two_refused_for_different_reasons_each_says_its_own(h: Harness) -> None:
    """A tick taken and a lock held in one transaction: each refused claim has the answer it
    would have had alone (taken; held), and the claims beside them win."""
    first, second = h.session(), h.session()
    a, b, c, d = jobs(h, 4)
    assert h.claim(tick(0), first).won  # a's tick 0 (and a's lock) are first's
    held = h.store.claim(c, call(h, c, first, 5).record, first, b"first")  # c's lock, tick 5
    assert held.won
    answers = h.store.claim_many([call(h, job, second) for job in (a, b, c, d)])
    taken, held_elsewhere = answers[0], answers[2]
    assert isinstance(taken, Claim) and not taken.won and taken.tick_taken
    assert isinstance(held_elsewhere, Claim) and not held_elsewhere.won
    assert not held_elsewhere.tick_taken and held_elsewhere.lock_refusal is not None
    assert "already held" in held_elsewhere.lock_refusal
    won(answers[1])
    won(answers[3])
    assert h.store.read_tick(c, tick(0))[0] is None  # the refused claim wrote nothing


def claimed(h: Harness, group: list[JobKeys], session: str) -> list[CompleteCall]:
    """Tick 0 of each job claimed under `session`, and its completion (succeeded) to send."""
    for answer in h.store.claim_many([call(h, job, session) for job in group]):
        won(answer)
    completions = []
    for job in group:
        record, _ = h.store.read_tick(job, tick(0))
        assert record is not None
        done = record.completed(TickOutcome.SUCCEEDED, finished_at=h.clock.wall(), exit_status=0)
        completions.append(CompleteCall(job, done, session))
    return completions


def test_complete_many_records_and_releases_every_run_across_transactions(h: Harness) -> None:
    """40 completions: 80 operations, more than one transaction on Consul (64 at most)."""
    session = h.session()
    group = jobs(h, 40)
    answers = h.store.complete_many(claimed(h, group, session))
    assert [(a.recorded, a.released) for a in answers] == [(True, True)] * len(group)
    for job in group:
        record, _ = h.store.read_tick(job, tick(0))
        assert record is not None and record.outcome is TickOutcome.SUCCEEDED
        assert h.store.watch_lock(job, 0, wait=1.0)[0] is None
    assert h.store.complete_many([]) == []


def test_complete_many_answers_each_as_complete_alone_whatever_the_others_did(
    h: Harness,
) -> None:
    """A lock lost (its session destroyed) and a record changed under the run, among runs that
    end well: each answers as `complete` alone (test_tick_store.py), the others are done."""
    first, second = h.session(), h.session()
    a, b, c, d = jobs(h, 4)
    completions = claimed(h, [a, c], first) + claimed(h, [b, d], second)
    h.store.destroy_session(second)  # b's and d's locks are gone: their runs were fenced
    changed = TickRecord(tick(0), TickOutcome.UNREADABLE, worker="someone")
    h.operator.put(c.tick(tick(0)), changed.encode())
    by_job = {call.job: call for call in completions}
    answers = h.store.complete_many([by_job[job] for job in (a, b, c, d)])
    said = [(answer.recorded, answer.released) for answer in answers]
    assert said == [(True, True), (True, False), (False, True), (True, False)]
    outcomes = [h.store.read_tick(job, tick(0))[0] for job in (a, b, c, d)]
    assert [r.outcome if r else None for r in outcomes] == [
        TickOutcome.SUCCEEDED,
        TickOutcome.LOST,
        TickOutcome.UNREADABLE,  # changed under us: left as it was
        TickOutcome.LOST,
    ]
    assert all(h.store.watch_lock(job, 0, wait=1.0)[0] is None for job in (a, c))
