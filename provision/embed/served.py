"""serve(): an app's decorated jobs at their ticks on the tick core (provision/tick/), as
`lockctl schedule` runs a worker's jobs (scheduler/on_core.py's Replica): one clock thread on
the Locker's Consul clock, one TickCore with its session pool, and the app's function as each
run's body (embed/bodies.py: a thread of the app, or an isolated process with its warden).

The body learns how long the lock is safe from the run the core holds (its bounds, and every
confirmation as it comes: `HeldRun.follow`), so `run.check()` judges the bound itself, and a
warden outside the app ends an isolated body on time. A loss Consul says, and a timeout, reach
the body as `lockctl run`'s events do (embed/run.py RunEvents: `run.lost`, `on_lost="exit"`).
The core's notes become the scheduler's events (scheduler/report.py) in the Locker's stream.
The operators' control keys are heard as `lockctl schedule` hears them, on one blocking query
(scheduler/triggers.py TriggerWatch): `lockctl trigger`, `backfill` and `abort` of the app's
jobs reach the core on its clock thread.

A set `stop` event retires the jobs (no new turn; the runs under way end as they will); the
Locker's close() stops the core (the runs under way are told to stop). Either way serve()
returns once the runs have ended, their records completed and the core's sessions destroyed.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TextIO

from provision.consul import AgentClock, Consul
from provision.embed.bodies import ThreadBody
from provision.embed.run import OnLost, RunEvents
from provision.fencing import BodyFence
from provision.notify.notifier import JobNotify, Notifier
from provision.notify.sender import Lanes
from provision.runner.core_body import run_env
from provision.runner.forkserver import ForkServer
from provision.scheduler.on_core import (
    BodySaid,
    GuardedClock,
    Replica,
    Shared,
    record_reader,
)
from provision.scheduler.report import CoreReport, unexpected
from provision.scheduler.triggers import TriggerWatch
from provision.tick.consul_store import Tails
from provision.tick.core import Identity
from provision.tick.edge import Body, BodyEnd, Note, Run, StopHow, TimerClock
from provision.tick.held import HeldRun
from provision.workers.config import JobConfig

SETTLE_POLL = 0.1  # seconds between two looks at a stopping core's runs and sessions
STOP_POLL = 0.5  # seconds: how soon a set `stop` event, or the Locker's close(), is seen
LEFTOVERS_GONE_WITHIN = 5.0  # seconds the reaper waits for a killed isolated body to be gone
LOOK_EVERY = 0.05
TOLD = ("fenced", "timed-out")  # the held run's verdicts the body's Run is told of
EMBED_EVENTS = "lockctl-embed"  # the `job` field of serve()'s own events (its sessions)


class AppBody:
    """tick/edge.py Body over one run of an app's body: started with the fence of the run the
    core holds, reaped by a thread of its own that hands the end to the core's clock."""

    def __init__(
        self,
        made: ThreadBody,
        lock_key: str,
        clock: TimerClock,
        held: Callable[[], HeldRun],
        said: BodySaid,
    ) -> None:
        self.body, self.lock_key, self.clock, self.held = made, lock_key, clock, held
        self.said = said
        self._end: BodyEnd | None = None
        self.tails: Tails | None = None

    @property
    def ending(self) -> BodyEnd | None:
        return self._end

    def start(self, run: Run, ended: Callable[[], None]) -> None:
        held = self.held()

        def confirmed_at() -> float:
            return held.confirmed_at

        fence = BodyFence(held.bounds, self.clock.monotonic, confirmed_at, held.follow)
        self.body.start(run_env(self.lock_key, run), fence)
        self.said.started(self.body)
        threading.Thread(target=self._reap, args=(ended,), daemon=True).start()

    def stop(self, how: StopHow) -> None:
        if self._end is None:
            aborted = self.held().aborted
            if aborted is not None:  # the body is told who asked and why, not a bare SIGTERM
                self.body.tell(f"aborted {aborted.said()}")
            self.body.signal_tree(signal.SIGKILL if how is StopHow.KILL else signal.SIGTERM)

    def _reap(self, ended: Callable[[], None]) -> None:
        """Wait for the body (an isolated one: its whole namespace), keep its error for the
        record, then hand the end to the core's thread."""
        status = self.body.wait()
        give_up = time.monotonic() + LEFTOVERS_GONE_WITHIN
        while self.body.tree_alive() and time.monotonic() < give_up:
            self.body.signal_tree(signal.SIGKILL)
            time.sleep(LOOK_EVERY)
        self.tails = self.body.output_tails()
        self.body.close()

        def said() -> None:
            self._end = BodyEnd(status)
            ended()

        self.clock.call_at(self.clock.monotonic(), said)


@dataclass(frozen=True)
class AppJob:
    """A decorated job as serve() runs it: its config, what makes each run's body (told of
    the run through its events), and what a lost lock does (`on_lost`)."""

    config: JobConfig
    make: Callable[[RunEvents], ThreadBody]
    on_lost: OnLost


@dataclass(frozen=True)
class AppJobs:
    """What serve() is given by the Locker: its client and Consul clock, who it is, where
    the events go, the decorated jobs, whether the Locker is closing, and the jobs'
    notifications (their URLs read when the Locker was made)."""

    consul: Consul
    wall: AgentClock
    worker: str
    stream: TextIO | None
    jobs: tuple[AppJob, ...]
    closing: Callable[[], bool]
    notify: tuple[JobNotify, ...] = ()


class AppReplica(Replica):
    """A Replica whose jobs' bodies are the app's decorated functions."""

    def __init__(self, app: AppJobs, shared: Shared) -> None:
        self.app_jobs = {job.config.unit: job for job in app.jobs}
        self.told = {
            job.config.unit: RunEvents(
                job.config.name, app.worker, None, job.on_lost, job.config.key
            )
            for job in app.jobs
        }
        super().__init__(app.consul, [job.config for job in app.jobs], shared)

    def _body(self, name: str, tick: datetime) -> Body:
        made = self.app_jobs[name].make(self.told[name])
        lock_key = self.configs[name].lock_key
        held = self._held_at(name, tick)
        return AppBody(made, lock_key, self.shared.clock, held, self._body_said(name, tick))

    def _held_at(self, name: str, tick: datetime) -> Callable[[], HeldRun]:
        def held() -> HeldRun:
            run = self._held(name, tick)
            assert run is not None, "the core starts a body only for a run it holds"
            return run

        return held

    def _check_body(self, name: str) -> None:
        """The app's function starts whenever it is called: nothing to check before a claim."""

    def _tails(self, name: str, tick: datetime) -> Tails | None:
        held = self._held(name, tick)
        body = None if held is None else held.body
        return body.tails if isinstance(body, AppBody) else None

    def _hear(self, note: Note) -> None:
        super()._hear(note)  # the event first: on_lost="exit" ends the process right after
        told = self.told.get(note.job)
        if told is None or note.kind not in TOLD:
            return
        if told.run is not None and told.run.tick == note.tick:
            told.emit(note.kind, reason=note.detail)


def serve_on_core(app: AppJobs, stop: threading.Event) -> None:
    """The decorated jobs at their ticks until `stop` is set or the Locker closes."""
    report = CoreReport(app.worker, app.stream, EMBED_EVENTS)
    clock = GuardedClock(app.wall, functools.partial(_unexpected, report))
    identity = Identity(app.worker, socket.gethostname(), os.getpid())
    lanes = Lanes(report.notified)  # notifications, as lockctl schedule's (notify/)
    notifier = Notifier(lanes, record_reader(app.consul))
    notifier.update(app.notify)
    lanes.start()
    replica = AppReplica(app, Shared(clock, identity, report, ForkServer(), notifier))
    clock.call_at(clock.monotonic(), replica.core.start)
    thread = threading.Thread(target=clock.run, name="lockctl-serve", daemon=True)
    thread.start()
    watch_stop = threading.Event()
    control_watch(app, replica, report, watch_stop).start()
    try:
        while not stop.wait(STOP_POLL) and not app.closing():
            pass
        done = threading.Event()
        clock.call_at(clock.monotonic(), functools.partial(_end, replica, app, done))
        while not done.wait(STOP_POLL) and thread.is_alive():
            pass
    finally:
        watch_stop.set()  # its read out ends by itself (a daemon): nothing is handed on after
        clock.close()
        thread.join()
        lanes.close()


def control_watch(
    app: AppJobs, replica: AppReplica, report: CoreReport, stop: threading.Event
) -> TriggerWatch:
    """The operators' triggers, backfills and aborts of the app's jobs, each handed to the
    core on its clock's thread (from the watch's own thread)."""
    core, clock = replica.core, replica.shared.clock
    names = list(dict.fromkeys(job.config.name for job in app.jobs))  # a keyed job's once
    watch = TriggerWatch(
        lambda: app.consul,
        lambda: names,
        on_clock(clock, core.trigger),
        report.events,
        stop,
        abort=on_clock(clock, core.abort),
    )
    watch.backfill = on_clock(clock, core.backfill)
    return watch


def on_clock(clock: TimerClock, act: Callable[[str, Any], None]) -> Callable[[str, Any], None]:
    """`act(job, note)` as a watch's thread hands it on: run on the core's clock thread."""

    def hand(name: str, note: Any) -> None:
        clock.call_at(clock.monotonic(), functools.partial(act, name, note))

    return hand


def _end(replica: AppReplica, app: AppJobs, done: threading.Event) -> None:
    """On the clock thread: the Locker closing stops the core (its runs told to stop); a set
    `stop` retires the jobs (their runs end as they will), then stops it."""
    core = replica.core
    if app.closing() or not core.runs:
        if not core.stopping:
            core.stop()
        if replica.stopped:
            done.set()
            return
    elif core.jobs:
        core.update([])
    replica.shared.clock.call_later(SETTLE_POLL, functools.partial(_end, replica, app, done))


def _unexpected(report: CoreReport, exc: Exception) -> None:
    report.events.emit("tick-failed", error=unexpected(exc))
