"""One scheduled job inside `lockctl schedule`: its next tick, and the run of that tick.

    the next due tick, and this replica's turn at it (ledger/turns.py: the planned start, plus
    a stagger when another worker is first in the claim order), for the scheduler's one timer
    (scheduler/timer.py) -> at the turn, `run_job` for THAT tick, under the replica's session for
    the job's timings (scheduler/sessions.py): a read first unless this replica is first, the
    claim, the job in its PID namespace, fencing, the record completed, the release

The claim is the same transaction as `lockctl run`'s (runner/tick_lock.py), so a tick runs once
across every replica's scheduler and every per-tick timer. Consul unreachable: the tick is not
run (fail closed), said once (`consul-unavailable`) and counted; the next run that gets through
records it missed. Consul answering 403 (a token it does not know or that lacks a right) is
not an outage: `tick-failed` with Consul's reason. A run still going when its next tick comes
(it outlasts its interval) keeps the job busy: the ticks that pass meanwhile are skipped here
(`skipped`, reason overlap), and every other replica skips them too (the lock is held).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

from provision.consul import Consul, ConsulError, PermissionDenied
from provision.errors import LockctlError
from provision.ledger.catchup import LATEST
from provision.ledger.control import ControlNote
from provision.ledger.records import tick_name
from provision.ledger.ticks import choose_tick
from provision.runner.body import JobBody
from provision.runner.catchup import run_catchup
from provision.runner.events import EventLog
from provision.runner.forkserver import ForkServer
from provision.runner.precheck import WallClock, utc_now
from provision.runner.results import RunOptions, RunResult, SkipReason
from provision.runner.stop import StopRequest
from provision.runner.tick_lock import job_turn
from provision.schedule import parse_schedule
from provision.scheduler.cadence import (
    distrust_clocks,
    starting,
)
from provision.scheduler.counts import HELPER_EVENTS, LoopCounts
from provision.scheduler.runs import scheduled_run
from provision.scheduler.sessions import SessionPool
from provision.scheduler.triggers import manual_run
from provision.workers.config import JobConfig


def token_refused(exc: ConsulError) -> str | None:
    """Why the tick failed when Consul answered but refused the token (403: unknown, deleted,
    or without the right), else None: Consul did not answer. A refusal is not an outage: no
    retry fixes it, so it is `tick-failed` with Consul's reason, never `consul-unavailable`."""
    if isinstance(exc, PermissionDenied):
        return f"Consul refused the token: {exc}"
    return None


PACKAGE = str(Path(__file__).resolve().parents[1])  # provision/, for where an error was raised


def unexpected(exc: BaseException) -> str:
    """An error nobody foresaw, in one line: its type, its text and where it was raised (the
    innermost frame of lockctl's), for the report a bug needs without a traceback."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(PACKAGE)]
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    return f"unexpected {type(exc).__name__}{where}: {exc}"


class CountingEventLog(EventLog):
    """The job's events; those only the engine's threads see while a run goes on (counts.py's
    HELPER_EVENTS: the job running under the lock, renewals, the housekeeping after the release)
    also change its counts, by their name, before they are written.

    Events, not calls, because they happen inside run_job, whose renewer (runner/monitors.py),
    supervisor (runner/engine.py) and housekeeping (runner/tick_lock.py) take an EventLog and no
    hook; the loop hears of the run only from its RunResult, at its end. Everything a RunResult
    carries (the outcome, why it skipped, the duration, the start lag) is counted from it, in
    JobTicks.run_tick, and no event's text is read here (of `housekeeping`, the number of
    ticks it recorded missed, which lockctl itself puts there)."""

    def __init__(self, job: str, worker: str, stream: TextIO | None, counts: LoopCounts) -> None:
        super().__init__(job, worker, stream)
        self.counts = counts

    def emit(self, event: str, **fields: Any) -> None:
        if event in HELPER_EVENTS:
            missed = fields.get("missed_recorded")
            self.counts.helper_event(
                event,
                fields.get("warning") or fields.get("error"),
                missed if type(missed) is int and missed > 0 else 0,
            )
        super().emit(event, **fields)


@dataclass(frozen=True)
class Turn:
    """A job's next tick, and the moment this replica's turn at it comes (its wall clock)."""

    tick: datetime
    at: datetime


class JobTicks:
    """One scheduled job of the scheduler: which tick it runs next, when this replica's turn at
    it comes, and the run of that tick. Not a thread: the scheduler's one timer (scheduler/
    timer.py) says when, and a run has a thread only while it lasts."""

    def __init__(  # noqa: PLR0913 (until this shape runs on the tick core)
        self,
        consul: Consul,
        job: JobConfig,
        worker: str,
        events: EventLog,
        stop: StopRequest,
        *,
        wall: WallClock = utc_now,
        clock: Callable[[], float] = time.monotonic,
        counts: LoopCounts | None = None,
        sessions: SessionPool | None = None,
        forks: ForkServer | None = None,
        body: Callable[[], JobBody] | None = None,
    ) -> None:
        """`body`: what makes the job's run instead of its command (provision/embed/ serve())."""
        assert job.schedule is not None and (job.command or job.http or body is not None)
        self.body = body
        self.consul, self.job, self.worker, self.events = consul, job, worker, events
        self.stop, self.wall, self.clock = stop, wall, clock
        self.schedule = parse_schedule(job.schedule, job.timezone)
        # the scheduler's, kept across reloads; `events` should count into it (CountingEventLog)
        self.counts = counts or LoopCounts()
        self.counts.schedule_known(job.schedule, job.timezone)
        self.last_result: RunResult | None = None
        if sessions is None:  # a pool of its own (tests): its events are this job's, counted
            self.sessions = SessionPool(consul, worker, events, clock)
        else:  # the scheduler's: its events are the scheduler's, so it tells us what happened
            self.sessions = sessions
            sessions.subscribe(self._session_news)
        self._session_id: str | None = None
        self.forks = forks  # the scheduler's namespace helper, shared by its jobs
        self._last_tick: datetime | None = None
        self._consul_down = False
        self._recheck_clocks = False  # a clock stepped: read the agent's before the next claim
        # catchup = "latest": look for a tick nobody ran after the next run, at the start and
        # after Consul was unreachable, never in the steady state (runner/catchup.py)
        self._catchup_look = job.catchup == LATEST
        # the ledger work beyond claim and completion (cadence.py)
        self.cadence = starting(clock(), job.name)
        # told when a trigger's run could not be tried (Consul, a bug): it is heard of again
        self.trigger_failed: Callable[[str, ControlNote], None] | None = None

    def continue_from(self, old: JobTicks) -> None:
        """Take over from `old`, this job's loop before a reload: the ticks it ran or tried are
        not tried again, the ticks that pass while its run ends are said as overlap."""
        self._last_tick = old._last_tick
        self._catchup_look = self._catchup_look and old._catchup_look

    def leave(self) -> None:
        """This loop is retired (a reload removed or replaced it): no more session news."""
        self.sessions.unsubscribe(self._session_news)

    def next_turn(self) -> Turn:
        """The tick to run next and when this replica may claim it (ledger/turns.py)."""
        due = self._next_due()
        self.counts.tick_planned(due.timestamp())
        turn = job_turn(self.job, self.schedule, due, self.worker)
        return Turn(due, due + timedelta(seconds=turn.delay))

    def _next_due(self) -> datetime:
        """The current tick while it can still be claimed and this job has not tried it, else
        the next one. Ticks that passed while a run went on are skipped, and said so."""
        now = self.wall()
        choice = choose_tick(self.schedule, now, self.job.timings.start_deadline)
        if (self._last_tick is None or choice.tick > self._last_tick) and not choice.too_late:
            due = choice.tick
        else:
            due = self.schedule.next_ticks(now, 1)[0]
        if self._last_tick is not None and due <= self._last_tick:
            # Consul's clock stepped back: never a tick again that this loop has had (its
            # record may be gone by retention), the one after it, when it comes
            due = self.schedule.next_ticks(self._last_tick, 1)[0]
        if self._last_tick is not None:
            passed = self._passed_ticks(self._last_tick, due)
            if passed:
                self.events.emit(
                    "skipped",
                    tick=tick_name(passed[-1]),
                    ticks=len(passed),
                    reason=f"overlap: {len(passed)} tick(s) passed while tick "
                    f"{tick_name(self._last_tick)} ran here",
                )
                self.counts.skipped(SkipReason.OVERLAP, len(passed))
        return due

    def _passed_ticks(self, last: datetime, due: datetime) -> list[datetime]:
        if self.schedule.next_ticks(last, 1)[0] >= due:
            return []  # the common case, for each of hundreds of jobs at each of their ticks
        passed: list[datetime] = []
        for tick in self.schedule.next_ticks(last, 64):
            if tick >= due:
                break
            passed.append(tick)
        return passed

    def run_tick(self, due: datetime) -> None:
        """Run tick `due` (the one next_turn gave), whatever comes of it: never raises for
        Consul or the job; the outcome is counted and said in events."""
        self._last_tick = due
        self.counts.tick_due()
        self.counts.tick_planned(self.schedule.next_ticks(due, 1)[0].timestamp())  # the next
        self.events.emit("tick-due", tick=tick_name(due))
        if self._recheck_clocks:
            self._recheck_clocks = False
            self.cadence = distrust_clocks(self.cadence)
        try:
            session = self._ensure_session()
            result, self.cadence = scheduled_run(
                self.consul,
                self.job,
                self.worker,
                due,
                self.events,
                self.stop,
                session,
                self.cadence,
                clock=self.clock,
                wall=self.wall,
                forks=self.forks,
                body=self.body,
            )
            caught = self._catch_up(session) if self._catchup_look else None
            if caught is not None:  # the due tick's run is counted first, then the catch-up
                self.counts.not_running()
                self.counts.finished(result, self.wall().timestamp())
                result = caught
        except ConsulError as exc:
            refused = token_refused(exc)
            if refused is None:
                self._unavailable(exc, due)
            else:
                self.tick_failed(refused, due)
            return
        except LockctlError as exc:  # the command cannot start: say, go on
            self.tick_failed(str(exc), due)
            return
        except Exception as exc:  # a bug, or data it did not foresee: this tick only
            self.tick_failed(unexpected(exc), due)
            return
        finally:
            # the `acquired` event set it; a run that raised said no `released` or `lost`
            self.counts.not_running()
        self._recovered()
        self.last_result = result
        self.counts.finished(result, self.wall().timestamp())

    def run_manual(self, note: ControlNote) -> None:
        """Run the job once now for an operator's trigger (scheduler/triggers.py heard of it);
        like run_tick, never raises for Consul or the job."""
        self.events.emit("trigger", trigger=note.id, by=note.by, reason=note.reason)
        try:
            session = self._ensure_session()
            result = manual_run(
                self.consul,
                self.job,
                self.worker,
                note,
                self.events,
                self.stop,
                session,
                clock=self.clock,
                wall=self.wall,
                forks=self.forks,
                body=self.body,
            )
        except Exception as exc:  # Consul, the command, or a bug: said; tried again later
            if isinstance(exc, ConsulError):
                self.tick_failed(token_refused(exc) or f"trigger {note.id}: {exc}")
            else:
                self.tick_failed(str(exc) if isinstance(exc, LockctlError) else unexpected(exc))
            if self.trigger_failed is not None:
                self.trigger_failed(self.job.name, note)
            return
        finally:
            self.counts.not_running()
        self.last_result = result
        self.counts.finished(result, self.wall().timestamp())

    def _catch_up(self, session: str) -> RunResult | None:
        """Run the newest tick nobody ran, if there is one (after the tick that was due: a
        catch-up first could push that one out of its window, which its start deadline does not
        do to the catch-up): the look is done once Consul answered it; a ConsulError leaves it
        for the next run, without saying the due tick was not run (it was)."""
        try:
            result = run_catchup(
                self.consul,
                self.job,
                self.worker,
                list(self.job.command or ()),
                RunOptions(),
                self.events,
                self.stop,
                self.clock,
                self.wall,
                session=session,
                forks=self.forks,
                body=self.body,
            )
        except ConsulError as exc:
            self._unavailable(exc, None)
            return None
        self._catchup_look = False
        return result

    def recheck_clocks(self) -> None:
        """From the scheduler's thread: a clock stepped; the next run reads before its claim."""
        self._recheck_clocks = True

    def tick_failed(self, why: str, due: datetime | None = None) -> None:
        """A tick (or the choice of the next one) failed for a reason of lockctl's own: said,
        counted, and on /healthz until a tick goes through; the loop goes on."""
        self.events.emit("tick-failed", tick=None if due is None else tick_name(due), error=why)
        self.counts.failed(why)

    # -- the session -----------------------------------------------------------------------
    def _ensure_session(self) -> str:
        """The replica's session for this job's timings; this job's metrics learn of a new one
        (the pool says `session-created` once, in the events of whoever made it)."""
        session_id = self.sessions.session_for(self.job.timings)
        if session_id != self._session_id:
            self._session_id = session_id
            self.counts.session_made()
        return session_id

    def _session_news(self, event: str, session_id: str, error: str | None) -> None:
        """From the pool's renewer: news of a session; ours if this job's locks are under it."""
        if session_id == self._session_id:
            self.counts.helper_event(event, error)

    # -- Consul's availability -------------------------------------------------------------
    def _unavailable(
        self, exc: ConsulError, due: datetime | None, *, renewing: bool = False
    ) -> None:
        self.counts.consul_failed(str(exc), renewing=renewing)
        if due is not None:
            self._count("consul-unavailable")
            self._catchup_look = self.job.catchup == LATEST  # the tick may need catching up
        if not self._consul_down or due is not None:
            self.events.emit(
                "consul-unavailable",
                tick=None if due is None else tick_name(due),
                error=str(exc),
                detail="the tick is not run (fail closed); it shows up as missed once Consul "
                "answers again"
                if due is not None
                else None,
            )
        self._consul_down = True

    def _recovered(self) -> None:
        if self._consul_down:
            self.events.emit("consul-recovered")
            self._consul_down = False

    def _count(self, outcome: str, n: int = 1) -> None:
        self.counts.counted(outcome, n)
