"""`lockctl run`: run a command on this worker only while it holds the job's lock.

    open session -> acquire once (or --wait) -> start the child in its own process group
    -> renew every R, watch the key, fence on loss -> child exits -> min-hold -> release, destroy

Three threads beside the main one: the renewer, the watcher (a consistent blocking query on the
key) and a child waiter. They only record facts and wake the main thread, which alone decides
and acts (signals the child, releases the lock).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType

from provision.consul import Consul
from provision.consul.errors import ConsulError, NotFound
from provision.errors import EXIT_LOCK_LOST, EXIT_WAIT_TIMEOUT, LocalEnvironmentError
from provision.runner.child import Child, become_subreaper, check_program
from provision.runner.events import EventLog, ms
from provision.runner.lock import HeldLock, LockSession
from provision.timings import SAFETY_MARGIN
from provision.workers.config import JobConfig

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
WATCH_WAIT = 60.0  # seconds per blocking watch; renewals confirm the lock in between anyway
WATCH_ERROR_PAUSE = 0.5
MIN_DELAY_RETRY = 0.1
UNSAFE_FENCE_SLACK = 0.5  # --allow-unsafe only: how late a healthy renewal may confirm the lock


@dataclass(frozen=True)
class RunOptions:
    wait: bool = False
    timeout: float | None = None  # with --wait: give up after this many seconds
    min_hold: float | None = None  # overrides the job's configured min_hold


@dataclass(frozen=True)
class RunResult:
    outcome: str  # ran, skipped, timed-out, lost, interrupted
    exit_code: int
    lock_index: int | None = None


class _Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _Supervision:
    """Facts the helper threads report, and the event that wakes the main thread."""

    def __init__(self) -> None:
        self.wake = threading.Event()
        self.stop = threading.Event()
        # Set (a plain flag, it wakes nobody) when the main thread starts releasing: our own
        # release changes the key, which the watcher must not report as a loss.
        self.releasing = False
        self.lost: str | None = None
        self.signum: int | None = None

    def report_lost(self, reason: str) -> None:
        if not self.releasing and not self.stop.is_set() and self.lost is None:
            self.lost = reason
            self.wake.set()


def run_job(
    consul: Consul,
    job: JobConfig,
    worker: str,
    command: Sequence[str],
    options: RunOptions,
    events: EventLog,
    clock: Callable[[], float] = time.monotonic,
) -> RunResult:
    """Run `command` under the job's lock; the result says what happened and the exit code."""
    check_program(command, os.environ)  # fail before taking a lock for a job that cannot start
    lock = LockSession(consul, job, worker, clock)
    supervision = _Supervision()
    previous = _install_signal_handlers(supervision, raising=True)
    become_subreaper()  # here, not after acquiring: the hand-over path stays short
    try:
        lock.open()
        began = clock()
        held = _acquire(lock, options, events, clock)
        if isinstance(held, RunResult):
            return held
        _install_signal_handlers(supervision, raising=False)
        waited = clock() - began
        return _supervise(lock, held, command, options, supervision, events, clock, waited)
    except _Interrupted as interrupted:
        return RunResult("interrupted", 128 + interrupted.signum)
    finally:
        supervision.stop.set()
        # Under recording (not raising) handlers until the session is gone: a SIGTERM during
        # this cleanup must neither kill the runner nor unwind it half-way.
        _install_signal_handlers(supervision, raising=False)
        lock.destroy()
        _restore_signal_handlers(previous)


def _acquire(
    lock: LockSession, options: RunOptions, events: EventLog, clock: Callable[[], float]
) -> HeldLock | RunResult:
    """Acquire once, or with --wait wait for a turn; a RunResult when not acquired.

    No thread runs in this phase (the child is forked with a preexec hook, which threads would
    make unsafe), so while waiting the main thread renews the session between blocking reads.
    """
    deadline = None if options.timeout is None else clock() + options.timeout
    renewed_at = clock()
    announced = False
    while True:
        held = lock.try_acquire()
        if held is not None:
            return held
        if not options.wait:
            holder, reason = lock.why_not_acquired()
            events.emit("skipped", session=lock.session_id, reason=reason, holder=holder)
            return RunResult("skipped", 0)
        remaining = None if deadline is None else deadline - clock()
        if remaining is not None and remaining <= 0:
            events.emit("timed-out", session=lock.session_id, waited_ms=ms(options.timeout or 0))
            return RunResult("timed-out", EXIT_WAIT_TIMEOUT)
        if not announced:
            events.emit("waiting", session=lock.session_id)
            announced = True
        if clock() - renewed_at >= lock.job.timings.renew_interval:
            _renew_while_waiting(lock)
            renewed_at = clock()
        _wait_turn(lock, remaining)


def _renew_while_waiting(lock: LockSession) -> None:
    try:
        lock.renew()
    except NotFound:
        raise LocalEnvironmentError(
            f"session {lock.session_id} was invalidated while waiting for {lock.key}"
        ) from None


def _wait_turn(lock: LockSession, remaining: float | None) -> None:
    """Block on the key until it changes, at most one renew interval at a time.

    While another session holds the key, its release or loss changes the key and wakes us at
    once. When the key is free but refused our acquire, a lock-delay is running and nothing will
    change, so block for a fraction of the delay and try again: bounded, not a busy loop.
    """
    entry, index = lock.wait_for_change(0, 0.0)  # index 0: the current state, at once
    wait = lock.job.timings.renew_interval
    if entry is None or not entry.session:
        wait = min(wait, max(MIN_DELAY_RETRY, lock.job.timings.lock_delay / 8))
    if remaining is not None:
        wait = min(wait, remaining)
    lock.wait_for_change(index, max(wait, 0.001))


def _supervise(
    lock: LockSession,
    held: HeldLock,
    command: Sequence[str],
    options: RunOptions,
    supervision: _Supervision,
    events: EventLog,
    clock: Callable[[], float],
    waited: float,
) -> RunResult:
    acquired_at = clock()
    child = Child(command, _child_env(lock, held))  # before any thread starts: see _acquire
    events.emit(  # after the start, which is the hand-over's critical path
        "acquired",
        session=lock.session_id,
        lock_index=held.lock_index,
        waited_ms=ms(waited),
        child_pid=child.pid,
    )
    threading.Thread(target=_renew_loop, args=(lock, supervision, events), daemon=True).start()
    threading.Thread(target=_wait_child, args=(child, supervision), daemon=True).start()
    watcher = threading.Thread(
        target=_watch_loop, args=(lock, held.modify_index, supervision), daemon=True
    )
    watcher.start()
    outcome = _until_child_exits(lock, child, supervision, events, clock)
    if outcome == "ran":
        child_status = child.exit_status
        child.stop(lock.job.timings.kill_grace)  # a script's leftover background children
        _hold_at_least(lock, options, acquired_at, supervision, clock)
    # Release first, then stop the helper threads: setting `stop` wakes the renewer, which would
    # contend for the GIL with the release, the hand-over's critical path (~1.5 ms measured).
    supervision.releasing = True
    released = lock.release() if outcome != "lost" else False
    supervision.stop.set()
    if released is False and outcome != "lost":
        # Consul says the key was no longer ours: the lock was lost at some point while the
        # job ran, unnoticed in time (a paused runner). The job's result cannot be trusted.
        outcome = "lost"
    events.emit(
        "lost" if outcome == "lost" else "released",
        session=lock.session_id,
        lock_index=held.lock_index,
        held_ms=ms(clock() - acquired_at),
        child_status=child.exit_status,
        released=bool(released),
    )
    if outcome == "lost":
        return RunResult("lost", EXIT_LOCK_LOST, held.lock_index)
    status = child.exit_status if outcome == "interrupted" else child_status
    return RunResult(outcome, status if status is not None else 1, held.lock_index)


def _until_child_exits(
    lock: LockSession,
    child: Child,
    supervision: _Supervision,
    events: EventLog,
    clock: Callable[[], float],
) -> str:
    """Wait for the child; fence it when the lock is lost or can no longer be confirmed."""
    timings = lock.job.timings
    while True:
        supervision.wake.clear()
        exited = child.exit_status is not None
        if exited and not supervision.lost and clock() < lock.confirmed_at + _fence_after(lock):
            return "ran"
        if exited:  # it ended, but only after the lock was lost or could not be confirmed
            events.emit(
                "fenced",
                session=lock.session_id,
                reason=supervision.lost or "no confirmation of the lock in time",
                since_confirmed_ms=ms(clock() - lock.confirmed_at),
                child_status=child.exit_status,
            )
            child.stop(timings.kill_grace)  # whatever it left behind
            return "lost"
        if supervision.signum is not None:
            child.signal_group(supervision.signum)
            child.stop(timings.kill_grace)
            return "interrupted"
        confirmed = lock.confirmed_at
        fence_at = confirmed + _fence_after(lock)
        now = clock()
        if supervision.lost or now >= fence_at:
            reason = supervision.lost or "no confirmation of the lock in time"
            events.emit(
                "fenced",
                session=lock.session_id,
                reason=reason,
                since_confirmed_ms=ms(now - confirmed),
            )
            child.stop(timings.kill_grace, kill_by=confirmed + timings.lock_delay - SAFETY_MARGIN)
            return "lost"
        supervision.wake.wait(fence_at - now)


def _fence_after(lock: LockSession) -> float:
    """Seconds after the last confirmation at which the child gets SIGTERM.

    Normally D - G - margin. It is never earlier than the moment the next renewal (sent one
    renew interval after the last, answered within its timeout) could have confirmed the lock,
    or a healthy but slow renewal would fence its own job; with --allow-unsafe timings (D <= G +
    margin) it would even fence at once. Moving SIGTERM later never weakens the promise: the
    SIGKILL still comes at D - margin (`kill_by`), only the job's grace gets shorter.
    """
    timings = lock.job.timings
    safe = timings.lock_delay - timings.kill_grace - SAFETY_MARGIN
    return max(safe, timings.renew_interval + lock.renew_timeout + UNSAFE_FENCE_SLACK)


def _hold_at_least(
    lock: LockSession,
    options: RunOptions,
    acquired_at: float,
    supervision: _Supervision,
    clock: Callable[[], float],
) -> None:
    """min-hold: keep the lock (still renewed) until acquired_at + min_hold, unless told to stop."""
    min_hold = options.min_hold if options.min_hold is not None else lock.job.timings.min_hold
    hold_until = acquired_at + min_hold
    while supervision.signum is None and supervision.lost is None and clock() < hold_until:
        supervision.wake.clear()
        supervision.wake.wait(hold_until - clock())


def _renew_loop(lock: LockSession, supervision: _Supervision, events: EventLog) -> None:
    interval = lock.job.timings.renew_interval
    delay = interval
    while not supervision.stop.wait(delay):
        started = time.monotonic()
        try:
            lock.renew()
        except NotFound:
            supervision.report_lost("session invalidated (renew answered 404)")
            return
        except ConsulError as exc:
            events.emit("renew-failed", session=lock.session_id, error=str(exc))
            delay = min(interval / 4, 1.0)  # retry sooner: the fencing clock is running
            continue
        events.emit("renewed", session=lock.session_id, took_ms=ms(time.monotonic() - started))
        delay = interval


def _watch_loop(lock: LockSession, index: int, supervision: _Supervision) -> None:
    while not supervision.stop.is_set():
        try:
            held, index = lock.watch(index, WATCH_WAIT)
        except ConsulError:
            if supervision.stop.wait(WATCH_ERROR_PAUSE):
                return
            continue
        if not held:
            supervision.report_lost("the lock key no longer names our session")
            return


def _wait_child(child: Child, supervision: _Supervision) -> None:
    child.wait()
    supervision.wake.set()


def _child_env(lock: LockSession, held: HeldLock) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        LOCK_KEY=lock.key,
        LOCK_SESSION=lock.session_id,
        LOCK_INDEX=str(held.lock_index),
        LOCK_MODIFY_INDEX=str(held.modify_index),
        LOCKCTL_JOB=lock.job.name,
        LOCKCTL_WORKER=lock.worker,
    )
    return env


Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None


def _install_signal_handlers(supervision: _Supervision, *, raising: bool) -> dict[int, Handler]:
    """Before the child runs, a signal aborts (the lock is given up); after, it is recorded and
    forwarded to the child by the main loop."""

    def handle(signum: int, _frame: FrameType | None) -> None:
        supervision.signum = signum
        supervision.wake.set()
        if raising:
            raise _Interrupted(signum)

    previous: dict[int, Handler] = {}
    for signum in FORWARDED_SIGNALS:
        previous[signum] = signal.signal(signum, handle)
    return previous


def _restore_signal_handlers(previous: dict[int, Handler]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)
