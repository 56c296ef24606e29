"""The replica's Consul sessions: one per distinct (TTL, LockDelay) of its jobs, not one per job.

Every lock this replica's jobs take is held under the session of the job's (TTL, LockDelay)
pair, made when a tick first needs it and renewed once per renew interval by one thread, however
many jobs share it (the shortest renew interval among them). A session Consul no longer knows
(its TTL ran out while this host was cut off, its node failed its serfHealth check) is dropped
and made again at the next tick that needs it; a run holding a lock under it is fenced by its
own renewals, as with a session of its own. So a lost session fences every
job of this replica that holds a lock under it at that moment, and only those: the others hold
no lock between their ticks.

An agentless worker's sessions (`node`) are TTL-only, on the catalog node registered for it
(provision/sessions.py): Consul invalidates one only when its TTL runs out, not when the
replica's host goes away.

Sessions are destroyed at the end (embed's Locker closed), after the last run: another
replica then takes the next tick at once, without LockDelay.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from provision.consul import NO_RETRY, Consul, ConsulError, NotFound
from provision.runner.events import EventLog
from provision.sessions import AgentlessNode, SessionTerms, create_session
from provision.tick.pool import BEHAVIOR as SESSION_BEHAVIOR
from provision.timings import JobTimings

POLL = 0.25  # seconds between two looks at which session is due for renewal


@dataclass
class _Kept:
    session_id: str
    renew_every: float  # the shortest renew interval of the jobs sharing it
    renewed_at: float


class SessionPool:
    """This replica's sessions by (TTL, LockDelay); safe to use from every job's thread."""

    def __init__(
        self,
        consul: Consul,
        worker: str,
        events: EventLog,
        clock: Callable[[], float] = time.monotonic,
        *,
        node: AgentlessNode | None = None,
    ) -> None:
        self.consul, self.worker, self.events, self.clock = consul, worker, events, clock
        self.node = node  # an agentless worker's catalog node: TTL-only sessions on it
        self._kept: dict[tuple[float, float], _Kept] = {}
        self._lock = threading.Lock()  # guards _kept; never held across an HTTP call
        # held while a session is made: the jobs whose first ticks come together (300 at :00)
        # wait for one create instead of each making a session and destroying all but one
        self._creating = threading.Lock()
        self._halt = threading.Event()
        self._renewer: threading.Thread | None = None

    def session_for(self, timings: JobTimings) -> str:
        """The session a job with these timings holds its lock under (made when first needed)."""
        pair = (timings.ttl, timings.lock_delay)
        known = self._known(pair, timings)
        if known is not None:
            return known
        with self._creating:
            return self._known(pair, timings) or self._create(pair, timings)

    def _known(self, pair: tuple[float, float], timings: JobTimings) -> str | None:
        with self._lock:
            kept = self._kept.get(pair)
            if kept is None:
                return None
            kept.renew_every = min(kept.renew_every, timings.renew_interval)
            return kept.session_id

    def _create(self, pair: tuple[float, float], timings: JobTimings) -> str:
        terms = SessionTerms(
            name=f"lockctl schedule on {self.worker} (ttl {timings.ttl:g}s, "
            f"lock-delay {timings.lock_delay:g}s)",
            ttl=timings.ttl,
            lock_delay=timings.lock_delay,
            behavior=SESSION_BEHAVIOR,
            renew_interval=timings.renew_interval,
            node=self.node,
        )
        session_id = create_session(self.consul, terms)  # outside the guard: HTTP calls
        with self._lock:
            self._kept[pair] = _Kept(session_id, timings.renew_interval, self.clock())
        ttl_only = {"ttl_only": True, "node": self.node.name} if self.node else {}
        self.events.emit("session-created", session=session_id, ttl=timings.ttl, **ttl_only)
        return session_id

    @property
    def sessions(self) -> list[str]:
        with self._lock:
            return [kept.session_id for kept in self._kept.values()]

    # -- renewal ---------------------------------------------------------------------------
    def start(self) -> None:
        self._renewer = threading.Thread(target=self._renew_loop, name="lockctl-sessions")
        self._renewer.daemon = True  # a renew hung in a call never keeps the process alive
        self._renewer.start()

    def _renew_loop(self) -> None:
        while not self._halt.wait(POLL):
            self.renew_due()

    def renew_due(self) -> None:
        """Renew each session whose interval has passed; drop those Consul no longer knows."""
        with self._lock:
            due = [(pair, kept) for pair, kept in self._kept.items() if self._is_due(kept)]
        for pair, kept in due:
            self._renew(pair, kept)

    def _is_due(self, kept: _Kept) -> bool:
        return self.clock() - kept.renewed_at >= kept.renew_every

    def _renew(self, pair: tuple[float, float], kept: _Kept) -> None:
        timeout = min(kept.renew_every / 2, self.consul.settings.timeout)
        try:
            self.consul.session.renew(kept.session_id, timeout=timeout, retry=NO_RETRY)
        except NotFound:
            self._forget(pair, kept)
            self.events.emit("session-lost", session=kept.session_id)
            return
        except ConsulError as exc:
            self.events.emit("renew-failed", session=kept.session_id, error=str(exc))
            return  # tried again at the next poll: its interval has passed
        kept.renewed_at = self.clock()

    def _forget(self, pair: tuple[float, float], kept: _Kept) -> None:
        with self._lock:
            if self._kept.get(pair) is kept:
                del self._kept[pair]

    # -- the end ---------------------------------------------------------------------------
    def close(self) -> None:
        """Stop renewing and destroy every session (after the last run: no lock is held)."""
        self._halt.set()
        if self._renewer is not None:
            self._renewer.join(POLL * 4)
        with self._lock:
            kept, self._kept = list(self._kept.values()), {}
        for one in kept:
            self._destroy(one.session_id)
            self.events.emit("session-destroyed", session=one.session_id)

    def _destroy(self, session_id: str) -> None:
        with contextlib.suppress(ConsulError):
            self.consul.session.destroy(session_id)
