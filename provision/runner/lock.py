"""One job's lock: a Consul session that acquires, renews, watches and releases one key.

Every request that proves the session still holds the lock (a successful renew, or a consistent
read showing our session on the key) records the monotonic time it was SENT. The server handled
it later, when the session was still valid, so the fencing deadline counted from that send time
is conservative however late the answer arrived.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone

from provision.consul import Consul, ConsulError, RetryPolicy
from provision.consul.models import KVEntry
from provision.runner.holder import Holder, claimed_worker
from provision.sessions import AgentlessNode, OwnSession, SessionTerms
from provision.workers.config import JobConfig

SESSION_BEHAVIOR = "release"  # a lost session frees the key, it does not delete it
CLEANUP_RETRY = RetryPolicy(deadline=5.0)
MAX_BLOCKING_WAIT = 300.0  # Consul's own cap on a blocking query's wait


@dataclass(frozen=True)
class Ending:
    """How a run ended, as the engine knows it when it lets the lock go."""

    verdict: str  # the engine's Outcome value: ran, lost, interrupted, job-timed-out
    exit_status: int | None  # the job's main process (negative: killed by that signal)
    duration: float  # seconds from the job's start (0: it never started)
    attempts: tuple[int | None, ...] | None = None  # each attempt's status, when retried
    retries_cut: str | None = None  # why retries the job still had were not made


@dataclass(frozen=True)
class HeldLock:
    """What acquiring gave us: the fencing token (LockIndex) and the key's ModifyIndex."""

    lock_index: int
    modify_index: int


class LockSession:
    """A session on the local agent, and the lock key it competes for."""

    def __init__(
        self,
        consul: Consul,
        job: JobConfig,
        worker: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.consul = consul
        self.job = job
        self.worker = worker
        self.key = job.lock_key
        timings = job.timings
        terms = SessionTerms(
            name=f"lockctl {job.name} on {worker}",
            ttl=timings.ttl,
            lock_delay=timings.lock_delay,
            behavior=SESSION_BEHAVIOR,
            renew_interval=timings.renew_interval,
        )
        self.session = OwnSession(consul, terms)
        self._clock = clock
        self._confirmed_at = float("-inf")
        self._guard = threading.Lock()
        self._followers: list[Callable[[float], None]] = []

    @property
    def session_id(self) -> str:
        return self.session.id

    # -- the session -------------------------------------------------------------------------
    def place_on(self, node: AgentlessNode) -> None:
        """Make the session on `node`, an agentless worker's catalog node (registered first),
        TTL-only: no agent of ours runs a check Consul could invalidate it by."""
        self.session.terms = replace(self.session.terms, node=node)

    def open(self) -> str:
        """Create the session on the agent we talk to (its node's serfHealth check), or on the
        agentless worker's node (place_on)."""
        return self.session.create()

    @property
    def renew_timeout(self) -> float:
        """The client timeout of one renew: below the renew interval, so renewals never pile up."""
        return self.session.renew_timeout

    def renew(self) -> None:
        """Renew once, with a client timeout below the renew interval; NotFound if gone."""
        sent = self._clock()
        self.session.renew()
        self.confirm(sent)

    def destroy(self) -> None:
        """Destroy the session (best effort: the TTL ends it anyway)."""
        self.session.destroy()

    # -- the key -----------------------------------------------------------------------------
    def try_acquire(self) -> HeldLock | None:
        """One acquire attempt: our LockIndex, or None while another session holds the key (or
        during lock-delay). PermissionDenied when the token may not write the key.

        The fast path is one transaction (acquire + read back): it is the hand-over's critical
        path. When it is refused, a plain acquire says why, by status code (403 or false).
        """
        holder = self._holder_record()
        sent = self._clock()
        entry = self.consul.txn.acquire_and_read(self.key, holder, self.session_id)
        if entry is not None and entry.session == self.session_id:
            self.confirm(sent)
            return HeldLock(entry.lock_index, entry.modify_index)
        if self.consul.kv.put(self.key, holder, acquire=self.session_id):
            return self.read_held()  # freed between the two calls: ours now
        return None

    def _holder_record(self) -> bytes:
        """What the key says while we hold it (shown by `lockctl status`)."""
        return json.dumps(self._holder_fields(), separators=(",", ":")).encode()

    def _holder_fields(self) -> dict[str, str | int]:
        return {
            "acquired_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "worker": self.worker,
            "job": self.job.name,
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }

    def why_not_acquired(self) -> Holder:
        """For the skipped event: who holds the key, as far as Consul vouches for it.

        The key's Session is Consul's word; so is that session's node, when this token may read
        it (one cheap extra read; a worker's own least-privilege token may not, and then the
        node stays unknown). The worker in the key's value is only what the holder wrote.
        """
        try:
            entry, _ = self.consul.kv.get(self.key)
        except ConsulError:
            return Holder(None, None, None)
        if entry is None or not entry.session:
            return Holder(None, None, None, in_lock_delay=True)
        node = _session_node(self.consul, entry.session)
        return Holder(entry.session, node, claimed_worker(entry.value))

    def read_held(self) -> HeldLock | None:
        """Consistent read right after acquiring: our LockIndex, or None if we do not hold it."""
        sent = self._clock()
        entry, _ = self.consul.kv.get(self.key, consistency="consistent")
        if entry is None or entry.session != self.session_id:
            return None
        self.confirm(sent)
        return HeldLock(entry.lock_index, entry.modify_index)

    def wait_for_change(self, index: int, wait: float) -> tuple[KVEntry | None, int]:
        """Block until the key changes past `index` or `wait` passes (never a busy loop)."""
        entry, meta = self.consul.kv.get(self.key, index=index, wait=min(wait, MAX_BLOCKING_WAIT))
        return entry, meta.index or 0

    def watch(self, index: int, wait: float) -> tuple[bool, int]:
        """Consistent blocking read: (do we still hold the key, the index to block on next)."""
        sent = self._clock()
        entry, meta = self.consul.kv.get(
            self.key, consistency="consistent", index=index, wait=min(wait, MAX_BLOCKING_WAIT)
        )
        held = entry is not None and entry.session == self.session_id
        if held:
            self.confirm(sent)
        next_index = meta.index or 0
        # Consul's advice: an index that goes backwards (a snapshot restore) restarts at 0.
        return held, next_index if next_index >= index else 0

    def finish(self, ending: Ending, *, release: bool) -> bool | None:
        """The run is over (`ending` says how): release the key if `release`."""
        return self.release() if release else False

    def release(self) -> bool | None:
        """Release the key (the next contender acquires at once: no lock-delay after release).

        True: released. False: Consul says the key was not ours any more (the lock was lost).
        None: no answer; the session's TTL will free the key.
        """
        try:
            return self.consul.kv.put(self.key, release=self.session_id, retry=CLEANUP_RETRY)
        except ConsulError:
            return None

    # -- the confirmation clock ----------------------------------------------------------------
    def confirm(self, sent_at: float) -> None:
        with self._guard:
            if sent_at <= self._confirmed_at:
                return
            self._confirmed_at = sent_at
            for follower in self._followers:  # under the guard: they see confirmations in order
                follower(sent_at)

    def follow(self, follower: Callable[[float], None]) -> Callable[[], None]:
        """Call `follower` (quick, never blocking) with each newer confirmation; what it returns
        stops that. An isolated body's warden counts its fencing bounds from them."""
        with self._guard:
            self._followers.append(follower)

        def unfollow() -> None:
            with self._guard, contextlib.suppress(ValueError):
                self._followers.remove(follower)

        return unfollow

    @property
    def confirmed_at(self) -> float:
        """Monotonic send time of the newest request that proved we still held the session."""
        with self._guard:
            return self._confirmed_at


def _session_node(consul: Consul, session_id: str) -> str | None:
    """The node Consul says the session lives on; None when gone or not readable to us."""
    try:
        session = consul.session.info(session_id)
    except ConsulError:
        return None
    return session.node if session is not None else None
