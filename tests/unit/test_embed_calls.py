"""A decorated call's turn on the tick core (embed/called.py `Calls`, core.py `take`), in
virtual time on the in-memory Consul: what one call's turn at its tick comes to and the
RunOutcome the call returns (ran, skipped taken / overlap / paused, fail closed when Consul
does not answer, interrupted by a stop), the events the call writes, and when the caller is
let go (never on a quiet moment of the job before the call's own verdict)."""

from __future__ import annotations

import functools
import io
import json
from datetime import datetime
from typing import Any

from tick_fleet import KEYS, START, TIMINGS, WORKERS, Body, at, every_10s

from provision.consul import ConsulUnavailable
from provision.embed.bodies import ThreadBody
from provision.embed.called import Calls, CallTurn, Refusal, call_turn, outcome_of
from provision.embed.run import RunEvents, RunOutcome
from provision.ledger.control import ControlNote
from provision.ledger.records import TickOutcome, TickRecord
from provision.outcomes import Outcome
from provision.runner.results import SkipReason
from provision.system.control_keys import paused_key
from provision.tick.clock import VirtualClock
from provision.tick.core import Identity, TickCore
from provision.tick.held import HeldRun
from provision.tick.memory import MemoryTickStore
from provision.tick.store import JobKeys
from provision.workers.config import JobConfig

JOB = JobConfig(KEYS.name, KEYS.lock_key, TIMINGS, "@every 10s", "UTC", workers=WORKERS)
WITHIN = 120.0  # virtual seconds a turn may take before the test calls it stuck
HELD_FIELDS: Refusal = lambda found, turn: {"reason": "the lock is held"}  # noqa: E731


def _no_body(events: RunEvents) -> ThreadBody:
    raise AssertionError("the test's bodies are made by App._body_of")


class App:
    """One replica's Locker, its calls on a never-started core over a shared clock and store;
    every body it starts is kept, and its events are read back."""

    def __init__(
        self,
        clock: VirtualClock,
        store: MemoryTickStore,
        worker: str = "w1",
        duration: float | None = 2.0,
    ) -> None:
        self.clock, self.worker, self.duration = clock, worker, duration
        self.stream = io.StringIO()
        self.bodies: list[Body] = []
        self.pool_notes: list[str] = []
        self.calls = Calls(self._body_of, lambda note: self.pool_notes.append(note.kind))
        jobs = [every_10s()]
        core = TickCore(store, clock, Identity(worker), jobs, self.calls.body, self.calls.hear)
        self.calls.attach(core)
        self.core = core

    def _body_of(self, turn: CallTurn, held: Any) -> Body:
        assert isinstance(held(), HeldRun)  # the run the core holds for the turn's tick
        made = Body(self.clock, self.duration, ignores_term=False)
        self.bodies.append(made)
        return made

    def begin(self, tick: datetime) -> CallTurn:
        """A call at `tick`: its turn handed to the core's clock, as the caller does."""
        events = RunEvents(JOB.name, self.worker, self.stream, "flag")
        turn = call_turn(JOB, tick, events, _no_body, self.clock)
        self.clock.call_at(self.clock.monotonic(), functools.partial(self.calls.take, turn))
        return turn

    def call(self, tick: datetime, refusal: Refusal = HELD_FIELDS) -> RunOutcome:
        turn = self.begin(tick)
        until(self.clock, lambda: turn.quiet.is_set())
        return outcome_of(turn.verdict(), turn, refusal, None)

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stream.getvalue().splitlines()]


def until(clock: VirtualClock, done: Any) -> None:
    end = clock.monotonic() + WITHIN
    while not done():
        due = clock.next_due()
        assert due is not None and due <= end, "never came"
        clock.advance_to(due)


def _world(seconds: float) -> tuple[VirtualClock, MemoryTickStore]:
    clock = VirtualClock(START)
    clock.advance(seconds)
    return clock, MemoryTickStore(clock)


def _record(store: MemoryTickStore, tick: datetime) -> TickRecord | None:
    return store.read_tick(KEYS, tick)[0]


def test_a_free_tick_runs_here_and_the_call_says_ran() -> None:
    clock, store = _world(10.05)
    app = App(clock, store)
    outcome = app.call(at(10))
    assert (outcome.outcome, outcome.ran, outcome.succeeded) == (Outcome.RAN, True, True)
    assert (outcome.tick, outcome.lock_index, outcome.exit_status) == (at(10), 1, 0)
    recorded = _record(store, at(10))
    assert recorded is not None and recorded.outcome is TickOutcome.SUCCEEDED
    assert store.watch_lock(KEYS, 0, 0)[0] is None  # released
    assert [e["event"] for e in app.events()] == ["released"]
    assert app.pool_notes[0] == "session-created"  # the Locker's own, not the call's


def test_of_two_replicas_calling_at_once_one_runs_the_other_is_told_taken() -> None:
    clock, store = _world(10.05)
    one, two = App(clock, store, "w1"), App(clock, store, "w2")
    turns = [one.begin(at(10)), two.begin(at(10))]
    until(clock, lambda: all(turn.quiet.is_set() for turn in turns))
    taken: Refusal = lambda found, turn: {"reason": "taken"}  # noqa: E731
    ran, skipped = (outcome_of(t.verdict(), t, taken, None) for t in turns)
    assert ran.outcome is Outcome.RAN and one.bodies
    assert (skipped.outcome, skipped.skip, skipped.ran) == (
        Outcome.SKIPPED,
        SkipReason.TAKEN,
        False,
    )
    assert not two.bodies
    (said,) = two.events()
    assert (said["event"], said["tick"], said["reason"]) == (
        "skipped",
        "2026-01-01T00:00:10Z",
        "taken",
    )


def test_the_previous_tick_still_running_elsewhere_is_an_overlap() -> None:
    clock, store = _world(10.05)
    long = App(clock, store, "w1", duration=15.0)  # outlasts its interval
    first = long.begin(at(10))
    clock.advance_to(20.05)
    outcome = App(clock, store, "w2").call(at(20))
    assert (outcome.outcome, outcome.skip) == (Outcome.SKIPPED, SkipReason.OVERLAP)
    assert not first.quiet.is_set() and _record(store, at(20)) is None


def test_a_quiet_moment_before_the_calls_verdict_does_not_let_the_caller_go() -> None:
    clock, store = _world(10.05)
    app = App(clock, store, duration=3.0)
    turn = app.begin(at(10))
    clock.advance(0.0)  # the turn taken: claimed, its body running
    assert [note.kind for note in turn.notes] == ["claimed"]
    app.calls.quiet(JOB.name)  # say an earlier call's leftovers end now
    assert not turn.quiet.is_set()
    until(clock, lambda: turn.quiet.is_set())
    assert turn.verdict().came is Outcome.CLAIMED


def test_a_paused_job_is_skipped_paused_and_starts_nothing() -> None:
    clock, store = _world(10.05)
    store.put(paused_key(KEYS.name), ControlNote("ops", at(2), "disk swap").encode())
    app = App(clock, store)
    outcome = app.call(at(10))
    assert (outcome.outcome, outcome.skip) == (Outcome.SKIPPED, SkipReason.PAUSED)
    assert not app.bodies
    (said,) = app.events()
    assert said["event"] == "skipped" and "ops" in said["reason"]


class Unanswering(MemoryTickStore):
    """Consul that does not answer a tick's read."""

    def read_tick(
        self, job: JobKeys, tick: datetime, *, stale: bool = False
    ) -> tuple[TickRecord | None, datetime | None]:
        raise ConsulUnavailable("connection refused")


def test_consul_not_answering_fails_closed_and_no_body_runs() -> None:
    clock = VirtualClock(START)
    clock.advance(10.05)
    app = App(clock, Unanswering(clock))
    outcome = app.call(at(10))
    assert (outcome.outcome, outcome.skip) == (Outcome.SKIPPED, SkipReason.OTHER)
    assert outcome.error == "connection refused" and not app.bodies
    (said,) = app.events()
    assert (said["event"], said["error"]) == ("consul-unavailable", "connection refused")


def test_a_stop_interrupts_the_run_and_lets_the_caller_go_once_the_sessions_are_gone() -> None:
    clock, store = _world(10.05)
    app = App(clock, store, duration=None)  # ends only when told
    turn = app.begin(at(10))
    clock.advance(1.0)
    assert app.bodies and not turn.quiet.is_set()

    ended: list[bool] = []  # whether the callers were still held when the end was said

    def stop() -> None:
        ended_now = lambda: ended.append(app.calls.settled.is_set())  # noqa: E731
        app.calls.stop(lambda: clock.call_later(0.05, stop), ended_now)

    stop()
    until(clock, app.calls.settled.is_set)
    assert ended == [False]
    outcome = outcome_of(turn.verdict(), turn, HELD_FIELDS, None)
    assert outcome.outcome is Outcome.INTERRUPTED
    recorded = _record(store, at(10))
    assert recorded is not None and recorded.outcome is TickOutcome.INTERRUPTED
    assert store.watch_lock(KEYS, 0, 0)[0] is None and app.core.pool.closed
    # a call after the stop takes nothing: told it was interrupted, no body
    later = app.begin(at(20))
    clock.advance(0.0)
    assert later.quiet.is_set() and len(app.bodies) == 1
    assert outcome_of(later.verdict(), later, HELD_FIELDS, None).outcome is Outcome.INTERRUPTED


def test_a_renewal_while_the_call_runs_is_said_with_the_calls_events() -> None:
    clock, store = _world(10.05)
    app = App(clock, store, duration=12.0)  # outlives two renew intervals (5 s)
    outcome = app.call(at(10))
    assert outcome.outcome is Outcome.RAN
    said = [e["event"] for e in app.events()]
    assert said[-1] == "released" and said.count("renewed") == 2, said
    clock.advance(11.0)  # the session is still renewed: no call's any more
    assert [e["event"] for e in app.events()].count("renewed") == 2
    assert app.pool_notes.count("renewed") == 4
