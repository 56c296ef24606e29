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
from dataclasses import dataclass
from datetime import datetime, timezone

from provision.consul import NO_RETRY, Consul, ConsulError, RetryPolicy
from provision.consul.models import KVEntry
from provision.workers.config import JobConfig

SESSION_BEHAVIOR = "release"  # a lost session frees the key, it does not delete it
CLEANUP_RETRY = RetryPolicy(deadline=5.0)
MAX_BLOCKING_WAIT = 300.0  # Consul's own cap on a blocking query's wait


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
        self.session_id = ""
        self._clock = clock
        self._confirmed_at = float("-inf")
        self._guard = threading.Lock()

    # -- the session -------------------------------------------------------------------------
    def open(self) -> str:
        """Create the session on the agent we talk to (its node's serfHealth check)."""
        timings = self.job.timings
        self.session_id = self.consul.session.create(
            name=f"lockctl {self.job.name} on {self.worker}",
            ttl=timings.ttl,
            lock_delay=timings.lock_delay,
            behavior=SESSION_BEHAVIOR,
        )
        return self.session_id

    @property
    def renew_timeout(self) -> float:
        """The client timeout of one renew: below the renew interval, so renewals never pile up."""
        return min(self.job.timings.renew_interval / 2, self.consul.settings.timeout)

    def renew(self) -> None:
        """Renew once, with a client timeout below the renew interval; NotFound if gone."""
        sent = self._clock()
        self.consul.session.renew(self.session_id, timeout=self.renew_timeout, retry=NO_RETRY)
        self.confirm(sent)

    def destroy(self) -> None:
        """Destroy the session (best effort: the TTL ends it anyway)."""
        if not self.session_id:
            return
        with contextlib.suppress(ConsulError):
            self.consul.session.destroy(self.session_id)

    # -- the key -----------------------------------------------------------------------------
    def try_acquire(self) -> HeldLock | None:
        """One acquire attempt: our LockIndex, or None while another session holds the key (or
        during lock-delay). PermissionDenied when the token may not write the key.

        The fast path is one transaction (acquire + read back): it is the hand-over's critical
        path. When it is refused, a plain acquire says why, by status code (403 or false).
        """
        holder = self._holder_record()
        sent = self._clock()
        entry = self.consul.kv.acquire_and_read(self.key, holder, self.session_id)
        if entry is not None and entry.session == self.session_id:
            self.confirm(sent)
            return HeldLock(entry.lock_index, entry.modify_index)
        if self.consul.kv.put(self.key, holder, acquire=self.session_id):
            return self.read_held()  # freed between the two calls: ours now
        return None

    def _holder_record(self) -> bytes:
        """What the key says while we hold it (shown by `lockctl status`)."""
        return json.dumps(
            {
                "acquired_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "worker": self.worker,
                "job": self.job.name,
                "host": socket.gethostname(),
                "pid": os.getpid(),
            },
            separators=(",", ":"),
        ).encode()

    def why_not_acquired(self) -> tuple[str | None, str]:
        """For the skipped event: the holding session, and why we could not acquire."""
        try:
            entry, _ = self.consul.kv.get(self.key)
        except ConsulError:
            return None, "held by another session"
        if entry is not None and entry.session:
            holder = _holder_name(entry.value)
            return entry.session, f"held by {holder}" if holder else "held by another session"
        return None, "in lock-delay: the previous holder's session ended without a release"

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
            self._confirmed_at = max(self._confirmed_at, sent_at)

    @property
    def confirmed_at(self) -> float:
        """Monotonic send time of the newest request that proved we still held the session."""
        with self._guard:
            return self._confirmed_at


def holder_record(value: bytes | None) -> dict[str, str]:
    """The record a holder wrote into the key (worker, job, host, pid, acquired_at), or {}."""
    try:
        record = json.loads(value or b"{}")
    except ValueError:
        return {}
    return {k: str(v) for k, v in record.items()} if isinstance(record, dict) else {}


def _holder_name(value: bytes | None) -> str | None:
    """The worker a holder recorded in the key's value, if it is one of ours."""
    worker = holder_record(value).get("worker")
    return f"worker {worker}" if worker else None
