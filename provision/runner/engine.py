"""The lock-and-run engine of a plain lock (`lockctl run` of a job without a schedule; a job
with one runs its tick on the tick core, runner/on_core.py): run a command on this worker only
while it holds the job's lock.

    open session -> acquire once (or --wait) -> start the job in its own PID namespace
    -> renew every R, watch the key, fence on loss or at the job's timeout (provision/fencing.py
    decides, runner/supervisor.py acts) -> the job and its leftovers end -> min-hold
    -> release -> destroy the session

The engine keeps no process-global state: it installs no signal handler (whoever owns the
process's signals hands it a StopRequest) and joins its helper threads before it returns, so one
process can run it many times. It relies on one process attribute its owner sets once: being a
child subreaper (child.become_subreaper), so the job's orphans are re-parented to us and found.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from provision.consul import Consul, ConsulSettings, NotFound
from provision.errors import EXIT_WAIT_TIMEOUT, LocalEnvironmentError
from provision.fencing import Outcome, waiting_verdict
from provision.runner.body import JobBody
from provision.runner.child import Child, check_program
from provision.runner.events import EventLog, ms
from provision.runner.http_job import HttpJob
from provision.runner.lock import Ending, HeldLock, LockSession
from provision.runner.output import runner_secrets
from provision.runner.results import RunOptions, RunResult, SkipReason
from provision.runner.stop import StopRequest
from provision.runner.supervisor import Supervisor
from provision.sessions import AgentlessNode
from provision.system.secrets import Secret
from provision.workers.config import JobConfig

MIN_DELAY_RETRY = 0.1
STOP_POLL = 1.0  # seconds: the longest blocking wait while waiting for the lock (a stop's delay)


@dataclass(frozen=True)
class PlainAsk:
    """What `lockctl run` of a plain lock (a job without a schedule) asks of the engine: the
    job, this worker (and its agentless node), the command and the flags."""

    job: JobConfig
    worker: str
    command: tuple[str, ...]
    options: RunOptions
    node: AgentlessNode | None = None


def run_job(
    consul: Consul,
    ask: PlainAsk,
    events: EventLog,
    stop: StopRequest,
    clock: Callable[[], float] = time.monotonic,
) -> RunResult:
    """Run the ask's command under the job's lock; the result says what happened and the exit
    code. An agentless worker's catalog node (`ask.node`) is registered and left registered
    (another run of the same worker may hold a session on it: deregistering would end it)."""
    lock = LockSession(consul, ask.job, ask.worker, clock)
    if ask.node is not None:  # an agentless worker: its session is TTL-only, on its own node
        lock.place_on(ask.node)
    return _run_locked(lock, ask.command, ask.options, events, stop, clock)


def _run_locked(
    lock: LockSession,
    command: Sequence[str],
    options: RunOptions,
    events: EventLog,
    stop: StopRequest,
    clock: Callable[[], float],
) -> RunResult:
    # Refused here (exit 2) if it cannot start, before any lock is taken for it. Its init
    # starts in its namespace while we acquire: the hand-over then only says go. An HTTP job
    # (runner/http_job.py) has no command: its body is a call to the app, made when the lock
    # is ours, so nothing is prepared for it before.
    child: JobBody | None = None
    prepare = _command_body(lock, command)
    if lock.job.http is None:
        child = prepare()
    try:
        if stop.requested:
            return _interrupted(stop, lock, events)
        lock.open()
        began = clock()
        held = _acquire(lock, options, events, stop, clock)
        if isinstance(held, RunResult):
            return held
        if stop.requested:  # asked to stop while acquiring: do not start the job
            lock.finish(Ending(Outcome.INTERRUPTED.value, None, 0.0), release=True)
            return _interrupted(stop, lock, events)
        supervisor = Supervisor(lock, held, options, events, stop, clock)
        if child is None:
            child = prepare()
        return supervisor.run(child, clock() - began, prepare)
    finally:
        if child is not None:
            child.abort()  # the prepared init, when the job never started
            child.close()
        lock.destroy()  # whatever happened above; a stop request now changes nothing


def _command_body(lock: LockSession, command: Sequence[str]) -> Callable[[], JobBody]:
    """What makes each attempt's job of `command` (or of the job's `http` call): checked now,
    before any lock is taken."""
    environment = job_environment(os.environ)
    http = lock.job.http
    if http is None:
        check_program(command, environment)
    hidden = credential_files(lock.consul.settings)
    secrets = _secrets(lock.consul.settings, lock.consul.transport.tokens.current)

    checked = [http is None]  # the first attempt's command was checked just now

    def prepare() -> JobBody:
        if http is not None:
            return HttpJob(http, secrets)
        fresh, checked[0] = checked[0], False  # a retry's attempt checks it again
        return Child(command, environment, None, hidden, secrets, checked=fresh)

    return prepare


def _interrupted(stop: StopRequest, lock: LockSession, events: EventLog) -> RunResult:
    """Stopped before the job started: say so, and exit as a shell would (128 + the signal)."""
    signum = stop.signum or signal.SIGTERM
    events.emit("interrupted", session=lock.session_id or None, signal=signal.Signals(signum).name)
    return RunResult(Outcome.INTERRUPTED, 128 + signum)


def _acquire(
    lock: LockSession,
    options: RunOptions,
    events: EventLog,
    stop: StopRequest,
    clock: Callable[[], float],
) -> HeldLock | RunResult:
    """Acquire once, or with --wait wait for a turn; a RunResult when not acquired.

    No thread runs in this phase (the job may be forked with a preexec hook, which threads would
    make unsafe), so while waiting the main thread renews the session between blocking reads.
    """
    give_up_at = None if options.timeout is None else clock() + options.timeout
    renewed_at = clock()
    announced = False
    while True:
        if stop.requested:
            return _interrupted(stop, lock, events)
        held = lock.try_acquire()
        if held is not None:
            return held
        if not options.wait:
            return _skipped(lock, events)
        verdict = waiting_verdict(clock(), give_up_at, stop.signum)
        if verdict is Outcome.TIMED_OUT:
            events.emit("timed-out", session=lock.session_id, waited_ms=ms(options.timeout or 0))
            return RunResult(verdict, EXIT_WAIT_TIMEOUT)
        if verdict is Outcome.INTERRUPTED:
            return _interrupted(stop, lock, events)
        if not announced:
            events.emit("waiting", session=lock.session_id)
            announced = True
        if clock() - renewed_at >= lock.job.timings.renew_interval:
            _renew_while_waiting(lock)
            renewed_at = clock()
        _wait_turn(lock, None if give_up_at is None else give_up_at - clock())


def _skipped(lock: LockSession, events: EventLog) -> RunResult:
    """Not acquired, and not waiting for it: say who has the lock, and why (held by another
    session, or in lock-delay)."""
    holder = lock.why_not_acquired()
    skip = SkipReason.LOCK_DELAY if holder.in_lock_delay else SkipReason.TAKEN
    events.emit("skipped", session=lock.session_id, **holder.event_fields())
    return RunResult(Outcome.SKIPPED, 0, skip=skip)


def _renew_while_waiting(lock: LockSession) -> None:
    try:
        lock.renew()
    except NotFound:
        raise LocalEnvironmentError(
            f"session {lock.session_id} was invalidated while waiting for {lock.key}"
        ) from None


def _wait_turn(lock: LockSession, remaining: float | None) -> None:
    """Block on the key until it changes, at most STOP_POLL at a time.

    While another session holds the key, its release or loss changes the key and wakes us at
    once. When the key is free but refused our acquire, a lock-delay is running and nothing will
    change, so block for a fraction of the delay and try again: bounded, not a busy loop. The
    cap lets a stop request be seen within STOP_POLL; it costs no hand-over time.
    """
    entry, index = lock.wait_for_change(0, 0.0)  # index 0: the current state, at once
    wait = min(lock.job.timings.renew_interval, STOP_POLL)
    if entry is None or not entry.session:
        wait = min(wait, max(MIN_DELAY_RETRY, lock.job.timings.lock_delay / 8))
    if remaining is not None:
        wait = min(wait, remaining)
    lock.wait_for_change(index, max(wait, 0.001))


# lockctl's own credentials, and where they are: the job must not act as the worker.
RUNNER_ONLY = (
    "CONSUL_HTTP_TOKEN",
    "CONSUL_HTTP_TOKEN_FILE",
    "CONSUL_CLIENT_CERT",
    "CONSUL_CLIENT_KEY",
    "LOCKCTL_CONFIG",  # names the token file and the TLS pair
    "LOCKCTL_BEARER_TOKEN_FILE",  # the JWT a worker logs in with (lockctl.env)
)


def job_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The job's environment: the runner's, less lockctl's own Consul credentials."""
    return {key: value for key, value in environ.items() if key not in RUNNER_ONLY}


def credential_files(settings: ConsulSettings) -> tuple[str, ...]:
    """The worker's own secrets on this host (its token file, its TLS client pair), which the
    job's mount namespace covers: the job cannot read them, though it runs as the same user.
    A worker that logs in has its bearer-token file (its JWT) covered the same way."""
    files = (
        settings.token_file,
        settings.client_key,
        settings.client_cert,
        settings.bearer_token_file,
    )
    return tuple(os.path.abspath(path) for path in files if path is not None)


def _secrets(settings: ConsulSettings, current: Secret | None = None) -> list[str]:
    """What the job's output tail must never show (runner/output.py), read before any lock:
    the token sent now too (a login's, which the settings do not hold)."""
    sent = current if current is not None else settings.token
    token = None if sent is None else sent.reveal()
    return runner_secrets(token, os.environ, settings.client_key)
