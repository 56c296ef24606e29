"""A decorated call, and `with locker.tick(job)`, on the tick core (provision/tick/): the
Locker's one TickCore for every call of its jobs, never started (no turn of its own), as
`lockctl run`'s one tick (runner/on_core.py, tick/once.py).

    the clock thread   one ThreadTimerClock on the agent's clock, made at the Locker's first
                       call: each call's turn at its tick (`TickCore.take`: read, judged on
                       Consul's clock, claimed, the body under the held lock, completed and
                       released), the sessions' renewals, the fencing bounds, housekeeping
    the caller         plans the tick of this moment (as before: the cheap skip of a taken
                       tick), hands the turn to the clock thread, waits until it is over, and
                       turns its verdict (tick/once.py `verdict`) into the call's RunOutcome
    the events         a call's notes said as `lockctl run` says them (runner/on_core.py Said),
                       through the call's RunEvents: `fenced` and `timed-out` reach its Run
                       (on_lost="exit" ends the process there); the sessions' under
                       `lockctl-embed`

One call of a job at a time (the Locker refuses a second one, overlap): a call's notes are
the job's notes while it runs, so they are routed by the job's name. The body is serve()'s
(served.py AppBody): it learns its fencing from the run the core holds, so `run.check()`,
`run.lost` and an isolated body's warden behave as under serve().
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TextIO

from provision.consul import AgentClock, Consul
from provision.embed.bodies import ThreadBody
from provision.embed.run import RunEvents, RunOutcome
from provision.embed.served import EMBED_EVENTS, AppBody, on_clock
from provision.ledger.control import ControlNote
from provision.ledger.records import tick_name
from provision.notify.notifier import JobNotify, Notifier
from provision.notify.sender import DRAIN, Delivery, Lanes, result_event
from provision.outcomes import Outcome
from provision.runner.events import EventLog
from provision.runner.on_core import CORE_RETRY, Said, TickAsk, ran_result, skip_fields
from provision.runner.results import RunOptions, SkipReason
from provision.runner.tick_verdicts import paused_refusal
from provision.scheduler.on_core import BodySaid, GuardedClock, core_job, record_reader
from provision.scheduler.report import note_events, unexpected
from provision.scheduler.triggers import TriggerWatch
from provision.tick.aside import aside_store
from provision.tick.clock import Clock
from provision.tick.consul_store import ConsulTickStore, TailedStore, Tails, note_with_tails
from provision.tick.core import Identity, TickCore
from provision.tick.edge import Body, Note, Run, TimerClock
from provision.tick.held import HeldRun
from provision.tick.once import Verdict, verdict
from provision.workers.config import JobConfig

WAIT_POLL = 0.1  # seconds between two looks at a stopping core while a call waits for its turn
SETTLE_POLL = 0.05  # seconds between two looks at a stopping core's runs and sessions


class CallTurn:
    """One call's turn at its tick: what makes its body, its events, the core's notes of its
    job while it runs, and `quiet` once the turn is over."""

    def __init__(
        self,
        config: JobConfig,
        tick: datetime,
        events: RunEvents,
        make: Callable[[RunEvents], ThreadBody],
        said: Said,
    ) -> None:
        self.config, self.tick, self.events, self.make, self.said = config, tick, events, make, said
        self.notes: list[Note] = []
        self.quiet = threading.Event()
        self.bodies: list[AppBody] = []  # each attempt's (a retry makes another)
        self.session: str | None = None  # the session its claim won the lock under

    @property
    def name(self) -> str:
        """The job's unit: its name, or `job/key` for a keyed call."""
        return self.config.unit

    def hear(self, note: Note) -> None:
        self.notes.append(note)
        if note.kind == "claimed" and note.record is not None and note.tick == self.tick:
            self.session = note.record.session  # its run holds the lock under it
        self.said(note)

    def verdict(self) -> Verdict:
        return verdict(self.notes, self.tick)

    def tails(self, tick: datetime) -> Tails | None:
        """The ends of the body's output kept for the record (a thread's: its exception)."""
        body = self.bodies[-1] if self.bodies and tick == self.tick else None
        return None if body is None else body.tails

    @property
    def error(self) -> str | None:
        return self.bodies[-1].body.error if self.bodies else None


class CallBody(AppBody):
    """serve()'s body of an app's run, whose start is said as `lockctl run` says it:
    `acquired` (its PID, its containment), or `retry-started` for a retry's attempt."""

    def __init__(
        self, made: ThreadBody, turn: CallTurn, clock: TimerClock, held: Callable[[], HeldRun]
    ) -> None:
        quiet = BodySaid(lambda body: None, lambda why: None)
        super().__init__(made, turn.config.lock_key, clock, held, quiet)
        self.turn = turn

    def start(self, run: Run, ended: Callable[[], None]) -> None:
        super().start(run, ended)
        said, body = self.turn.said, self.body
        if run.attempt != 1:
            said.event("retry-started", run.tick, attempt=run.attempt, child_pid=body.pid)
            return
        said.body_started(run, body.pid, body.containment)


@dataclass(frozen=True)
class CallSetting:
    """What the Locker gives its call core: its client and Consul clock, who it is, where
    the sessions' events go, its scheduled jobs, and their notifications (URLs read when the
    Locker was made)."""

    consul: Consul
    wall: AgentClock
    worker: str
    stream: TextIO | None
    jobs: tuple[JobConfig, ...]
    notify: tuple[JobNotify, ...] = ()


BodyOf = Callable[[CallTurn, Callable[[], HeldRun]], Body]  # a turn's body, and its held run


class Calls:
    """The calls' side of the core, on its clock thread: a turn taken, the core's notes routed
    to the call of their job (the session pool's to `pool`), a turn ended once its verdict is
    settled, a stop settled once no run is left and the sessions are destroyed."""

    def __init__(
        self,
        body_of: BodyOf,
        pool: Callable[[Note], None],
        told: Callable[[Note], None] = lambda note: None,
    ) -> None:
        self.body_of, self.pool, self.told = body_of, pool, told  # told: the notifier
        self.core: TickCore | None = None
        self.calls: dict[str, CallTurn] = {}  # each job's call now (or its last one)
        self.settled = threading.Event()  # stopped: no run left, the sessions destroyed

    def attach(self, core: TickCore) -> None:
        """Build the core with `bodies=calls.body, listener=calls.hear`, then attach it."""
        self.core = core
        core.on_quiet = self.quiet
        core.fates = False  # as before: a call looks at no other tick than its own

    def take(self, turn: CallTurn) -> None:
        """The turn at `turn.tick`; `turn.quiet` once it is over."""
        assert self.core is not None
        self.calls[turn.name] = turn
        if self.core.stopping:
            turn.quiet.set()  # unsettled: the call says it was interrupted
            return
        if turn.config.key is not None:  # a keyed call's key: known from its first call
            self.core.adopt(core_job(turn.config))
        self.core.take(turn.name, turn.tick)

    def stop(self, look_again: Callable[[], object], ended: Callable[[], None]) -> None:
        """No more turns; the runs under way told to stop (SIGTERM), completed, released; then
        the sessions destroyed, `ended` told, and `settled` set (`look_again` asks for another
        look later). `ended` comes first: what it says is written before any caller waiting
        for its turn is let go (and writes what its call returned)."""
        assert self.core is not None
        if not self.core.stopping:
            self.core.stop()
        if not self.core.runs and self.core.pool.closed:
            ended()
            self.settled.set()
        else:
            look_again()

    def quiet(self, name: str) -> None:
        """The core is done with the job: its call's turn is over once its verdict is settled
        (a quiet moment of the job before the call's own claim, or the end of an earlier
        call's housekeeping, settles nothing)."""
        turn = self.calls.get(name)
        stopping = self.core is not None and self.core.stopping
        if turn is not None and (turn.verdict().came is not Outcome.UNSETTLED or stopping):
            turn.quiet.set()

    def hear(self, note: Note) -> None:
        if not note.job:
            self.pool(note)
            self._renewal(note)
            return
        turn = self.calls.get(note.job)
        if turn is not None:
            turn.hear(note)
        self.told(note_with_tails(note, self.tails))

    def _renewal(self, note: Note) -> None:
        """A renewal of a session a call's run holds its lock under is said with the call's
        events too (`renewed` and its round trip, `renew-failed`), as `lockctl run` says it."""
        if note.kind not in ("renewed", "renew-failed"):
            return
        for turn in self.calls.values():
            if not turn.quiet.is_set() and note.session == turn.session:
                turn.said(note)

    def body(self, name: str, tick: datetime) -> Body:
        turn = self.calls[name]
        return self.body_of(turn, functools.partial(self.held, name, tick))

    def held(self, name: str, tick: datetime) -> HeldRun:
        assert self.core is not None
        runs = self.core.runs
        held = next((r for r in runs if r.claimed.keys.unit == name and r.tick == tick), None)
        assert held is not None, "the core starts a body only for a run it holds"
        return held

    def tails(self, name: str, tick: datetime) -> Tails | None:
        turn = self.calls.get(name)
        return None if turn is None else turn.tails(tick)


class CallCore:
    """The Locker's TickCore for its calls, on its own clock thread (made at the first call,
    ended by `stop` and `close`: the runs under way interrupted, completed, released; the
    sessions destroyed)."""

    def __init__(self, setting: CallSetting) -> None:
        self.setting = setting
        self.events = EventLog(EMBED_EVENTS, setting.worker, setting.stream)
        self.clock = GuardedClock(setting.wall, self._unexpected)
        # notifications, as serve()'s: a queue and thread per notify block's name, apart from
        # the calls' ticks; ended by close()
        self.lanes = Lanes(self._notified)
        notifier = Notifier(self.lanes, record_reader(setting.consul))
        notifier.update(setting.notify)
        self.calls = Calls(self._body_of, self._pool_note, notifier)
        self.store = TailedStore(setting.consul.with_retry(CORE_RETRY), self.calls.tails)
        identity = Identity(setting.worker, socket.gethostname(), os.getpid())
        jobs = [core_job(job) for job in setting.jobs]
        store = aside_store(self.store, self.clock)
        core = TickCore(store, self.clock, identity, jobs, self.calls.body, self.calls.hear)
        self.calls.attach(core)
        self.live: list[str] = []  # the sessions made and not gone
        self.control: TriggerWatch | None = None  # `lockctl abort`, heard from a first run on
        self._watch_stop = threading.Event()
        self.thread = threading.Thread(target=self.clock.run, name="lockctl-embed", daemon=True)
        self.lanes.start()
        self.thread.start()

    def take(self, turn: CallTurn) -> Verdict:
        """The turn at `turn.tick`, on the clock thread; its verdict once it is over (or the
        core stopped meanwhile)."""
        self.clock.call_at(self.clock.monotonic(), functools.partial(self.calls.take, turn))
        while not turn.quiet.wait(WAIT_POLL) and not self.calls.settled.is_set():
            pass
        return turn.verdict()

    def stop(self) -> None:
        """No more turns; the runs under way told to stop, then the sessions destroyed."""
        self.clock.call_at(self.clock.monotonic(), self._stop)

    def _stop(self) -> None:
        if not self.calls.settled.is_set():
            self.calls.stop(lambda: self.clock.call_later(SETTLE_POLL, self._stop), self._ended)

    def _ended(self) -> None:
        for session in self.live:
            self.events.emit("session-destroyed", session=session)
        self.live.clear()

    def close(self, timeout: float) -> None:
        """Wait (up to `timeout`) for the stop to settle, then end the clock thread."""
        self.calls.settled.wait(timeout)
        self._watch_stop.set()  # its read out ends by itself (a daemon): nothing handed on after
        self.clock.close()
        self.thread.join(timeout)
        self.lanes.close(DRAIN)  # what the last runs decided gets DRAIN seconds to be sent

    def _body_of(self, turn: CallTurn, held: Callable[[], HeldRun]) -> Body:
        body = CallBody(turn.make(turn.events), turn, self.clock, held)
        turn.bodies.append(body)
        if self.control is None:  # a first run: from now on an abort note may name a run
            self.control = self._control_watch()
            self.control.start()
        return body

    def _control_watch(self) -> TriggerWatch:
        """One blocking query of the control keys for every call of the Locker (as `lockctl
        schedule`'s): each abort note heard goes to the core on its clock's thread, which stops
        a run only if the note names it (its tick and its session). Triggers and backfills
        are for schedulers (`lockctl schedule`, `serve()`): a call runs its own tick only."""
        core, names = self.calls.core, [job.name for job in self.setting.jobs]
        assert core is not None
        consul, abort = self.setting.consul, on_clock(self.clock, core.abort)
        return TriggerWatch(
            lambda: consul,
            lambda: names,
            _not_for_calls,
            self.events,
            self._watch_stop,
            abort=abort,
        )

    def _pool_note(self, note: Note) -> None:
        """The session pool's news: the Locker's own events (`lockctl-embed`)."""
        if note.kind == "session-created" and note.session:
            self.live.append(note.session)
        elif note.kind == "session-gone" and note.session in self.live:
            self.live.remove(note.session)
        for event, fields in note_events(note):
            self.events.emit(event, **fields)

    def _unexpected(self, exc: Exception) -> None:
        self.events.emit("tick-failed", error=unexpected(exc))

    def _notified(self, delivery: Delivery, result: str, error: str | None) -> None:
        """A delivery's end, said in its job's events (`notified`, `notify-failed`)."""
        said = result_event(delivery, result, error)
        if said is not None:
            EventLog(delivery.job, self.setting.worker, self.setting.stream).emit(
                said[0], **said[1]
            )


def _not_for_calls(name: str, note: ControlNote) -> None:
    """A trigger heard by the calls' watch: left to the schedulers, which run it."""


def call_turn(
    config: JobConfig,
    tick: datetime,
    events: RunEvents,
    make: Callable[[RunEvents], ThreadBody],
    clock: Clock,
) -> CallTurn:
    """A call's turn at `tick`, its notes said through `events`."""
    ask = TickAsk(config, events.worker, (), RunOptions(), tick)
    return CallTurn(config, tick, events, make, Said(events, clock, ask))


Refusal = Callable[[Verdict, "CallTurn"], dict[str, object]]  # a skipped claim's event fields


def outcome_of(found: Verdict, turn: CallTurn, refusal: Refusal, signum: int | None) -> RunOutcome:
    """The turn's verdict as the call's RunOutcome, and the event the core's notes did not
    say already (a skip, a miss, Consul not answering, a stop before the body started)."""
    tick, events = turn.tick, turn.events
    if found.came is Outcome.CLAIMED and found.record is not None:
        return RunOutcome.of(ran_result(found.record, signum), turn.error)
    if found.came is Outcome.PAUSED and found.record is not None:
        events.emit("skipped", **paused_refusal(found.record).event_fields())
        return RunOutcome(Outcome.SKIPPED, tick, skip=SkipReason.PAUSED)
    if found.came is Outcome.SKIPPED:
        events.emit("skipped", tick=tick_name(tick), **refusal(found, turn))
        return RunOutcome(Outcome.SKIPPED, tick, skip=found.skip)
    if found.came is Outcome.MISSED:
        reason = f"tick {tick_name(tick)}: {found.detail or 'its claim window closed'}; not run"
        events.emit("missed", tick=tick_name(tick), reason=reason, recorded=False)
        return RunOutcome(Outcome.MISSED, tick)
    if found.came is Outcome.ERROR:  # fail closed: no body ran without the claim
        error = found.detail or "Consul did not answer"
        events.emit("consul-unavailable", error=error)
        return RunOutcome(Outcome.SKIPPED, tick, skip=SkipReason.OTHER, error=error)
    stopped = signum or signal.SIGTERM
    events.emit("interrupted", signal=signal.Signals(stopped).name)
    return RunOutcome(Outcome.INTERRUPTED, tick)


def refusal_fields(consul: Consul, found: Verdict, turn: CallTurn) -> dict[str, object]:
    """Why the call's claim was refused, as `lockctl run` says it."""
    return skip_fields(ConsulTickStore(consul), turn.config, turn.tick, found.skip)
