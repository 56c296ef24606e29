"""One held lock and the job under it, from the job's start to the release: the supervisor
gathers the facts, provision/fencing.py decides, and the supervisor carries the decision out."""

from __future__ import annotations

import hashlib
import re
import signal
from collections.abc import Callable
from datetime import datetime

from provision.errors import EXIT_JOB_TIMEOUT, EXIT_LOCK_LOST
from provision.fencing import (
    Action,
    BodyFence,
    Decision,
    Facts,
    Outcome,
    decide,
    fence_bounds,
    outcome_after_release,
)
from provision.ledger.records import tick_name
from provision.runner.body import JobBody
from provision.runner.containment import first_telling
from provision.runner.events import EventLog, ms
from provision.runner.lock import Ending, HeldLock, LockSession
from provision.runner.monitors import LockMonitors
from provision.runner.results import RunOptions, RunResult
from provision.runner.stop import StopRequest, Wakeup, wait_for
from provision.tick.retries import CUT, Stop, StopReason, delay_verdict, next_attempt

REAP_POLL = 0.01  # while a signalled tree dies: its leftovers' deaths wake nobody
STOP_POLL = 1.0  # seconds: the longest wait in a retry delay without looking at the lock


class Supervisor:
    """One held lock and the job under it, from the job's start to the release."""

    def __init__(
        self,
        lock: LockSession,
        held: HeldLock,
        options: RunOptions,
        events: EventLog,
        stop: StopRequest,
        clock: Callable[[], float],
    ) -> None:
        self.lock, self.held, self.events, self.stop, self.clock = lock, held, events, stop, clock
        timings = lock.job.timings
        self.bounds = fence_bounds(timings, lock.renew_timeout)
        self.fence = BodyFence(self.bounds, clock, lambda: lock.confirmed_at, lock.follow)
        self.min_hold = options.min_hold if options.min_hold is not None else timings.min_hold
        self.verdict: Outcome | None = None
        self.terminated_at: float | None = None
        self.timeout = lock.job.timings.timeout
        self.timeout_at: float | None = None  # set at the job's start: its timeout counts from it
        self.statuses: list[int | None] = []  # each attempt's exit status (tick/retries.py)
        self.cut: str | None = None  # why retries the job still had were not made
        self.retried = False  # a retry was planned: the record keeps the attempts

    def run(
        self, child: JobBody, waited: float, next_child: Callable[[], JobBody] | None = None
    ) -> RunResult:
        """Run the job under the held lock, and again when it failed and may be retried
        (tick/retries.py): `next_child` prepares each further attempt's job."""
        acquired_at = self.clock()
        child.start(lock_env(self.lock, self.held, 1), self.fence)  # before any thread starts
        self._started()
        self.events.emit(  # after the start, which is the hand-over's critical path
            "acquired",
            session=self.lock.session_id,
            lock_index=self.held.lock_index,
            waited_ms=ms(waited),
            child_pid=child.pid,
            containment=child.containment,
        )
        # Said once per process: the later runs name their mode in `acquired` only
        if child.warning and first_telling(child.warning):
            self.events.emit(
                "containment",
                session=self.lock.session_id,
                mode=child.containment,
                warning=f"no PID namespace ({child.warning}): a process of the job that leaves "
                "its process group and outlives a killed runner is not contained, and the "
                "worker's token and TLS key are not hidden from the job",
            )
        first, wakeup = child, Wakeup()
        monitors = LockMonitors(
            self.lock, child, self.held.modify_index, self.events, wakeup, self.clock
        )
        try:
            monitors.start()
            decision, child = self._attempts(child, monitors, wakeup, acquired_at, next_child)
            # Release first, then stop the helpers: waking the renewer would contend for the
            # GIL with the release, the hand-over's critical path (~1.5 ms measured).
            monitors.releasing = True
            ending = Ending(
                (decision.verdict or Outcome.LOST).value,
                child.exit_status,
                self.clock() - acquired_at,
                attempts=tuple(self.statuses) if self.retried else None,
                retries_cut=self.cut,
            )
            released = self.lock.finish(ending, release=decision.action is Action.RELEASE)
        except BaseException:  # an unexpected error: nothing of the job outlives the run
            child.signal_tree(signal.SIGKILL)
            raise
        finally:
            monitors.stop_and_join()
            wakeup.close()
            if child is not first:  # the engine closes the first; each retry's is ours
                child.close()
        return self._report(child, decision, released, acquired_at)

    def _started(self) -> None:
        """An attempt's job started: its verdict, signals and timeout are its own."""
        self.verdict, self.terminated_at = None, None
        if self.timeout is not None:
            self.timeout_at = self.clock() + self.timeout

    def _attempts(
        self,
        child: JobBody,
        monitors: LockMonitors,
        wakeup: Wakeup,
        acquired_at: float,
        next_child: Callable[[], JobBody] | None,
    ) -> tuple[Decision, JobBody]:
        """Supervise each attempt to its end; the last one's decision, and its job."""
        hold_until, first = acquired_at + self.min_hold, child
        while True:
            decision = self._supervise(child, monitors, wakeup, hold_until)
            self.statuses.append(child.exit_status)
            if decision.action is not Action.RELEASE or next_child is None:
                return decision, child  # lost, or nothing to retry with: the run is over
            attempt = len(self.statuses)
            plan = next_attempt(
                decision.verdict,
                child.exit_status,
                attempt,
                self.lock.job.timings,
                self.clock(),
                None,  # a plain lock has no next tick to cut its retries at
                http=self.lock.job.http is not None,
            )
            if isinstance(plan, Stop):
                return decision, self._stopped(plan.reason, child)
            self.retried, delay = True, max(0.0, plan.at - self.clock())
            self._emit_retry(
                "retrying", plan.attempt, after_status=child.exit_status, delay_ms=ms(delay)
            )
            waited = self._delay(plan.at, monitors, wakeup)
            if waited is Outcome.LOST:
                return Decision(Action.REPORT_LOST, Outcome.LOST), child
            if waited is Outcome.INTERRUPTED:
                return decision, self._stopped(StopReason.STOPPED, child)
            if child is not first:  # the engine closes the first
                child.close()
            child = next_child()
            child.start(lock_env(self.lock, self.held, plan.attempt), self.fence)
            self._started()
            monitors.await_child(child)
            self._emit_retry("retry-started", plan.attempt, child_pid=child.pid)

    def _stopped(self, reason: StopReason, child: JobBody) -> JobBody:
        """No further attempt: a cut of retries the job still had is said and recorded."""
        if reason in CUT and self.lock.job.timings.retries:
            self.cut, self.retried = reason.value, True
            status, attempt = child.exit_status, len(self.statuses)
            self._emit_retry("retries-cut", attempt, after_status=status, reason=reason.value)
        return child

    def _delay(self, until: float, monitors: LockMonitors, wakeup: Wakeup) -> Outcome | None:
        """Wait for the next attempt with the lock held (renewed and watched meanwhile): LOST
        or INTERRUPTED ends the retries; None when the time came with the lock still ours."""
        while True:
            now = self.clock()
            verdict = delay_verdict(
                now,
                self.lock.confirmed_at,
                self.bounds.fence_after,
                monitors.lost is not None,
                self.stop.signum,
            )
            if verdict is Outcome.LOST:
                self.events.emit(
                    "fenced",
                    session=self.lock.session_id,
                    reason=monitors.lost or "no confirmation of the lock in time",
                    since_confirmed_ms=ms(now - self.lock.confirmed_at),
                    child_status=None,
                )
            if verdict is not None or now >= until:
                return verdict
            # the renewer and the watcher start when due, here too (runner/monitors.py)
            wake_at = _earliest(until, monitors.run_due(now), now + STOP_POLL)
            wait_for(wakeup, self.stop, max(0.0, (wake_at or until) - now))

    def _emit_retry(self, event: str, attempt: int, **fields: object) -> None:
        """`retrying` (the attempt to come, after which status, in how long), `retry-started`
        (its job's PID) or `retries-cut` (after which attempt, why)."""
        self.events.emit(
            event,
            session=self.lock.session_id,
            attempt=attempt,
            **fields,
        )

    def _supervise(
        self, child: JobBody, monitors: LockMonitors, wakeup: Wakeup, hold_until: float
    ) -> Decision:
        """Carry out decisions until one says the job is over (release, or report lost)."""
        while True:
            facts = self._facts(child, monitors, hold_until)
            decision = decide(facts, self.bounds)
            self._settle(decision, child, monitors)
            if decision.action in (Action.RELEASE, Action.REPORT_LOST):
                return decision
            wake_at = _earliest(decision.wake_at, monitors.run_due(facts.now))
            timeout = None if wake_at is None else wake_at - facts.now
            if decision.action in (Action.TERMINATE, Action.KILL):
                assert decision.signum is not None
                child.signal_tree(decision.signum)
                if self.terminated_at is None:
                    self.terminated_at = facts.now
            if facts.tree_alive and (self.terminated_at is not None or facts.job_exited):
                # a dying tree's last deaths wake nobody: look again soon
                timeout = REAP_POLL if timeout is None else min(timeout, REAP_POLL)
            wait_for(wakeup, self.stop, timeout, monitors.exit_fds(facts.job_exited))

    def _facts(self, child: JobBody, monitors: LockMonitors, hold_until: float) -> Facts:
        return Facts(
            now=self.clock(),
            confirmed_at=self.lock.confirmed_at,
            lost=monitors.lost is not None,
            job_exited=child.exit_status is not None,
            tree_alive=child.tree_alive(),
            stop_signal=self.stop.signum,
            verdict=self.verdict,
            terminated_at=self.terminated_at,
            hold_until=hold_until,
            timeout_at=self.timeout_at,
        )

    def _settle(self, decision: Decision, child: JobBody, monitors: LockMonitors) -> None:
        """Record the verdict; the moment it becomes LOST, say so once (the `fenced` event), or
        JOB_TIMED_OUT (the `timed-out` event, with `after_ms`: --wait's has `waited_ms`)."""
        if decision.verdict is Outcome.JOB_TIMED_OUT and self.verdict is None:
            self.events.emit(
                "timed-out",
                session=self.lock.session_id,
                after_ms=ms(self.timeout or 0.0),
                child_pid=child.pid,
            )
        if decision.verdict is Outcome.LOST and self.verdict is not Outcome.LOST:
            confirmed = self.lock.confirmed_at
            self.events.emit(
                "fenced",
                session=self.lock.session_id,
                reason=monitors.lost or "no confirmation of the lock in time",
                since_confirmed_ms=ms(self.clock() - confirmed),
                child_status=child.exit_status,
            )
        self.verdict = decision.verdict

    def _report(
        self, child: JobBody, decision: Decision, released: bool | None, acquired_at: float
    ) -> RunResult:
        outcome = Outcome.LOST
        if decision.action is Action.RELEASE and decision.verdict is not None:
            outcome = outcome_after_release(decision.verdict, released)
        self.events.emit(
            "lost" if outcome is Outcome.LOST else "released",
            session=self.lock.session_id,
            lock_index=self.held.lock_index,
            held_ms=ms(self.clock() - acquired_at),
            child_status=child.exit_status,
            released=bool(released),
        )
        duration = self.clock() - acquired_at
        code = EXIT_LOCK_LOST
        if outcome is Outcome.JOB_TIMED_OUT:  # its own status is in the event and the record
            code = EXIT_JOB_TIMEOUT
        elif outcome is not Outcome.LOST:
            code = child.exit_status if child.exit_status is not None else 1
        return RunResult(
            outcome,
            code,
            self.held.lock_index,
            duration=duration,
            attempts=len(self.statuses),
            retries_cut=self.cut,
        )


def _earliest(*moments: float | None) -> float | None:
    known = [moment for moment in moments if moment is not None]
    return min(known) if known else None


def lock_env(lock: LockSession, held: HeldLock, attempt: int) -> dict[str, str]:
    """What the job is told of its lock: key, session, indexes, job, worker, which
    attempt of the run this is (1 for the first), and the run's key, the same for every
    attempt of it (runner/http_job.py sends it as the Idempotency-Key)."""
    key = idempotency_key(lock.job.name, None, None, held.modify_index)
    return {
        "LOCK_KEY": lock.key,
        "LOCK_SESSION": lock.session_id,
        "LOCK_INDEX": str(held.lock_index),
        "LOCK_MODIFY_INDEX": str(held.modify_index),
        "LOCKCTL_JOB": lock.job.name,
        "LOCKCTL_WORKER": lock.worker,
        "LOCKCTL_ATTEMPT": str(attempt),
        "LOCKCTL_IDEMPOTENCY_KEY": key,
    }


# A job name or trigger id kept as it is in a run's key; anything else (a hand-edited worker
# config, a trigger note not written by lockctl) is replaced by a hash, so the key stays a
# short printable header value whatever the input.
_KEY_PART = re.compile(r"[A-Za-z0-9._-]{1,64}")


def idempotency_key(
    job: str, tick: datetime | None, trigger: str | None, acquired_index: int
) -> str:
    """The key of one run of `job`, the same for each of its attempts and different for any
    other run: `lockctl:<job>:<tick>` for a scheduled tick (the tick is claimed once, so it is
    run once), `lockctl:<job>:<instant>:trigger:<id>` for an operator's trigger, and
    `lockctl:<job>:lock:<index>` for a run without a tick (`acquired_index`: the lock's
    ModifyIndex when acquired, which Consul never hands out twice). At most 170 characters."""
    if tick is None:
        return f"lockctl:{_key_part(job)}:lock:{acquired_index}"
    key = f"lockctl:{_key_part(job)}:{tick_name(tick)}"
    return key if trigger is None else f"{key}:trigger:{_key_part(trigger)}"


def _key_part(text: str) -> str:
    if _KEY_PART.fullmatch(text):
        return text
    return "sha256-" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]
