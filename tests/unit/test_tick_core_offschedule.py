"""The tick core's claims outside a tick's own turn, and a reload, in virtual time against the
in-memory Consul: an operator's trigger runs once across the fleet at its own instant, after a
run going on; a catch-up runs the newest tick nobody ran, once, after the replica's first turn;
`update` changes a core's jobs without a tick run twice or a run cut short."""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import datetime, timedelta

from tick_fleet import KEYS, WORKERS, Fleet, at, every_10s

from provision.consul import ConsulUnavailable, PermissionDenied
from provision.ledger.control import ControlNote, manual_tick
from provision.ledger.control import ended as pause_ended
from provision.ledger.records import TickOutcome, TickRecord
from provision.ledger.turns import claim_order
from provision.schedule import parse_schedule
from provision.sessions import SessionTerms
from provision.system.control_keys import paused_key, pauses_key, trigger_key
from provision.tick.core import TRIGGER_WINDOW, CoreJob
from provision.tick.edge import SkipReason
from provision.tick.memory import MemoryTickStore
from provision.tick.store import ControlState, JobKeys
from provision.timings import CatchupReach


def trigger(fleet: Fleet, seconds: float, trigger_id: str = "t-1") -> ControlNote:
    """`lockctl trigger`'s note at `seconds`, written to the job's trigger key, and handed to
    every core (as each one's watch would: all hear it)."""
    note = ControlNote("alice", at(seconds) + timedelta(milliseconds=250), "now", id=trigger_id)
    fleet.store.put(trigger_key(KEYS.name), note.encode())
    for core in fleet.cores.values():
        core.trigger(KEYS.name, note)
    return note


# -- triggers -----------------------------------------------------------------------------------
def test_a_trigger_every_replica_hears_runs_once_at_its_own_instant_and_is_recorded() -> None:
    fleet = Fleet(job=every_10s(), duration=1.0)
    for worker in WORKERS:
        fleet.start(worker)
    fleet.run(3)  # tick 0 ran (1 s) and ended
    note = trigger(fleet, 3)
    fleet.run(4)
    instant = manual_tick(note.at or at(0))
    assert len(fleet.ran(instant)) == 1
    record = fleet.record(instant)
    assert record is not None and record.outcome is TickOutcome.SUCCEEDED
    assert (record.trigger, record.by, record.reason) == ("t-1", "alice", "now")
    assert fleet.store.read_control(KEYS).taken == b"t-1"
    for core in fleet.cores.values():  # heard again (the watch answers again): not run again
        core.trigger(KEYS.name, note)
    fleet.run(4)
    assert len(fleet.ran(instant)) == 1


def test_a_trigger_heard_while_the_job_runs_here_runs_right_after_that_run() -> None:
    fleet = Fleet(workers=("w1",), job=every_10s(workers=("w1",)), duration=5.0)
    fleet.start("w1")
    fleet.run(1)  # tick 0 runs until 5
    note = trigger(fleet, 1)
    instant = manual_tick(note.at or at(0))
    fleet.run(3)
    assert fleet.ran(instant) == []  # not while tick 0 runs: one run of a job at a time
    fleet.run(3)
    assert fleet.ran(instant) == ["w1"]
    started = {tick: body.started_at for _, tick, body in fleet.bodies}
    assert 5.0 <= started[instant] < 6.0


def test_a_trigger_waits_while_another_replica_holds_the_lock_then_runs_once() -> None:
    fleet = Fleet(job=every_10s(), duration=6.0)
    first = claim_order(KEYS.name, at(0), WORKERS)[0]
    for worker in WORKERS:
        fleet.start(worker)
    fleet.run(1)  # `first` runs tick 0 until 6; the others hold no lock
    note = trigger(fleet, 1)
    instant = manual_tick(note.at or at(0))
    fleet.run(4)
    assert fleet.ran(instant) == []
    refused = [
        n
        for _, worker, n in fleet.notes
        if worker != first and n.kind == "skipped" and n.tick == instant
    ]
    assert refused and all(n.skip is SkipReason.OVERLAP for n in refused)
    fleet.run(9)
    assert len(fleet.ran(instant)) == 1
    record = fleet.record(instant)
    assert record is not None and record.trigger == "t-1"


def test_a_trigger_taken_before_a_replica_tries_it_is_never_run_again() -> None:
    fleet = Fleet(workers=("w1",), job=every_10s(workers=("w1",)), duration=1.0)
    fleet.start("w1")
    fleet.run(3)
    note = ControlNote("alice", at(3), "now", id="t-9")
    fleet.store.put(trigger_key(KEYS.name), note.encode())
    fleet.store.put(KEYS.taken, b"t-9")  # another replica ran it, and retention took its record
    fleet.cores["w1"].trigger(KEYS.name, note)
    fleet.run(3)
    assert fleet.ran(manual_tick(at(3))) == []
    skipped = [n for _, n in fleet.said("w1", "skipped") if n.detail == "trigger taken"]
    assert [n.skip for n in skipped] == [SkipReason.TAKEN]


def test_a_trigger_older_than_its_window_is_dropped_unrun() -> None:
    fleet = Fleet(workers=("w1",), job=every_10s(workers=("w1",)), duration=1.0)
    fleet.start("w1")
    fleet.run(3)
    asked = at(3) - timedelta(seconds=TRIGGER_WINDOW + 60)
    note = ControlNote("alice", asked, "long ago", id="t-old")
    fleet.store.put(trigger_key(KEYS.name), note.encode())
    fleet.cores["w1"].trigger(KEYS.name, note)
    fleet.run(3)
    assert fleet.ran(manual_tick(asked)) == []
    assert [n.detail for _, n in fleet.said("w1", "skipped")] == ["trigger expired"]


def test_a_trigger_of_a_paused_job_is_recorded_paused_and_taken() -> None:
    fleet = Fleet(workers=("w1",), job=every_10s(workers=("w1",)), duration=1.0)
    fleet.start("w1")
    fleet.run(3)
    fleet.store.put(paused_key(KEYS.name), ControlNote("ops", at(2), "disk swap").encode())
    note = trigger(fleet, 3)
    fleet.run(3)
    instant = manual_tick(note.at or at(0))
    assert fleet.ran(instant) == []
    record = fleet.record(instant)
    assert record is not None and record.outcome is TickOutcome.PAUSED
    assert fleet.store.read_control(KEYS).taken == b"t-1"


class Unanswering:
    """A replica's store whose control reads Consul does not answer while `down`."""

    def __init__(self, store: MemoryTickStore) -> None:
        self.store, self.down = store, False

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    def read_control(self, job: JobKeys) -> ControlState:
        if self.down:
            raise ConsulUnavailable("simulated: no answer within 10s")
        return self.store.read_control(job)


def test_a_trigger_consul_does_not_answer_is_tried_again() -> None:
    fleet = Fleet(workers=("w1",), job=every_10s(workers=("w1",)), duration=1.0)
    store = Unanswering(fleet.store)
    fleet.start("w1", store=store)
    fleet.run(3)
    store.down = True
    note = trigger(fleet, 3)
    fleet.run(2)
    store.down = False
    fleet.run(5)
    assert fleet.ran(manual_tick(note.at or at(0))) == ["w1"]
    unavailable = fleet.said("w1", "unavailable")
    assert unavailable and all(n.tick is None for _, n in unavailable)  # no tick lost: said


# -- catch-up -----------------------------------------------------------------------------------
def hourly_with_catchup(workers: tuple[str, ...] = ("w1",)) -> CoreJob:
    """Every 10 s, claimable up to 25 s late: a tick whose window closed unclaimed (cut at the
    next tick) can still be caught up while 25 s have not passed."""
    job = every_10s(workers=workers, start_deadline=25.0)
    return replace(job, catchup=True)


def seed_ledger(fleet: Fleet, *ticks: float) -> None:
    for seconds in ticks:
        record = TickRecord(at(seconds), TickOutcome.SUCCEEDED, worker="earlier")
        fleet.store.record_unrun(KEYS, [record])


def test_catch_up_runs_the_newest_tick_nobody_ran_once_after_the_first_turn() -> None:
    fleet = Fleet(workers=("w1",), job=hourly_with_catchup(), duration=1.0)
    seed_ledger(fleet, -40.0)  # the job ran before; then nobody ran -30, -20, -10
    fleet.start("w1")
    fleet.run(5)  # the first turn (tick 0) runs first; then the catch-up of tick -10
    assert fleet.ran(at(0)) == ["w1"]
    assert fleet.ran(at(-10)) == ["w1"]
    assert fleet.ran(at(-20)) == [] and fleet.ran(at(-30)) == []  # older ones stay missed
    caught = fleet.record(at(-10))
    assert caught is not None and caught.catchup is True
    assert caught.outcome is TickOutcome.SUCCEEDED
    order = [tick for _, tick, _ in fleet.bodies]
    assert order.index(at(0)) < order.index(at(-10))
    fleet.run(30)
    assert fleet.ran(at(-10)) == ["w1"]  # once: never looked for in the steady state


def test_two_replicas_coming_back_at_once_catch_up_once() -> None:
    workers = ("w1", "w2")
    fleet = Fleet(workers=workers, job=hourly_with_catchup(workers), duration=1.0)
    seed_ledger(fleet, -40.0)
    for worker in workers:
        fleet.start(worker)
    fleet.run(10)
    assert len(fleet.ran(at(-10))) == 1


def test_catch_up_claims_over_a_missed_record_but_not_over_a_run() -> None:
    fleet = Fleet(workers=("w1",), job=hourly_with_catchup(), duration=1.0)
    seed_ledger(fleet, -40.0)
    fleet.store.record_unrun(KEYS, [TickRecord(at(-10), TickOutcome.MISSED, worker="w9")])
    fleet.start("w1")
    fleet.run(5)
    caught = fleet.record(at(-10))
    assert caught is not None and caught.catchup is True and fleet.ran(at(-10)) == ["w1"]

    other = Fleet(workers=("w1",), job=hourly_with_catchup(), duration=1.0)
    seed_ledger(other, -40.0, -10.0)  # tick -10 ran: nothing to catch up
    other.start("w1")
    other.run(5)
    assert other.ran(at(-10)) == []


def test_a_job_without_catchup_never_runs_a_past_tick() -> None:
    fleet = Fleet(workers=("w1",), job=every_10s(workers=("w1",), start_deadline=25.0))
    seed_ledger(fleet, -40.0)
    fleet.start("w1")
    fleet.run(30)
    assert all(tick >= at(0) for _, tick, _ in fleet.bodies)


def every_10s_catching_up_all(window: float = 3600.0, limit: int = 10) -> CoreJob:
    """Every 10 s on three replicas, catchup = "all" (its start deadline, 30 s, does not
    bound a catch-up: the window does)."""
    return replace(every_10s(), catchup=True, catchup_all=CatchupReach(window, limit))


def caught_up(fleet: Fleet) -> list[datetime]:
    """The ticks run as catch-ups, in the order their runs started."""
    ticks = [tick for _, tick, _ in fleet.bodies]
    return [t for t in ticks if (r := fleet.record(t)) is not None and r.catchup is True]


def test_catch_up_all_runs_every_tick_of_an_outage_oldest_first_once_on_three_replicas() -> None:
    fleet = Fleet(job=every_10s_catching_up_all(), duration=1.0)
    seed_ledger(fleet, -50.0)  # the job ran; then an outage: nobody ran -40, -30, -20, -10
    for worker in WORKERS:
        fleet.start(worker)
    fleet.run(60)
    assert caught_up(fleet) == [at(-40), at(-30), at(-20), at(-10)]
    for seconds in (-40, -30, -20, -10, 0, 10, 20, 30, 40, 50):
        assert len(fleet.ran(at(seconds))) == 1, seconds  # each once across the replicas
    order = [tick for _, tick, _ in fleet.bodies]
    assert order.index(at(0)) < order.index(at(-40))  # the due tick first
    record = fleet.record(at(-40))
    assert record is not None and record.outcome is TickOutcome.SUCCEEDED


def test_catch_up_all_runs_at_most_its_limit_the_newest_of_them() -> None:
    fleet = Fleet(job=every_10s_catching_up_all(limit=3), duration=1.0)
    seed_ledger(fleet, -200.0)  # 19 ticks nobody ran
    for worker in WORKERS:
        fleet.start(worker)
    fleet.run(60)
    assert caught_up(fleet) == [at(-30), at(-20), at(-10)]
    assert all(len(fleet.ran(at(s))) == 1 for s in (-30, -20, -10))


def test_catch_up_all_runs_none_outside_its_window() -> None:
    fleet = Fleet(job=every_10s_catching_up_all(window=45.0), duration=1.0)
    seed_ledger(fleet, -200.0)
    for worker in WORKERS:
        fleet.start(worker)
    fleet.run(60)
    assert caught_up(fleet) == [at(-40), at(-30), at(-20), at(-10)]
    assert not [t for t in fleet.ran_ticks() if t < at(-40)]


def test_catch_up_all_never_runs_a_tick_a_pause_held() -> None:
    fleet = Fleet(job=every_10s_catching_up_all(), duration=1.0)
    seed_ledger(fleet, -50.0)
    pause = ControlNote("ops", at(-35), "held")  # paused at -35, resumed at -15
    fleet.store.put(pauses_key(KEYS.name), pause_ended(pause, at(-15), []))
    for worker in WORKERS:
        fleet.start(worker)
    fleet.run(60)
    assert caught_up(fleet) == [at(-40), at(-10)]
    assert fleet.ran(at(-30)) == [] and fleet.ran(at(-20)) == []
    held = fleet.record(at(-30))
    assert held is not None and held.outcome is TickOutcome.PAUSED  # recorded so, not missed


class SessionRefused:
    """A replica's store on which no session can be made (Consul answers reads only)."""

    def __init__(self, store: MemoryTickStore) -> None:
        self.store, self.looks = store, 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    def create_session(self, terms: SessionTerms) -> str:
        raise ConsulUnavailable("simulated: no answer within 10s")

    def read_tick_names(self, job: JobKeys) -> tuple[set[datetime], datetime | None]:
        self.looks += 1
        return self.store.read_tick_names(job)


def test_a_catch_up_that_cannot_be_claimed_is_looked_for_again_only_after_the_next_turn() -> None:
    fleet = Fleet(workers=("w1",), job=hourly_with_catchup(), duration=1.0)
    seed_ledger(fleet, -40.0)
    store = SessionRefused(fleet.store)
    fleet.start("w1", store=store)
    fleet.run(35)  # turns at 0, 10, 20, 30; a housekeeping at the start
    turns = len(fleet.said("w1", "due"))
    assert turns == 4
    assert store.looks <= turns + 2  # one catch-up look per turn at most, never a spin
    assert fleet.ran(at(-10)) == []


class SlowLook:
    """A replica's store whose catch-up look is answered `late` seconds after it was sent: the
    replica's other timers (the next turn) run meanwhile."""

    def __init__(self, fleet: Fleet, late: float) -> None:
        self.fleet, self.store, self.late = fleet, fleet.store, late

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    def read_tick_names(self, job: JobKeys) -> tuple[set[datetime], datetime | None]:
        answer = self.store.read_tick_names(job)
        self.fleet.clock.advance(self.late)
        return answer


def test_a_catch_up_answered_after_the_next_turn_claimed_waits_for_that_run() -> None:
    fleet = Fleet(workers=("w1",), job=hourly_with_catchup(), duration=6.0)
    seed_ledger(fleet, -40.0)
    fleet.start("w1", store=SlowLook(fleet, 5.0))  # the look at 6 is answered at 11
    fleet.run(40)
    runs = sorted((body.started_at, body.started_at + 6.0, tick) for _, tick, body in fleet.bodies)
    for (_, ended, _), (started, _, _) in itertools.pairwise(runs):
        assert started >= ended  # one run of the job at a time here, one lock, one token
    tokens = [body.run.lock_index for _, _, body in fleet.bodies if body.run is not None]
    assert len(set(tokens)) == len(tokens)


# -- a reload -----------------------------------------------------------------------------------
def ticks_of(fleet: Fleet, job: str) -> list[datetime]:
    return [tick for _, tick, body in fleet.bodies if body.run is not None and body.run.job == job]


def test_update_adds_changes_and_removes_jobs_without_a_tick_twice_or_a_run_cut() -> None:
    fleet = Fleet(workers=("w1",), job=every_10s(workers=("w1",)), duration=4.0)
    core = fleet.start("w1")
    fleet.run(2)  # tick 0 runs until 4
    other_keys = JobKeys("other", "jobs/other/.lock")
    other = CoreJob(other_keys, parse_schedule("@every 5s"), fleet.job.timings, ("w1",))
    slower = replace(fleet.job, schedule=parse_schedule("@every 20s"))
    core.update([slower, other])
    fleet.run(20)
    assert ticks_of(fleet, "report") == [at(0), at(20)]  # the @every 10s plan dropped
    record = fleet.record(at(0))
    assert record is not None and record.outcome is TickOutcome.SUCCEEDED  # run to its end
    # planned from the reload on: its tick 0 claimed 2 s late, run until 6; tick 5, whose turn
    # came meanwhile, claimed as that run ended (1 s late, within its window)
    assert ticks_of(fleet, "other") == [at(0), at(5), at(10), at(15), at(20)]
    core.update([other])  # report removed: no more turns
    fleet.run(30)
    assert ticks_of(fleet, "report") == [at(0), at(20)]
    assert at(50) in ticks_of(fleet, "other")


def test_a_job_removed_while_it_runs_ends_its_run_and_records_it() -> None:
    fleet = Fleet(workers=("w1",), job=every_10s(workers=("w1",)), duration=4.0)
    core = fleet.start("w1")
    fleet.run(2)
    core.update([])
    fleet.run(20)
    assert ticks_of(fleet, "report") == [at(0)]
    record = fleet.record(at(0))
    assert record is not None and record.outcome is TickOutcome.SUCCEEDED
    assert core.runs == []


# -- a refusal is not an outage -----------------------------------------------------------------
class TokenRefused:
    """A replica's store whose claims Consul refuses (403: the token lacks the right)."""

    def __init__(self, store: MemoryTickStore) -> None:
        self.store, self.claims = store, 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    def claim(self, *args: object, **kwargs: object) -> object:
        self.claims += 1
        raise PermissionDenied("PUT /v1/txn: 403", status=403, body="Permission denied")


def test_a_claim_consul_refuses_is_said_refused_and_leaves_the_job_free() -> None:
    fleet = Fleet(workers=("w1",), job=every_10s(workers=("w1",)))
    store = TokenRefused(fleet.store)
    fleet.start("w1", store=store)
    fleet.run(25)  # turns at 0, 10, 20: each tries (the job is not left busy), none claims
    refused = fleet.said("w1", "refused")
    assert [n.tick for _, n in refused] == [at(0), at(10), at(20)]
    assert all(n.detail.startswith("Consul refused the token: ") for _, n in refused)
    assert store.claims == 3
    assert fleet.said("w1", "unanswered") == [] and fleet.said("w1", "unavailable") == []
