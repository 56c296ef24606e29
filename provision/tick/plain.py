"""A plain lock on the tick core's pieces: `lockctl run` of a job without a schedule. No tick,
no ledger record, no housekeeping: the lock alone, held for one run of a body.

    acquire  the session (the pool's: made now, renewed every renew interval on the clock),
             then the lock alone (store.acquire_lock: one transaction, the fencing token read
             back); refused: held by another session, or in lock-delay (`refusal`)
    run      HeldRun, as a tick's: the body under the fencing decision (provision/fencing.py),
             min-hold, the job's timeout, retries, a lost session fenced; its end releases the
             lock alone (Claimed.ledger False), again until Consul answers
    watch    while the run holds the lock, a blocking read of the key (store.watch_lock, on the
             clock's timers: a ThreadTimerClock waits for it aside, tick/aside.py): the key
             deleted or taken by another session is a lost lock, seen before the next renewal;
             our session on it confirms the lock from the read's send time, as a renewal does.
             One run per process holds one such read: the core's runs (many per replica) do
             not watch, their renewals alone confirm them
    stop     the run interrupted and released, then the session destroyed

Everything here runs on one TimerClock's thread; `quiet` is set when nothing more is to come
(the acquire refused or failed, or the run over and its lock let go). A --wait is the caller's:
it watches the key (store.watch_lock) and asks `acquire` again.
"""

from __future__ import annotations

import functools
import json
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass

from provision.consul import ConsulError
from provision.ledger.records import TickRecord
from provision.ledger.store import Claim
from provision.outcomes import Outcome
from provision.tick.clock import Clock
from provision.tick.core import Identity
from provision.tick.edge import Body, Cancellable, Listener, Note, SkipReason, TimerClock
from provision.tick.held import Claimed, HeldRun
from provision.tick.pool import SessionPool
from provision.tick.store import REFUSALS, InvalidSession, JobKeys, TickStore, lock_delayed
from provision.timings import JobTimings

WATCH_WAIT = 60.0  # seconds per blocking read of a held lock's key (renewals confirm between)
# The watch starts this long after the acquire: a run that ends sooner (most jobs) costs Consul
# no watch and the process no connection held for it (hundreds of runs at one tick would
# overflow the connection pool).
WATCH_AFTER = 1.0
WATCH_ERROR_PAUSE = 1.0  # seconds before a watch Consul did not answer is sent again
WAIT_POLL = 1.0  # seconds: the longest blocking read of the key while waiting (a stop's delay)
MIN_DELAY_RETRY = 0.1  # seconds: the least wait before an acquire refused for lock-delay


@dataclass(frozen=True)
class PlainJob:
    """A job as a plain lock runs it: its keys and timings (min-hold as asked)."""

    keys: JobKeys
    timings: JobTimings

    @property
    def name(self) -> str:
        return self.keys.name


def plain_session_name(job: str, worker: str) -> str:
    """A plain lock's session, as every release names it (`lockctl status` shows it)."""
    return f"lockctl {job} on {worker}"


def refusal_skip(claim: Claim) -> SkipReason:
    """Why an acquire was refused, in a word: lock-delay, or held by another session."""
    return SkipReason.LOCK_DELAY if lock_delayed(claim) else SkipReason.OTHER


class PlainLock:
    """One job's plain lock on a TimerClock: `acquire()` (again, with --wait), `stop()`;
    `quiet` once nothing more is to come. What happened: `refusal` (the last acquire's, when
    refused), `failure` (Consul did not answer, or refused the token), `held` (the run, whose
    `completed` record says how it ended; never written anywhere)."""

    def __init__(
        self,
        store: TickStore,
        clock: TimerClock,
        identity: Identity,
        job: PlainJob,
        bodies: Callable[[], Body],
        listener: Listener | None = None,
    ) -> None:
        self.store, self.clock, self.identity, self.job = store, clock, identity, job
        self.bodies, self.listener = bodies, listener
        name = plain_session_name(job.name, identity.worker)
        self.pool = SessionPool(store, clock, identity.worker, identity.node, listener, name)
        self.quiet = threading.Event()
        self.refusal: Claim | None = None
        self.failure: ConsulError | None = None
        self.held: HeldRun | None = None
        self.session: str | None = None
        self.stopping = False
        # Whether the process was asked to stop (a signal), seen at once from the clock's
        # thread: the stop itself comes a moment later, and neither an acquire nor a job may
        # start meanwhile (runner/plain.py sets it)
        self.stop_asked: Callable[[], bool] = lambda: False
        self._over = False  # the run's end: its lock let go (or given up)
        self._acquiring = False  # an acquire is out: a stop's end waits for its answer
        self._watch_timer: Cancellable | None = None

    # -- the acquire -----------------------------------------------------------------------------
    def acquire(self) -> None:
        """Try the lock once (on the clock's thread): a run under it, or `refusal`/`failure`."""
        self.quiet.clear()
        self.refusal = self.failure = None
        if self.stopping or self.stop_asked() or self.held is not None:
            self.quiet.set()
            return
        self._acquiring = True
        try:
            self._acquire()
        finally:
            self._acquiring = False
        if self.stopping and not self.running:  # a stop came while it was out: its end now
            self._close()

    def _acquire(self) -> None:
        for _ in range(2):  # a session Consul forgot (its TTL ran out) is made again once
            try:
                session = self.session = self.pool.session_for(self.job.timings)
                sent = self.clock.monotonic()
                claim = self.store.acquire_lock(self.job.keys, session, self._holder())
            except InvalidSession as exc:
                self.pool.drop(self.session or "", str(exc))
                continue
            except ConsulError as exc:
                self._failed(exc)
                return
            if claim.won:
                self._run(claim, session, sent)
            else:
                self.refusal = claim
                self._note("skipped", claim.lock_refusal or "", skip=refusal_skip(claim))
                self.quiet.set()
            return
        self._failed(ConsulError("the session was gone twice while acquiring"))

    def _failed(self, exc: ConsulError) -> None:
        self.failure = exc
        kind = "refused" if isinstance(exc, REFUSALS) else "unavailable"
        self._note(kind, str(exc))
        self.quiet.set()

    def _holder(self) -> bytes:
        """The lock's value while we hold it (`lockctl status` shows it): the same fields as a
        tick's claim writes (tick/core.py), without a tick."""
        fields: dict[str, str | int] = {
            "acquired_at": self.clock.wall().isoformat(timespec="seconds"),
            "worker": self.identity.worker,
            "job": self.job.name,
        }
        if self.identity.host is not None:
            fields["host"] = self.identity.host
        if self.identity.pid is not None:
            fields["pid"] = self.identity.pid
        return json.dumps(fields, separators=(",", ":")).encode()

    # -- the run ---------------------------------------------------------------------------------
    def _run(self, claim: Claim, session: str, sent: float) -> None:
        record = TickRecord(
            self.clock.wall(),  # what the run's note names it by: never recorded
            Outcome.RUNNING,
            worker=self.identity.worker,
            session=session,
            host=self.identity.host,
            pid=self.identity.pid,
            lock_index=claim.lock_index,
            modify_index=claim.lock_modify_index,
        )
        timings = self.job.timings
        claimed = Claimed(self.job.keys, timings, record, session, sent, ledger=False)
        retry_body = self.bodies if timings.retries else None
        held = HeldRun(self.store, self.clock, claimed, self._done, self.listener, retry_body)
        self.held = held
        self._note("claimed", f"lock index {claim.lock_index}", record)
        if not self.pool.hold(session, held):
            held.lose("the session is gone")
        if self.stopping or self.stop_asked():  # ended interrupted, its job never started
            held.interrupt(signal.SIGTERM)
        held.start(self.bodies())
        if not self._over:  # from the acquire's index: a change meanwhile is seen at once
            self._watch_later(claim.lock_modify_index, WATCH_AFTER)

    def _done(self, held: HeldRun) -> None:
        self._over = True
        self.pool.let_go(held.claimed.session, held)
        if self._watch_timer is not None:
            self._watch_timer.cancel()
            self._watch_timer = None
        if self.stopping:
            self.pool.close()
        self.quiet.set()

    def _close(self) -> None:
        self.pool.close()
        self.quiet.set()

    # -- the lock's watch ------------------------------------------------------------------------
    def _watch_later(self, index: int, delay: float = 0.0) -> None:
        at = self.clock.monotonic() + delay
        self._watch_timer = self.clock.call_at(at, functools.partial(self._watch, index))

    def _watch(self, index: int) -> None:
        """One blocking read of the held lock's key: another session on it (or none) is a
        lost lock; else the next read from the index it answered."""
        held = self.held
        if held is None or held.finished or self._over:
            return
        sent = self.clock.monotonic()
        try:
            holder, seen = self.store.watch_lock(self.job.keys, index, WATCH_WAIT)
        except ConsulError:
            self._watch_later(index, WATCH_ERROR_PAUSE)
            return
        if held.finished or self._over:
            return  # ended meanwhile: our own release changed the key
        if holder != held.claimed.session:
            held.lose("the lock key no longer names our session")
            return
        held.confirm(sent)  # a consistent read showed our session on the key after its send
        self._watch_later(seen)

    # -- the end ---------------------------------------------------------------------------------
    def stop(self) -> None:
        """A stop (a signal): the run interrupted and released, then the session destroyed;
        `quiet` once that is done (at once when nothing runs). An acquire out (it waits aside,
        and the stop runs meanwhile) is answered first: won, its run ends `interrupted` and
        lets go of the lock, never left to the session's end and its lock-delay."""
        self.stopping = True
        if self.running:
            assert self.held is not None
            self.held.interrupt(signal.SIGTERM)
            return
        if not self._acquiring:
            self._close()

    @property
    def running(self) -> bool:
        """A run holds (or is letting go of) the lock: its end is still to come."""
        return self.held is not None and not self._over

    @property
    def completed(self) -> TickRecord | None:
        """How the run ended (never written anywhere), once its lock was let go."""
        return None if self.held is None else self.held.completed

    def _note(
        self,
        kind: str,
        detail: str,
        record: TickRecord | None = None,
        skip: SkipReason | None = None,
    ) -> None:
        if self.listener is not None:
            tick = None if record is None else record.tick  # a run's notes name it alike
            self.listener(Note(kind, self.job.keys.unit, tick, detail, record, skip))


def await_turn(
    store: TickStore, clock: Clock, job: PlainJob, remaining: float | None, delayed: bool
) -> None:
    """--wait between two acquires: block on the lock's key until it changes, at most
    WAIT_POLL (a stop is seen within it), so the holder's release wakes the waiter at once. A
    lock in lock-delay (`delayed`, or found free) changes nothing until the delay ends: looked
    at again within an eighth of it. `remaining`: --timeout's time left."""
    wait = WAIT_POLL if remaining is None else min(WAIT_POLL, max(remaining, 0.001))
    try:
        holder, index = store.watch_lock(job.keys, 0, 0.0)
        if delayed or holder is None:
            wait = min(wait, max(MIN_DELAY_RETRY, job.timings.lock_delay / 8))
        store.watch_lock(job.keys, index, wait)
    except ConsulError:
        clock.sleep_until(clock.monotonic() + wait)
