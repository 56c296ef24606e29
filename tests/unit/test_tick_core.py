"""The tick core (provision/tick/core.py, held.py, pool.py) in virtual time against the in-memory
Consul: scenarios of its decisions, each a few ticks of a small fleet of real TickCores on one
VirtualClock, in one thread. No real sleep, no wall clock: every run is the same."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from tick_fleet import (
    FENCE_AFTER,
    KEYS,
    KILL_AFTER,
    START,
    TIMINGS,
    WORKERS,
    Body,
    Counting,
    Fleet,
    at,
    every_10s,
)

from provision.consul import ConsulUnavailable, PermissionDenied
from provision.ledger.records import TickOutcome, TickRecord, tick_name
from provision.ledger.store import Claim, Completion
from provision.ledger.turns import CLAIM_STAGGER, claim_order
from provision.sessions import SessionTerms
from provision.tick.core import Identity, TickCore, housekeeps, plan_tick
from provision.tick.edge import BodyEnd, StopHow
from provision.tick.held import STOP_COMPLETE_WITHIN
from provision.tick.memory import MemoryTickStore
from provision.tick.pool import session_terms
from provision.tick.store import JobKeys


# -- one tick, one run ----------------------------------------------------------------------------
def test_each_tick_runs_once_on_the_first_in_its_claim_order_and_is_recorded() -> None:
    fleet = Fleet()
    for worker in WORKERS:
        fleet.start(worker)
    fleet.run(45)
    for n in range(4):
        tick = at(10 * n)
        first = claim_order(KEYS.name, tick, WORKERS)[0]
        assert fleet.ran(tick) == [first]
        record = fleet.record(tick)
        assert record is not None and record.outcome is TickOutcome.SUCCEEDED
        assert (record.worker, record.tick) == (first, tick)  # the tick planned is recorded


def test_two_replicas_claiming_one_tick_at_once_run_it_once() -> None:
    # workers the job does not list go first, both: both read "no record" and both claim
    fleet = Fleet(job=every_10s(workers=()))
    fleet.start("w1")
    fleet.start("w2")
    fleet.run(5)
    assert len(fleet.ran(at(0))) == 1
    loser = "w2" if fleet.ran(at(0)) == ["w1"] else "w1"
    assert [n.detail for _, n in fleet.said(loser, "skipped")] == ["taken"]


def test_a_replica_that_reads_the_tick_taken_makes_no_write() -> None:
    fleet = Fleet()
    stores = {worker: Counting(fleet.store) for worker in WORKERS}
    for worker in WORKERS:
        fleet.start(worker, store=stores[worker])
    fleet.run(5)  # tick 0 only: its window stays open, no fate to look at
    first, *others = claim_order(KEYS.name, at(0), WORKERS)
    assert stores[first].writes == ["claim"]
    assert all(stores[other].writes == [] for other in others)


def test_turns_come_in_claim_order_one_stagger_apart() -> None:
    fleet = Fleet()
    for worker in WORKERS:
        fleet.start(worker)
    fleet.run(5)
    order = claim_order(KEYS.name, at(0), WORKERS)
    turns = {n.detail: when for when, _, n in fleet.notes if n.kind in ("claimed", "skipped")}
    assert fleet.said(order[0], "claimed")[0][0] == 0.0
    assert [when for when, _ in fleet.said(order[1], "skipped")] == [CLAIM_STAGGER]
    assert [when for when, _ in fleet.said(order[2], "skipped")] == [2 * CLAIM_STAGGER]
    assert turns  # every replica said what it did


def test_the_next_replica_in_order_claims_when_the_first_is_gone() -> None:
    fleet = Fleet()
    order = claim_order(KEYS.name, at(0), WORKERS)
    for worker in order[1:]:
        fleet.start(worker)
    fleet.run(5)
    assert fleet.ran(at(0)) == [order[1]]
    assert fleet.said(order[1], "claimed")[0][0] == CLAIM_STAGGER


def test_the_planned_tick_is_the_one_claimed_recorded_and_completed_whatever_the_wall_does() -> (
    None
):
    fleet = Fleet(workers=("w1",), job=every_10s(workers=("w1",)), duration=4.0)
    fleet.start("w1")
    fleet.run(1)
    fleet.clocks["w1"].clock.step_wall(3600)  # its wall jumps an hour while tick 0 runs
    fleet.run(5)
    record = fleet.record(at(0))
    assert record is not None and record.outcome is TickOutcome.SUCCEEDED
    assert fleet.ran(at(0)) == ["w1"]
    body = fleet.bodies[0][2]
    assert body.run is not None and body.run.tick == at(0)


@pytest.mark.parametrize("back", [2.0, 40.0])  # into the last tick's window; past ticks it had
def test_a_wall_stepped_back_never_brings_a_tick_it_had_again(back: float) -> None:
    fleet = Fleet(workers=("w1",), job=every_10s(workers=("w1",)))
    fleet.start("w1")
    fleet.run(15)  # ticks 0 and 10 ran
    fleet.clocks["w1"].clock.step_wall(-back)  # Consul's clock (the core's wall) stepped back
    fleet.run(80)
    due = [n.tick for _, n in fleet.said("w1", "due")]
    assert due[:2] == [at(0), at(10)] and len(due) > 3  # it went on ticking
    assert due == sorted(set(due))  # each tick due once, in order: never one it had again
    ran = [tick for _, tick, _ in fleet.bodies]
    assert ran == sorted(set(ran))  # and run once each


# -- fencing --------------------------------------------------------------------------------------
def test_a_run_whose_session_ends_early_is_fenced_and_recorded_lost() -> None:
    fleet = Fleet(workers=("w1",), job=every_10s(workers=("w1",)), duration=None)
    core = fleet.start("w1")
    fleet.run(1)
    (run,) = core.runs
    fleet.store.destroy_session(run.claimed.session)  # Consul ended it (an operator, a TTL)
    fleet.run(5)  # the next renewal finds it gone
    body = fleet.bodies[0][2]
    assert body.told and body.told[0][1] is StopHow.TERMINATE
    record = fleet.record(at(0))
    assert record is not None and record.outcome is TickOutcome.LOST


def test_an_unconfirmed_lock_fences_the_body_at_the_bounds_on_the_clock() -> None:
    """Consul answers no renewal: SIGTERM at fence_after, SIGKILL at kill_after after the last
    confirmation (the claim's send time), and check() fails from fence_after on."""
    fleet = Fleet(workers=("w1",), job=every_10s(workers=("w1",)), duration=None)
    fleet.ignores_term = True
    store = Counting(fleet.store)
    fleet.start("w1", store=store)
    fleet.run(0.5)
    body = fleet.bodies[0][2]
    assert body.run is not None and body.run.safe()

    def no_answer(*args: object, **kwargs: object) -> None:
        raise ConsulUnavailable("simulated: no answer")

    store.renew_session = no_answer  # type: ignore[attr-defined]
    fleet.run(FENCE_AFTER - 0.5 - 0.001)
    assert body.run.safe() and not body.told
    fleet.run(0.002)
    assert not body.run.safe()
    assert body.told == [(FENCE_AFTER, StopHow.TERMINATE)]
    fleet.run(KILL_AFTER - FENCE_AFTER)
    assert body.told[-1] == (KILL_AFTER, StopHow.KILL)
    assert body.end == BodyEnd(-9)
    record = fleet.record(at(0))
    assert record is not None and record.outcome is TickOutcome.LOST
    # the session still holds the lock (30 s without renewal), but the lost run let it go: the
    # next run under the same session is a new holder, with a new fencing token
    fleet.run(20 - KILL_AFTER)
    assert [b.run.lock_index for _, _, b in fleet.bodies if b.run is not None] == [1, 2]


def test_a_paused_replicas_body_is_stopped_by_the_bound_the_moment_it_wakes() -> None:
    """Paused past its session's end, the replica's hung body is killed on resume, before
    anything else of it runs; check() fails at once, whatever the core's flag said; the tick is
    recorded lost and the next run's token is higher."""
    fleet = Fleet(duration=None, ignores_term=True)
    order = claim_order(KEYS.name, at(0), WORKERS)
    for worker in WORKERS:
        fleet.start(worker)
    fleet.run(1)
    owner = order[0]
    body = fleet.bodies[0][2]
    assert fleet.bodies[0][0] == owner and body.run is not None
    fleet.clocks[owner].paused = True
    fleet.run(60)  # TTL x 2 + LockDelay: another replica may take the lock from t=45 on
    assert not body.run.safe()  # judged on the clock, though the paused core told it nothing
    assert body.told == [] and body.end is None
    fleet.clocks[owner].resume()
    fleet.run(0)
    assert body.told[0] == (61.0, StopHow.KILL)
    record = fleet.record(at(0))
    assert record is not None and record.outcome is TickOutcome.LOST
    tokens = [b.run.lock_index for _, _, b in fleet.bodies if b.run is not None]
    assert tokens == sorted(set(tokens))  # each run a higher fencing token


class LateClaim(Counting):
    """A claim answered FENCE_AFTER + 1 s after it was applied; the session's renewals sent
    meanwhile answered (`renewed`) or not (Consul as slow for them)."""

    def __init__(self, fleet: Fleet, *, renewed: bool) -> None:
        super().__init__(fleet.store)
        self.fleet, self.renewed, self.waiting = fleet, renewed, False

    def claim(self, *args: Any, **kwargs: Any) -> Claim:
        answer = super().claim(*args, **kwargs)
        self.waiting = True
        try:
            self.fleet.clock.advance(FENCE_AFTER + 1)  # the answer comes late
        finally:
            self.waiting = False
        return answer

    def renew_session(self, session_id: str, *, timeout: float | None = None) -> None:
        if self.waiting and not self.renewed:
            raise ConsulUnavailable("simulated: no answer within 2.5s")
        self.store.renew_session(session_id, timeout=timeout)


def test_a_claim_answered_after_its_bound_starts_no_body() -> None:
    """Nothing says the lock was held after the claim was sent: the run is lost unstarted."""
    fleet = Fleet(workers=("w1",), job=every_10s(workers=("w1",)))
    fleet.start("w1", store=LateClaim(fleet, renewed=False))
    fleet.run(1)
    assert [body.run for _, _, body in fleet.bodies] == [None]  # made, never started
    record = fleet.record(at(0))
    assert record is not None and record.outcome is TickOutcome.LOST


def test_a_claim_answered_late_runs_when_its_session_was_renewed_meanwhile() -> None:
    """A renewal of its session sent after the claim says the session lived then, so the lock
    the claim took was held: the run counts from it, as every holder of the session does."""
    fleet = Fleet(workers=("w1",), job=every_10s(workers=("w1",)))
    fleet.start("w1", store=LateClaim(fleet, renewed=True))
    fleet.run(1)  # the claim's answer at 10 s (the clock went on inside it), its run 2 s
    fleet.run(5)
    assert [body.run is not None for _, tick, body in fleet.bodies if tick == at(0)] == [True]
    record = fleet.record(at(0))
    assert record is not None and record.outcome is TickOutcome.SUCCEEDED


def test_a_read_answered_long_after_it_was_sent_claims_nothing() -> None:
    """The claim's transaction refuses a tick that has a record, not one whose record
    retention deleted meanwhile: a claim judged on a read answered (or acted on) after the
    tick's window, by the Date plus the time since the read was sent, is not sent."""
    fleet = Fleet(workers=("w1",), job=every_10s(workers=("w1",)))
    store = Counting(fleet.store)
    real_read = store.store.read_tick

    late = [True]

    def late_read(*args: object, **kwargs: object) -> tuple[TickRecord | None, datetime | None]:
        answer = real_read(*args, **kwargs)  # type: ignore[arg-type]
        if late.pop() if late else False:  # the first read's answer comes a minute late
            fleet.clock.advance(60)
        return answer

    store.read_tick = late_read  # type: ignore[attr-defined]
    fleet.start("w1", store=store)
    fleet.run(1)
    assert fleet.ran(at(0)) == []
    first = next(n for _, n in fleet.said("w1", "too-late"))
    assert first.tick == at(0)


# -- ticks nobody ran, and Consul not answering ---------------------------------------------------
def test_a_tick_nobody_can_claim_is_recorded_missed_once() -> None:
    fleet = Fleet()
    stores = {worker: Counting(fleet.store) for worker in WORKERS}
    outsider = fleet.store.create_session(SessionTerms("outsider", 60, 15, "release", 20))
    fleet.store.claim(KEYS, TickRecord(at(-100), TickOutcome.RUNNING), outsider, b"outsider")
    for worker in WORKERS:
        fleet.start(worker, store=stores[worker])
    fleet.run(16)  # tick 0's window closes at 10, plus MISSED_GRACE 2, plus the ranks
    record = fleet.record(at(0))
    assert record is not None and record.outcome is TickOutcome.MISSED
    assert fleet.bodies == []
    missed = [n for _, _, n in fleet.notes if n.kind == "missed" and n.tick == at(0)]
    assert len(missed) == 1  # one replica wrote it; the others' looks found it recorded


class NoControlRead(Counting):
    """A token without read on the job's control keys (an old or hand-written policy)."""

    def __init__(self, store: MemoryTickStore) -> None:
        super().__init__(store)
        self.control_reads = 0

    def read_control(self, job: JobKeys) -> object:
        self.control_reads += 1
        raise PermissionDenied("simulated: 403", status=403, body="Permission denied")


def test_a_tick_whose_fate_consul_refuses_is_said_refused_once_never_retried() -> None:
    """Recording a missed tick reads the job's pauses; a token Consul refuses that read is
    said (`refused`, naming the tick), and the look is not tried again every few seconds for
    ever (each unclaimed tick would add a loop of its own)."""
    fleet = Fleet(workers=("w1",), job=every_10s(workers=("w1",)))
    store = NoControlRead(fleet.store)
    outsider = fleet.store.create_session(SessionTerms("outsider", 60, 15, "release", 20))
    fleet.store.claim(KEYS, TickRecord(at(-100), TickOutcome.RUNNING), outsider, b"outsider")
    fleet.start("w1", store=store)
    fleet.run(300)  # the outsider's lock is free after 2 x TTL + LockDelay: then runs
    refused = [n for _, n in fleet.said("w1", "refused")]
    assert refused and all("403" in n.detail for n in refused)
    fates = [n.tick for n in refused if n.tick is not None]  # the unclaimed ticks' looks
    assert len(fates) >= 10 and len(set(fates)) == len(fates)  # each tick said once
    assert store.control_reads == len(refused)  # each refusal read once: none in a loop
    assert fleet.ran(at(200)) == ["w1"]  # the job itself goes on


def test_a_claim_whose_answer_is_lost_keeps_the_job_busy_until_read_then_is_undone() -> None:
    fleet = Fleet(workers=("w1",), job=every_10s(workers=("w1",)))
    store = Counting(fleet.store)
    store.lose_next_claim = True
    fleet.start("w1", store=store)
    fleet.run(15)
    assert fleet.ran(at(0)) == []  # its claim applied, unanswered: nothing ran under it
    record = fleet.record(at(0))
    assert record is not None and record.outcome is TickOutcome.INTERRUPTED
    assert [n.tick for _, n in fleet.said("w1", "orphan")] == [at(0)]
    assert fleet.ran(at(10)) == ["w1"]  # the lock was released: the next tick runs
    tokens = [b.run.lock_index for _, _, b in fleet.bodies if b.run is not None]
    assert tokens == [2]  # a new holder: the orphaned claim's token is not reused


def test_skewed_clocks_run_each_tick_once_and_never_before_it() -> None:
    fleet = Fleet(duration=1.0)
    for worker, skew in zip(WORKERS, (0.0, 4.0, -3.0), strict=True):
        fleet.start(worker, skew=skew)
    fleet.run(300)
    ticks = [tick for _, tick, _ in fleet.bodies]
    assert len(ticks) == len(set(ticks)) >= 25
    for _, tick, body in fleet.bodies:
        assert START + timedelta(seconds=body.started_at) >= tick  # not before it on Consul's


def test_stop_interrupts_the_run_records_it_and_destroys_the_sessions() -> None:
    fleet = Fleet(workers=("w1",), job=every_10s(workers=("w1",)), duration=None)
    core = fleet.start("w1")
    fleet.run(1)
    (run,) = core.runs
    core.stop()
    fleet.run(1)
    record = fleet.record(at(0))
    assert record is not None and record.outcome is TickOutcome.INTERRUPTED
    with pytest.raises(Exception, match="gone"):
        fleet.store.renew_session(run.claimed.session)
    fleet.run(30)
    assert fleet.ran(at(10)) == []


def test_housekeeping_is_chosen_alike_on_every_replica_about_once_in_half_the_history() -> None:
    job = every_10s()
    chosen = [housekeeps(job, at(10 * n)) for n in range(5000)]
    assert 5000 / 25 * 0.8 < sum(chosen) < 5000 / 25 * 1.2
    plans = {w: plan_tick(job, at(0), w) for w in WORKERS}
    assert {p.window for p in plans.values()} == {10.0}
    assert sorted(p.turn.rank for p in plans.values()) == [0, 1, 2]


def test_a_housekeeping_that_prunes_says_how_many_records_it_deleted() -> None:
    job = replace(every_10s(workers=("w1",)), history_limit=10)
    fleet = Fleet(job=job, workers=("w1",))
    fleet.start("w1")
    fleet.run(400)  # 40 ticks, each run here; one run in 5 housekeeps after it
    kept, _ = fleet.store.read_tick_names(KEYS)
    said = [n for _, n in fleet.said("w1", "housekeeping")]
    assert len(kept) < len(fleet.ran_ticks()) and said  # some were pruned
    assert all(n.count for n in said)  # said only when it did something: here, pruned
    assert sum(n.count or 0 for n in said) == len(fleet.ran_ticks()) - len(kept)


def test_a_replica_back_after_an_outage_records_every_tick_of_it_missed_at_its_start() -> None:
    """Its start's housekeeping is timed for the newest closed tick's window and grace on its
    clock; Consul's Date, a second coarser, can still call that tick not missable then. It is
    looked at again until it is, not left to a housekeeping a few dozen ticks later. (The
    model's dates are whole seconds, as Consul's are.)"""
    job = every_10s(workers=("w1",), start_deadline=5.0)
    fleet = Fleet(job=job, workers=("w1",), duration=1.0)
    first = fleet.start("w1")
    fleet.run(3)  # tick 0 ran
    first.stop()
    fleet.run(32.5)  # the outage: ticks 10, 20, 30 pass their windows; back at 35.5, when
    # tick 30's window (to 35) has closed and its grace (to 37) not yet
    fleet.start("w1")
    fleet.run(10)
    outage = [fleet.record(at(t)) for t in (10, 20, 30)]
    assert [r.outcome if r else None for r in outage] == [TickOutcome.MISSED] * 3


class Unrecorded:
    """A replica's store whose completions Consul never answers (its only server is gone)."""

    def __init__(self, store: MemoryTickStore) -> None:
        self.store, self.completions = store, 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    def complete(self, *args: object, **kwargs: object) -> Completion:
        self.completions += 1
        return Completion(False, None)

    def complete_many(self, completions: Sequence[object]) -> list[Completion]:
        self.completions += 1  # after a stop, completions go together: as unanswered
        return [Completion(False, None)] * len(completions)


def test_a_stop_ends_in_bounded_time_though_consul_never_answers_the_completion() -> None:
    fleet = Fleet(workers=("w1",), job=every_10s(workers=("w1",)), duration=1.0)
    store = Unrecorded(fleet.store)
    core = fleet.start("w1", store=store)
    fleet.run(40)  # tick 0's completion is sent again and again, backing off to 30 s
    assert core.runs and store.completions >= 3
    core.stop()
    fleet.run(STOP_COMPLETE_WITHIN + 1)
    assert core.runs == [] and core.pool.closed
    assert [n.tick for _, n in fleet.said("w1", "complete-abandoned")] == [at(0)]
    record = fleet.record(at(0))
    assert record is not None and record.outcome is TickOutcome.RUNNING  # its session ends it


def test_the_lock_holds_the_fields_every_release_writes_there() -> None:
    """A fleet upgrades one replica at a time: the lock's value keeps the old engine's fields
    (tick/plain.py, runner/tick_lock.py: who claimed, on which host, its pid, the tick), which
    `lockctl status` and older releases read."""
    fleet = Fleet(workers=("w1",), job=every_10s(workers=("w1",)))
    identity = Identity("w1", "host-1", 4242)
    core = TickCore(
        fleet.store,
        fleet.clock,
        identity,
        [fleet.job],
        lambda job, tick: Body(fleet.clock, 1.0, False),
    )
    value = json.loads(core._holder(core.plan(fleet.job, at(0))))
    assert list(value) == ["acquired_at", "worker", "job", "host", "pid", "tick"]
    assert (value["worker"], value["host"], value["pid"]) == ("w1", "host-1", 4242)
    assert value["tick"] == tick_name(at(0)) and value["job"] == KEYS.name


def test_a_session_is_named_as_every_release_names_it() -> None:
    """`lockctl status` and operators read the session's name; the old engine's pool named it
    so (scheduler/sessions.py), and a fleet upgrades one replica at a time."""
    terms = session_terms("worker-2", TIMINGS, None)
    assert terms.name == "lockctl schedule on worker-2 (ttl 15s, lock-delay 15s)"
    assert (terms.ttl, terms.lock_delay, terms.behavior) == (15.0, 15.0, "release")


def test_a_replica_makes_its_session_at_the_start_not_on_its_first_claims_path() -> None:
    """One session per PoolKey at the start (a Raft write off the first claim's path): a
    replica whose turns all find their ticks taken has its session all the same, kept across
    ticks, destroyed at its stop."""
    fleet = Fleet(duration=1.0)
    first = claim_order(KEYS.name, at(0), WORKERS)[0]
    fleet.start(first)
    assert [n.kind for _, n in fleet.said(first, "session-created")] == ["session-created"]
    assert fleet.notes and all(n.kind == "session-created" for _, _, n in fleet.notes)
    fleet.run(35)  # before any turn: made at the start
    assert len(fleet.said(first, "session-created")) == 1  # one, kept across the ticks
