"""`lockctl run`'s one tick on the tick core (tick/once.py, core.py `take`), in virtual time on
the in-memory Consul: the turn's read, judgement, claim, run under the held lock and completion
are the core's own; what is checked here is what one turn at one tick comes to (the verdict a
run turns into its exit status), that nothing is planned after it, and the --wait shape (a
claim refused for the lock, taken again once the lock is free)."""

from __future__ import annotations

import functools
from dataclasses import replace
from datetime import datetime

import pytest
from tick_fleet import KEYS, START, Body, at, every_10s

from provision.blackouts import Blackout
from provision.consul import ConsulUnavailable
from provision.ledger.control import ControlNote, ended
from provision.ledger.records import TickOutcome, TickRecord
from provision.ledger.ticks import PRUNE_SLACK
from provision.outcomes import Outcome
from provision.schedule import parse_schedule
from provision.system.control_keys import paused_key, pauses_key
from provision.tick.clock import VirtualClock
from provision.tick.core import CoreJob, Identity, TickCore
from provision.tick.edge import Note, SkipReason, StopHow
from provision.tick.memory import MemoryTickStore
from provision.tick.once import OneTick, Verdict, verdict, wait_deadline
from provision.tick.store import JobKeys, TickStore
from provision.timings import CatchupReach

QUIET_WITHIN = 120.0  # virtual seconds a turn may take before the test calls it stuck


class Runner:
    """One `lockctl run` of one worker: a TickCore for its one job, never started, on a shared
    clock and store; every body it starts is kept."""

    def __init__(
        self,
        clock: VirtualClock,
        store: TickStore,
        worker: str = "w1",
        job: CoreJob | None = None,
        duration: float | None = 2.0,
    ) -> None:
        self.clock, self.store, self.duration = clock, store, duration
        self.job = job or every_10s()
        self.bodies: list[tuple[datetime, Body]] = []
        self.one = OneTick(self.job.name)
        self.core = TickCore(store, clock, Identity(worker), [self.job], self._body, self.one.hear)
        self.one.attach(self.core)

    def _body(self, job: str, tick: datetime) -> Body:
        made = Body(self.clock, self.duration, ignores_term=False)
        self.bodies.append((tick, made))
        return made

    def begin(self, tick: datetime, *, catchup: bool = False) -> None:
        self.clock.call_at(self.clock.monotonic(), lambda: self.one.take(tick, catchup=catchup))
        self.one.quiet.clear()

    def take(self, tick: datetime, *, catchup: bool = False) -> Verdict:
        """The turn at `tick`, to its end: its verdict."""
        self.begin(tick, catchup=catchup)
        self.until_quiet()
        return self.one.verdict(tick)

    def until_quiet(self) -> None:
        end = self.clock.monotonic() + QUIET_WITHIN
        while not self.one.quiet.is_set():
            due = self.clock.next_due()
            assert due is not None and due <= end, "the core never became quiet"
            self.clock.advance_to(due)

    def said(self, kind: str) -> list[Note]:
        return [note for note in self.one.notes if note.kind == kind]


def _world(seconds: float) -> tuple[VirtualClock, MemoryTickStore]:
    clock = VirtualClock(START)
    clock.advance(seconds)
    return clock, MemoryTickStore(clock)


def _record(store: MemoryTickStore, tick: datetime) -> TickRecord | None:
    return store.read_tick(KEYS, tick)[0]


def test_a_free_tick_is_claimed_run_completed_and_released() -> None:
    clock, store = _world(10.05)
    runner = Runner(clock, store)
    found = runner.take(at(10))
    assert found.came is Outcome.CLAIMED
    assert found.record is not None and found.record.outcome is TickOutcome.SUCCEEDED
    assert found.record.exit_status == 0 and found.record.lock_index == 1
    recorded = _record(store, at(10))  # the record as completed is Consul's
    assert recorded == replace(found.record, modify_index=recorded.modify_index if recorded else 0)
    assert store.watch_lock(KEYS, 0, 0)[0] is None  # released
    ((tick, body),) = runner.bodies
    assert tick == at(10) and body.run is not None and body.run.tick == at(10)


def test_nothing_is_planned_after_the_one_tick() -> None:
    clock, store = _world(10.05)
    runner = Runner(clock, store)
    runner.take(at(10))
    clock.advance(60)  # ticks 20..70 come and go
    assert [tick for tick, _ in runner.bodies] == [at(10)]
    assert not runner.said("due") and len(runner.said("claimed")) == 1


def test_a_timer_that_fires_late_still_owns_its_tick_within_its_window() -> None:
    clock, store = _world(17.5)  # 7.5 s late; tick 10's window is its interval, 10 s
    found = Runner(clock, store).take(at(10))
    assert found.came is Outcome.CLAIMED and found.record is not None
    # on Consul's clock as its Date says it: whole seconds, so 17.5 reads 17
    assert found.record.start_lag == pytest.approx(7.0)


def test_a_tick_whose_window_closed_is_too_late_and_claims_nothing() -> None:
    clock, store = _world(21.0)
    found = Runner(clock, store).take(at(10))
    assert found.came is Outcome.MISSED
    assert _record(store, at(10)) is None


def test_a_tick_long_past_is_not_recorded_missed_by_the_one_tick() -> None:
    """A host clock far behind picks a tick whose record retention may have deleted after it
    ran: the one tick records nothing over it (lockctl run's own rule judges a too-late tick),
    and no later look at its fate is left behind (the process ends after the tick)."""
    clock, store = _world(45.0)  # tick 10's window closed at 20
    runner = Runner(clock, store)
    assert runner.take(at(10)).came is Outcome.MISSED
    clock.advance(60)
    assert _record(store, at(10)) is None
    assert not runner.said("missed")


def test_a_tick_another_worker_took_is_skipped_taken_and_waiting_cannot_help() -> None:
    clock, store = _world(10.05)
    Runner(clock, store, "w2").take(at(10))
    index = store.raft_index
    runner = Runner(clock, store, "w1")
    found = runner.take(at(10))
    assert (found.came, found.skip) == (Outcome.SKIPPED, SkipReason.TAKEN)
    assert not found.lock_refused
    assert store.raft_index == index  # the read found it taken: no write, not even a session
    assert not runner.bodies


def test_a_lock_held_by_the_previous_ticks_run_is_refused_then_won_once_free() -> None:
    """--wait's shape: a claim refused because the lock is held is taken again once the
    holder released it, and wins with the next fencing token."""
    clock, store = _world(10.05)
    before = Runner(clock, store, "w2", duration=12.0)  # tick 10 runs until 22
    before.begin(at(10))
    clock.advance_to(20.05)
    runner = Runner(clock, store, "w1")
    refused = runner.take(at(20))
    assert (refused.came, refused.skip) == (Outcome.SKIPPED, SkipReason.OVERLAP)
    assert refused.lock_refused and not runner.bodies
    before.until_quiet()  # released at 22 (a release: no lock-delay)
    assert clock.wall() < runner.one.plan(at(20)).closes
    won = runner.take(at(20))
    assert won.came is Outcome.CLAIMED and won.record is not None
    assert won.record.worker == "w1" and won.record.lock_index == 2


def test_the_wait_for_the_lock_ends_when_the_ticks_window_closes() -> None:
    clock, store = _world(20.5)
    runner = Runner(clock, store)
    plan = runner.one.plan(at(20))
    deadline = wait_deadline(plan, clock.wall(), clock.monotonic())
    assert deadline == pytest.approx(30.0)  # tick 20's window is its 10 s interval


def test_a_paused_job_records_its_tick_paused_and_starts_nothing() -> None:
    clock, store = _world(10.05)
    store.put(paused_key(KEYS.name), ControlNote("ops", at(2), "disk swap").encode())
    runner = Runner(clock, store)
    found = runner.take(at(10))
    assert (found.came, found.skip) == (Outcome.PAUSED, SkipReason.PAUSED)
    assert found.record is not None and found.record.by == "ops"
    recorded = _record(store, at(10))
    assert recorded is not None and recorded.outcome is TickOutcome.PAUSED
    assert not runner.bodies and store.watch_lock(KEYS, 0, 0)[0] is None


def test_a_run_whose_session_ends_is_fenced_and_its_tick_recorded_lost() -> None:
    clock, store = _world(10.05)
    runner = Runner(clock, store, duration=None)  # runs until told
    runner.begin(at(10))
    clock.advance(1)
    (held,) = runner.core.runs
    store.destroy_session(held.claimed.session)
    runner.until_quiet()
    found = runner.one.verdict(at(10))
    assert found.came is Outcome.CLAIMED and found.record is not None
    assert found.record.outcome is TickOutcome.LOST
    body = runner.bodies[0][1]
    assert body.told and body.told[0][1] is StopHow.TERMINATE
    assert [note.kind for note in runner.one.notes].index("fenced") < [
        note.kind for note in runner.one.notes
    ].index("completed")


def test_a_stop_interrupts_the_run_completes_it_and_destroys_the_session() -> None:
    clock, store = _world(10.05)
    runner = Runner(clock, store, duration=None)
    runner.begin(at(10))
    clock.advance(1)
    runner.one.quiet.clear()
    clock.call_at(clock.monotonic(), runner.one.stop)
    runner.until_quiet()
    found = runner.one.verdict(at(10))
    assert found.came is Outcome.CLAIMED and found.record is not None
    assert found.record.outcome is TickOutcome.INTERRUPTED
    assert runner.core.pool.closed and store.watch_lock(KEYS, 0, 0)[0] is None


def test_a_catch_up_runs_after_the_tick_and_the_verdict_stays_the_ticks() -> None:
    clock, store = _world(0.05)
    job = replace(every_10s(), catchup=True)
    Runner(clock, store, job=job).take(at(0))  # the ledger's first record
    clock.advance_to(31.05)  # ticks 10 and 20 came and went with nobody running
    runner = Runner(clock, store, job=job)
    found = runner.take(at(30), catchup=True)
    assert (
        found.came is Outcome.CLAIMED and found.record is not None and found.record.tick == at(30)
    )
    caught = _record(store, at(20))
    assert caught is not None and caught.catchup and caught.outcome is TickOutcome.SUCCEEDED
    assert [tick for tick, _ in runner.bodies] == [at(30), at(20)]  # its own tick first
    # said before its claim, with the record it claims over: the run's housekeeping had
    # recorded tick 20 missed (its window closed at 30, its grace at 32; the run ended at 33,
    # Consul's Date 33: at 32.05 the Date, 32, would not call it missed yet)
    (look,) = runner.said("catch-up")
    assert look.tick == at(20) and look.record is not None
    assert look.record.outcome is TickOutcome.MISSED


def test_a_run_catching_up_all_runs_each_tick_nobody_ran_oldest_first_then_returns() -> None:
    clock, store = _world(0.05)
    job = replace(every_10s(), catchup=True, catchup_all=CatchupReach(3600.0, 10))
    Runner(clock, store, job=job).take(at(0))  # the ledger's first record
    clock.advance_to(41.05)  # ticks 10, 20 and 30 came and went with nobody running
    runner = Runner(clock, store, job=job, duration=0.5)
    found = runner.take(at(40), catchup=True)
    assert found.came is Outcome.CLAIMED and found.record is not None
    assert found.record.tick == at(40)  # the verdict stays its own tick's
    assert [tick for tick, _ in runner.bodies] == [at(40), at(10), at(20), at(30)]
    for tick in (at(10), at(20), at(30)):
        caught = _record(store, tick)
        assert caught is not None and caught.catchup and caught.outcome is TickOutcome.SUCCEEDED


def test_no_catch_up_of_a_tick_a_pause_held_though_it_was_resumed_meanwhile() -> None:
    clock, store = _world(0.05)
    job = replace(every_10s(), catchup=True)
    Runner(clock, store, job=job).take(at(0))
    pause = ControlNote("ops", at(5), "held")  # paused at 5, resumed at 28: ticks 10, 20 held
    store.put(pauses_key(KEYS.name), ended(pause, at(28), []))
    clock.advance_to(30.05)
    # a short run: tick 20 is not recorded yet when the catch-up is looked for (its window
    # closed at 30, MISSED_GRACE after that it may be recorded)
    runner = Runner(clock, store, job=job, duration=0.5)
    found = runner.take(at(30), catchup=True)
    assert found.came is Outcome.CLAIMED
    assert [tick for tick, _ in runner.bodies] == [at(30)]
    assert not [note for note in runner.said("claimed") if note.tick == at(20)]


class Unanswered:
    """A store that does not answer reads of ticks (Consul down)."""

    def __init__(self, store: MemoryTickStore) -> None:
        self.store = store

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    def read_tick(
        self, job: JobKeys, tick: datetime, *, stale: bool = False
    ) -> tuple[TickRecord | None, datetime | None]:
        raise ConsulUnavailable("simulated: no answer within 10s")


def test_consul_not_answering_the_read_fails_the_turn_without_a_claim() -> None:
    clock, store = _world(10.05)
    runner = Runner(clock, Unanswered(store))  # type: ignore[arg-type]
    found = runner.take(at(10))
    assert (found.came, found.failure) == (Outcome.ERROR, "unavailable")
    assert "no answer" in found.detail
    assert _record(store, at(10)) is None and not runner.bodies


# -- the verdict, from notes alone ----------------------------------------------------------------
def _note(kind: str, seconds: float, **more: object) -> Note:
    return Note(kind, KEYS.name, at(seconds), **more)  # type: ignore[arg-type]


def test_a_claimed_tick_is_settled_only_by_its_completion() -> None:
    claimed = TickRecord(at(10), TickOutcome.RUNNING, worker="w1", lock_index=3)
    done = claimed.completed(TickOutcome.FAILED, finished_at=at(12), exit_status=7)
    notes = [_note("claimed", 10, record=claimed)]
    assert verdict(notes, at(10)).came is Outcome.UNSETTLED
    notes.append(_note("completed", 10, record=done))
    found = verdict(notes, at(10))
    assert found.came is Outcome.CLAIMED and found.record == done


def test_notes_of_other_ticks_do_not_settle_the_tick() -> None:
    other = TickRecord(at(0), TickOutcome.SUCCEEDED, worker="w1")
    notes = [
        _note("completed", 0, record=other),  # a catch-up's, say
        _note("skipped", 10, detail="lock held", skip=SkipReason.OVERLAP),
    ]
    found = verdict(notes, at(10))
    assert (found.came, found.skip, found.lock_refused) == (
        Outcome.SKIPPED,
        SkipReason.OVERLAP,
        True,
    )
    assert verdict(notes, at(20)).came is Outcome.UNSETTLED


def test_a_failure_does_not_hide_what_settled_the_tick() -> None:
    notes = [_note("too-late", 10), _note("unavailable", 10, detail="no answer")]
    assert verdict(notes, at(10)).came is Outcome.MISSED
    assert verdict([notes[1]], at(10)).came is Outcome.ERROR


def test_per_tick_runs_keep_the_ledger_to_its_limit_before_each_run_is_quiet() -> None:
    """Each `lockctl run` housekeeps after its run, and its process ends at the quiet: the
    retention must be over by then (on a real store the read waits aside, and a stop at the
    quiet left every per-tick run's retention to nobody: the ledger grew without bound)."""
    clock, store = _world(0.05)
    job = replace(every_10s(workers=("w1",)), history_limit=10)
    at_quiet: list[int] = []
    for n in range(16):
        clock.advance_to(clock.monotonic() + (at(10 * n) - clock.wall()).total_seconds() + 0.05)
        runner = Runner(clock, store, job=job, duration=1.0)
        runner.core.on_quiet = functools.partial(_counted_quiet, runner.one, store, at_quiet)
        assert runner.take(at(10 * n)).came is Outcome.CLAIMED
    assert len(at_quiet) == 16
    limit = 10 + max(1, int(10 * PRUNE_SLACK))
    assert max(at_quiet) <= limit, at_quiet
    assert max(at_quiet) > 10  # it grew past the limit, and was pruned back each time


def _counted_quiet(one: OneTick, store: MemoryTickStore, counts: list[int], name: str) -> None:
    """OneTick's own on_quiet, after counting the records in the ledger at that moment."""
    counts.append(len(store.read_tick_names(KEYS)[0]))
    one._on_quiet(name)


def test_a_tick_in_a_blackout_window_is_recorded_blackout_and_starts_nothing() -> None:
    clock, store = _world(10.05)
    window = Blackout("freeze", parse_schedule("@every 1m"), 30.0)  # holds 0 to 29 s
    runner = Runner(clock, store, job=replace(every_10s(), blackouts=(window,)))
    found = runner.take(at(10))
    assert (found.came, found.skip, found.detail) == (
        Outcome.BLACKOUT,
        SkipReason.BLACKOUT,
        "freeze",
    )
    recorded = _record(store, at(10))
    assert recorded is not None and recorded.outcome is Outcome.BLACKOUT
    assert recorded.window == "freeze" and recorded.worker == "w1"
    assert found.record is not None and found.record.window == "freeze"
    again = Runner(clock, store, worker="w2", job=runner.job).take(at(10))  # read, not written
    assert again.came is Outcome.BLACKOUT and again.record == recorded  # as read: its index
    assert not runner.bodies and store.watch_lock(KEYS, 0, 0)[0] is None
