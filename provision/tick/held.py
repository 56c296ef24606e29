"""One claimed tick under its held lock, from the body's start to the record's completion.

    start the body (it is told the tick, the fencing token, and how to check the lock)
    -> each fact that changes (a confirmation, the lock lost, the body's end, a stop asked, a
       bound reached on the clock) asks the fencing decision what to do (provision/fencing.py
       `decide`, the one `lockctl run` obeys) -> carry it out: wait until a given time, tell
       the body to end, end it, or let the lock go
    -> complete the tick's record (and release the lock) in one transaction, again until
       Consul answers (after a stop, STOP_COMPLETE_WITHIN at most: a stop ends); a plain
       lock (no tick, no record: Claimed.ledger False) releases the lock alone

The fencing bounds count from the send time of the newest confirmation, on the monotonic
clock: SIGTERM at `fence_after`, SIGKILL at `kill_after` (fence_bounds). Nothing here waits:
each step is a callback on the core's TimerClock, and the next one a timer.
"""

from __future__ import annotations

import contextlib
import functools
import signal
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime

from provision.consul import ConsulError

# The fencing decision is pure and lives with the runner that obeys it today; the tick tier
# sits below the runner, so this is the one import that crosses upward (pyproject.toml says
# so). Moving fencing.py's pure parts down a tier would end it.
from provision.fencing import (
    Action,
    Decision,
    Facts,
    FenceBounds,
    decide,
    fence_bounds,
    past_fence,
)
from provision.ledger.attempts import CUT_BY_ABORT, CUT_BY_NEXT_TICK
from provision.ledger.control import ControlNote
from provision.ledger.records import TickRecord, tick_name
from provision.ledger.store import Completion
from provision.outcomes import Outcome
from provision.tick.edge import Body, Cancellable, Listener, Note, Run, StopHow, TimerClock
from provision.tick.retries import CUT, Retry, StopReason, delay_verdict, next_attempt
from provision.tick.store import CompleteCall, JobKeys, TickStore
from provision.timings import JobTimings

REAP_POLL = 1.0  # seconds: a body told to end whose end was not heard of yet is looked at again
COMPLETE_RETRY = 1.0  # seconds before a completion Consul did not answer is sent again...
COMPLETE_RETRY_MAX = 30.0  # ...doubling up to this
# After a stop (the process ends), a completion Consul does not answer is tried this long at
# most: the record stays `running`, and the session's end (its TTL) frees the lock. A stop
# must end in bounded time (systemd's TimeoutStopSec, a pod's grace period).
STOP_COMPLETE_WITHIN = 10.0


# the verdicts that end a body before its time, as the notes name them
_TOLD = {
    Outcome.LOST: "fenced",
    Outcome.INTERRUPTED: "interrupted",
    Outcome.TIMED_OUT: "timed-out",
}


def renew_timeout(timings: JobTimings) -> float:
    """A renewal's client timeout (pool.py): half an interval, so renewals never pile up."""
    return timings.renew_interval / 2


@dataclass(frozen=True)
class Claimed:
    """What a won claim hands the run: the job's keys and timings, the record as claimed (its
    tick, the fencing token, the ModifyIndex its completion is checked at), the session the
    lock is held under, the claim's confirmation time (its send time), and when the next tick
    comes."""

    keys: JobKeys
    timings: JobTimings
    record: TickRecord
    session: str
    confirmed_at: float
    next_tick_at: float | None = None  # the schedule's next tick (monotonic): no retry from then
    # False for a plain lock (`lockctl run` without a schedule): no record in the ledger, its
    # `record` only says how the run went; its end releases the lock alone
    ledger: bool = True


def apply_fence(body: Body, decision: Decision) -> None:
    """Carry out what the fencing decision says to the body: ask it to end, or end it."""
    if decision.action is Action.TERMINATE:
        body.stop(StopHow.TERMINATE)
    elif decision.action is Action.KILL:
        body.stop(StopHow.KILL)


def vouched(run: HeldRun) -> bool:
    """`Run.check()`'s judgement, at every call: the body was not told to end, and the fencing
    bound has not passed on the clock since the newest confirmation, whether or not the core's
    own callback has run since (after a pause the body may run first)."""
    now = run.clock.monotonic()
    return not run.told and not past_fence(now, run.confirmed_at, run.bounds.fence_after)


def record_outcome(verdict: Outcome | None, exit_status: int | None, kept: bool) -> Outcome:
    """The record's outcome for how the run ended; `kept`: the decision was to release (the
    lock was ours to the end), else it was lost."""
    if not kept or verdict is Outcome.LOST or verdict is None:
        return Outcome.LOST
    if verdict is Outcome.INTERRUPTED:
        return Outcome.INTERRUPTED
    if verdict is Outcome.TIMED_OUT:
        return Outcome.TIMED_OUT
    return Outcome.SUCCEEDED if exit_status == 0 else Outcome.FAILED


class Completions:
    """The completions of a stopping core's runs, sent together (TickStore.complete_many: on
    Consul a transaction per 32 of them) from one timer of now, instead of one transaction
    each, in line: a stop at 1,000 jobs ends hundreds of runs at once, and their completions
    one by one made it seconds long. Only runs whose end was decided join (their processes
    are gone), so a completion still follows its run's end; each run then goes on with its own
    answer, as it would alone (sent again later when Consul did not answer)."""

    def __init__(self, store: TickStore, clock: TimerClock) -> None:
        self.store, self.clock = store, clock
        self._queued: list[tuple[HeldRun, TickRecord, float]] = []
        self._timer: Cancellable | None = None

    def add(self, run: HeldRun, done: TickRecord, backoff: float) -> None:
        self._queued.append((run, done, backoff))
        if self._timer is None:  # the runs whose end is due now join before it is sent
            self._timer = self.clock.call_at(self.clock.monotonic(), self._send)

    def _send(self) -> None:
        self._timer = None
        queued, self._queued = self._queued, []
        calls = [CompleteCall(r.claimed.keys, done, r.claimed.session) for r, done, _ in queued]
        try:
            answers = self.store.complete_many(calls)
        except ConsulError:  # a store that raises after all: each unanswered, sent again
            answers = [Completion(False, None)] * len(calls)
        for (run, done, backoff), completion in zip(queued, answers, strict=True):
            run.answered(done, backoff, completion)


class HeldRun:
    """One claimed tick under its held lock; `done(self)` is called once its record is
    complete (or Consul said it was changed under us)."""

    def __init__(
        self,
        store: TickStore,
        clock: TimerClock,
        claimed: Claimed,
        done: Callable[[HeldRun], None],
        listener: Listener | None = None,
        retry_body: Callable[[], Body] | None = None,
    ) -> None:
        """`retry_body` makes each retry's body (tick/retries.py), when the job has retries."""
        self.store, self.clock, self.claimed = store, clock, claimed
        self.retry_body = retry_body
        self.record = claimed.record
        self.bounds: FenceBounds = fence_bounds(claimed.timings, renew_timeout(claimed.timings))
        self.confirmed_at = claimed.confirmed_at
        self._followers: list[Callable[[float], None]] = []  # told of each confirmation
        self._done, self._listener = done, listener
        self.body: Body | None = None
        self.lost: str | None = None  # why the lock is gone, once the pool said so
        self.stop_signal: int | None = None
        self.verdict: Outcome | None = None
        self.told = False  # the body was told to end (its check() fails from then on)
        self.terminated_at: float | None = None
        self.started_at = self.hold_until = claimed.confirmed_at
        self.timeout_at: float | None = None
        self.finished = False  # the fencing is over: the record is being completed
        self.completed: TickRecord | None = None  # the record as completed, once answered
        self._timer: Cancellable | None = None
        self.together: Completions | None = None  # after a stop: the completion sent with others
        self._abandon_at: float | None = None  # a stop's bound on an unanswered completion
        self._completing: TickRecord | None = None  # a completion waiting to be sent again
        self._stepping = self._again = False
        self.statuses: list[int | None] = []  # each ended attempt's exit status
        self.retry: Retry | None = None  # the attempt waited for (no body runs meanwhile)
        self.last: Decision | None = None  # the decision that ended the last attempt
        self.cut: str | None = None  # why retries the job still had were cut
        self.retried = False  # a retry was planned: the record keeps every attempt's status
        self.attempt = 0  # the attempt started last (1 for the first)
        self.aborted: ControlNote | None = None  # an operator's `lockctl abort` ended it
        self.cancelled: datetime | None = None  # the tick that ended it (overlap = "cancel")

    @property
    def tick(self) -> datetime:
        return self.record.tick

    def start(self, body: Body) -> None:
        """Start the body under the lock; not when the lock is gone already, or no longer
        vouched for (a claim answered, or acted on, after its bound: a pause, a slow answer),
        or a stop came first: then the run ends lost or interrupted, without it."""
        now = self.clock.monotonic()
        timings = self.claimed.timings
        self.started_at, self.hold_until = now, now + timings.min_hold
        if timings.timeout is not None:
            self.timeout_at = now + timings.timeout
        lost = self.lost is not None or past_fence(now, self.confirmed_at, self.bounds.fence_after)
        if lost or self.stop_signal is not None:
            verdict = Outcome.LOST if lost else Outcome.INTERRUPTED
            action = Action.REPORT_LOST if lost else Action.RELEASE
            self._finish(Decision(action, verdict))
            return
        self._start_body(body, 1)

    def _start_body(self, body: Body, attempt: int) -> None:
        self.body, self.attempt = body, attempt
        record, keys = self.record, self.claimed.keys
        assert record.lock_index is not None  # a won claim's record carries its token
        worker, session = record.worker or "", self.claimed.session
        token, safe = record.lock_index, self._safe
        run = Run(keys.name, worker, record.tick, token, session, safe, attempt, keys.key)
        body.start(run, self._step)
        self._step()

    def _safe(self) -> bool:
        return vouched(self)  # the module's, looked up at each call

    # -- facts that change -----------------------------------------------------------------
    def confirm(self, sent: float) -> None:
        """A renewal sent at `sent` confirmed the session: the bounds count from there (the
        timer already set looks again when it fires), and the followers are told."""
        if sent > self.confirmed_at:
            self.confirmed_at = sent
            for follower in list(self._followers):
                follower(sent)

    def follow(self, follower: Callable[[float], None]) -> Callable[[], None]:
        """Call `follower` with each newer confirmation (a body whose fencing lives outside
        this process forwards them there: embed/bodies.py ProcessBody); returns what stops it."""
        self._followers.append(follower)
        return functools.partial(self._unfollow, follower)

    def _unfollow(self, follower: Callable[[float], None]) -> None:
        with contextlib.suppress(ValueError):
            self._followers.remove(follower)

    def lose(self, reason: str) -> None:
        """Consul said the lock is gone (its session ended)."""
        if self.lost is None:
            self.lost = reason
            if self.retry is not None:
                self._await_retry()
            elif self.body is not None:  # else start() finds it so, and starts nothing
                self._step()

    def interrupt(self, signum: int = signal.SIGTERM) -> None:
        """A stop was asked for (the core's end): the body is told, then the lock released."""
        if self.stop_signal is None:
            self.stop_signal = signum
            if self._completing is not None:  # sent again now: the stop's bound starts
                self._complete_soon(self._completing)
            elif self.retry is not None:
                self._await_retry()
            elif self.body is not None:
                self._step()

    def abort(self, note: ControlNote) -> None:
        """An operator asked for this run's end (`lockctl abort`): stopped as a timed-out run
        is (the same decision: SIGTERM to the whole tree, SIGKILL after the grace, then the
        record and the release; the lock is still ours), recorded `aborted` with who and why,
        and never retried. A run whose verdict is settled already (it ended, was fenced, timed
        out, was told to stop) ends as it would have."""
        if self.finished or self.aborted is not None or self.cancelled is not None:
            return
        if self.retry is not None:  # no body runs: the retry waited for is cut
            self.aborted, self.retry, self.cut = note, None, CUT_BY_ABORT
            assert self.last is not None
            self._finish(self.last)
        elif self.body is not None and self.verdict is None:
            self.aborted, self.timeout_at = note, self.clock.monotonic()
            self._step()

    @property
    def stoppable(self) -> bool:
        """Whether a body or a retry of it goes on that nothing has told to end yet."""
        stopped = self.aborted is not None or self.cancelled is not None
        stopped = stopped or self.stop_signal is not None
        going = self.retry is not None or (self.body is not None and self.verdict is None)
        return going and not (self.finished or stopped or self.lost is not None)

    def cancel(self, by: datetime) -> None:
        """The job's next tick came while this run goes on, and its overlap is "cancel": the
        run is stopped as an aborted one is (SIGTERM to the whole tree, SIGKILL after the
        grace, then the record and the release), recorded `cancelled`, never retried. A retry
        waited for (no body runs) is cut by the next tick instead: the record says how the
        last attempt ended. Nothing stoppable: nothing done."""
        if not self.stoppable:
            return
        self.cancelled = by
        if self.retry is not None:
            self.retry, self.cut = None, CUT_BY_NEXT_TICK
            assert self.last is not None
            self._finish(self.last)
        else:
            self.timeout_at = self.clock.monotonic()
            self._step()

    # -- the decision, carried out ---------------------------------------------------------
    def _step(self) -> None:
        """Decide and act until the decision is to wait; never inside itself (a body's end
        told from within stop() is looked at after the decision that stopped it)."""
        if self._stepping:
            self._again = True
            return
        if self.retry is not None:  # no body runs: _await_retry looks after the lock
            return
        self._stepping = True
        try:
            self._again = True
            while self._again and not self.finished:
                self._again = False
                self._decide()
        finally:
            self._stepping = False

    def _decide(self) -> None:
        now = self.clock.monotonic()
        decision = decide(self._facts(now), self.bounds)
        if decision.verdict is not self.verdict and decision.verdict in _TOLD:
            self._tell(decision.verdict, now)
        self.verdict = decision.verdict
        stopped = self.aborted is not None or self.cancelled is not None  # never retried
        if decision.action is Action.RELEASE and not stopped and self._retried(decision):
            return
        if decision.action in (Action.RELEASE, Action.REPORT_LOST):
            self._finish(decision)
            return
        wake = decision.wake_at
        if decision.action in (Action.TERMINATE, Action.KILL):
            assert self.body is not None
            self.told = True
            apply_fence(self.body, decision)
            # after TERMINATE the next decision (at once) says how long the grace is
            self._again = self.terminated_at is None and decision.action is Action.TERMINATE
            self.terminated_at = now if self.terminated_at is None else self.terminated_at
        if self.terminated_at is not None:  # a dying body's end may go untold: look again
            wake = now + REAP_POLL if wake is None else min(wake, now + REAP_POLL)
        if wake is not None and not self._again:
            self._arm(wake)

    def _facts(self, now: float) -> Facts:
        ending = None if self.body is None else self.body.ending
        return Facts(
            now=now,
            confirmed_at=self.confirmed_at,
            lost=self.lost is not None,
            job_exited=ending is not None,
            tree_alive=ending is None,
            stop_signal=self.stop_signal,
            verdict=self.verdict,
            terminated_at=self.terminated_at,
            hold_until=self.hold_until,
            timeout_at=self.timeout_at,
        )

    def _arm(self, wake: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.clock.call_at(wake, self._step)

    # -- retries (tick/retries.py) ----------------------------------------------------------
    def _retried(self, decision: Decision) -> bool:
        """The attempt ended with the lock ours: whether another one is to come (then it is
        waited for, the lock held and renewed meanwhile), or the run is over."""
        ending = None if self.body is None else self.body.ending
        status = None if ending is None else ending.exit_status
        self.statuses.append(status)
        self.last = decision
        if self.retry_body is None:
            return False
        now, timings = self.clock.monotonic(), self.claimed.timings
        attempt = len(self.statuses)
        plan = next_attempt(
            decision.verdict, status, attempt, timings, now, self.claimed.next_tick_at
        )
        if not isinstance(plan, Retry):
            if plan.reason in CUT and timings.retries:
                self.cut = plan.reason.value
            return False
        self.retry, self.body, self.retried = plan, None, True
        said = f"attempt {plan.attempt} after status {status}"
        self._note("retrying", said, self._so_far(), seconds=max(plan.at - now, 0.0))
        self._await_retry()
        return True

    def _await_retry(self) -> None:
        """While a retry is waited for: the lock lost or not confirmed in time ends the run
        lost, a stop ends it (its retries cut); else the retry starts when its time comes."""
        retry = self.retry
        if retry is None or self.finished:
            return
        now = self.clock.monotonic()
        fence_after = self.bounds.fence_after
        verdict = delay_verdict(
            now, self.confirmed_at, fence_after, self.lost is not None, self.stop_signal
        )
        if verdict is not None:
            self.retry = None
            if verdict is Outcome.LOST:
                self._tell(Outcome.LOST, now, "while waiting for a retry")
                self._finish(Decision(Action.REPORT_LOST, Outcome.LOST))
            else:
                self.cut = StopReason.STOPPED.value
                assert self.last is not None
                self._finish(self.last)
            return
        if now < retry.at:
            self._arm_retry(min(retry.at, self.confirmed_at + fence_after))
            return
        self.retry = None
        self.verdict, self.told, self.terminated_at = None, False, None
        timeout = self.claimed.timings.timeout
        self.timeout_at = None if timeout is None else now + timeout
        assert self.retry_body is not None
        self._note("retry-started", f"attempt {retry.attempt}", self._so_far())
        self._start_body(self.retry_body(), retry.attempt)

    def _arm_retry(self, wake: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.clock.call_at(wake, self._await_retry)

    # -- the record --------------------------------------------------------------------------
    def _finish(self, decision: Decision) -> None:
        self.finished = True
        if self._timer is not None:
            self._timer.cancel()
        ending = None if self.body is None else self.body.ending
        if len(self.statuses) < self.attempt:  # this attempt's end, not said to _retried
            self.statuses.append(None if ending is None else ending.exit_status)
        status = self.statuses[-1] if self.statuses else None
        kept = decision.action is Action.RELEASE  # else the lock was lost: the record says so
        # a retry planned keeps the attempts, though the lock was lost before it started (as
        # the old engine recorded them)
        retried = self.retried or self.cut is not None
        outcome = record_outcome(decision.verdict, status, kept)
        said: dict[str, object] = {}  # an aborted run's: who asked, when, why (as paused)
        note = self.aborted
        if note is not None and (outcome is Outcome.TIMED_OUT or self.cut == CUT_BY_ABORT):
            outcome = Outcome.ABORTED
            said = {"by": note.by, "reason": note.reason, "asked_at": note.at}
        elif (
            self.cancelled is not None and outcome is Outcome.TIMED_OUT
        ):  # told to end by the next tick
            outcome = Outcome.CANCELLED
        done = self.record.completed(
            outcome,
            finished_at=self.clock.wall(),
            exit_status=status,
            duration=round(self.clock.monotonic() - self.started_at, 3),
            attempts=tuple(self.statuses) if retried else None,
            retries_cut=self.cut,
            **said,
        )
        self._complete(done, COMPLETE_RETRY)

    def _complete(self, done: TickRecord, backoff: float) -> None:
        """Complete the record and unlock in one transaction; again, later, while Consul does
        not answer: a run's record is never left `running` by an outage. The unlock goes with
        a lost run's record too: the session is the replica's and lives on, and a lock it
        still holds (a fence on an unconfirmed lock, not a lost one) would be re-acquired by
        its next claim without a new LockIndex, the fencing token. Not ours: Consul refuses
        the unlock, and the record says `lost`. After a stop, with `together`, the completion
        goes with the other stopped runs' (Completions)."""
        # being sent now, no longer waiting to be: a stop that comes while it is out (it waits
        # aside) must not send it again (the run would end twice)
        self._completing = None
        if self.stop_signal is not None and self.together is not None and self.claimed.ledger:
            self.together.add(self, done, backoff)
            return
        self.answered(done, backoff, self._completion(done))

    def answered(self, done: TickRecord, backoff: float, completion: Completion) -> None:
        """The completion's answer: the run is over, or the completion is sent again later."""
        if not completion.recorded and completion.released is None:
            self._complete_later(done, backoff)
            return
        lost = completion.released is False  # the lock was no longer ours
        self.completed = replace(done, outcome=Outcome.LOST) if lost else done
        self._note("completed", self.completed.outcome.value, self.completed)
        self._done(self)

    def _completion(self, done: TickRecord) -> Completion:
        """The record completed and the lock released; a plain lock's release alone."""
        keys, session = self.claimed.keys, self.claimed.session
        try:
            if not self.claimed.ledger:
                return Completion(False, self.store.release_lock(keys, session))
            return self.store.complete(keys, done, session, release=True)
        except ConsulError:
            return Completion(False, None)

    def _so_far(self) -> TickRecord:
        """The record as claimed, with the exit status of each attempt ended so far: the next
        attempt is the one after them (a listener reads that, never the note's words)."""
        return replace(self.record, attempts=tuple(self.statuses))

    def _complete_later(self, done: TickRecord, backoff: float) -> None:
        """Consul did not answer the completion: again after `backoff`, doubling; after a stop,
        until STOP_COMPLETE_WITHIN at most, then the run is given up (`complete-abandoned`)."""
        now = self.clock.monotonic()
        due = now + backoff
        if self.stop_signal is not None:
            if self._abandon_at is None:
                self._abandon_at = now + STOP_COMPLETE_WITHIN
            if now >= self._abandon_at:
                self._note("complete-abandoned", "stopping, and Consul did not answer", done)
                self._done(self)
                return
            due = min(due, self._abandon_at)
        self._note("complete-retry")
        again = min(backoff * 2, COMPLETE_RETRY_MAX)
        self._completing = done
        self._timer = self.clock.call_at(due, lambda: self._complete(done, again))

    def _complete_soon(self, done: TickRecord) -> None:
        if self._timer is not None:
            self._timer.cancel()
        now = self.clock.monotonic()
        self._timer = self.clock.call_at(now, lambda: self._complete(done, COMPLETE_RETRY))

    def _tell(self, verdict: Outcome, now: float, when: str = "") -> None:
        """A verdict that ends the body before its time, said once; fenced: why (the lock's
        loss, else no confirmation in time) and how long since the lock was last confirmed."""
        if verdict is Outcome.TIMED_OUT and self.aborted is not None:
            self._note("aborted", self.aborted.said())  # stopped as a timed-out run is: no fence
            return
        if verdict is Outcome.TIMED_OUT and self.cancelled is not None:
            self._note("cancelled", f"tick {tick_name(self.cancelled)} came (overlap = cancel)")
            return
        if verdict is not Outcome.LOST:
            self._note(_TOLD[verdict])
            return
        why = self.lost or "no confirmation of the lock in time"
        self._note("fenced", f"{why} ({when})" if when else why, seconds=now - self.confirmed_at)

    def _note(
        self,
        kind: str,
        detail: str = "",
        record: TickRecord | None = None,
        *,
        seconds: float | None = None,
    ) -> None:
        if self._listener is not None:
            name, tick = self.claimed.keys.unit, self.record.tick  # a key's: job/key
            self._listener(Note(kind, name, tick, detail, record, seconds=seconds))
