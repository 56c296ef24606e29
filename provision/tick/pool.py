"""A core's Consul sessions: one per (TTL, LockDelay) of its jobs, made when a claim first needs
it and renewed every renew interval by a timer on the core's clock, whatever the number of locks
it holds. Each holder of a lock under a session hears of every renewal that confirmed it (the
time the renewal was SENT: Consul handled it after that) and of the session's end.

A renewal Consul does not answer changes nothing here: the holders' fencing bounds count from
the last confirmation and run out by themselves. A session Consul no longer knows is dropped
(its holders told) and made again when a claim next needs it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from provision.consul import ConsulError
from provision.sessions import AgentlessNode, SessionTerms
from provision.tick.clock import Answer
from provision.tick.edge import Cancellable, Listener, Note, TimerClock
from provision.tick.store import SessionGone, TickStore
from provision.timings import JobTimings

BEHAVIOR = "release"  # a session's end frees its locks (Consul's `delete` would drop the keys)


class Holder(Protocol):
    """A lock held under a pool's session: told of confirmations and of the session's end."""

    def confirm(self, sent: float) -> None: ...

    def lose(self, reason: str) -> None: ...


def confirmation_time(sent: float, received: float) -> float:
    """When a renewal's success vouches for the lock from: when it was sent. Consul handled it
    at some moment after that, maybe long before a late answer arrived (docs: the fencing
    bound counts from the send time, never from the answer)."""
    return sent


@dataclass(frozen=True)
class PoolKey:
    """What tells two of a core's sessions apart: the timings Consul holds a session to, and
    where it lives (an agentless worker's catalog node; None: the serving agent's). A
    datacenter joins it when a core claims in more than one."""

    ttl: float
    lock_delay: float
    node: str | None = None


def session_terms(
    worker: str, timings: JobTimings, node: AgentlessNode | None, name: str | None = None
) -> SessionTerms:
    """A replica's session for these timings, named as every release names it (`lockctl
    status` and operators read the name; a fleet upgrades one replica at a time); `name`: a
    plain lock's own (`lockctl <job> on <worker>`)."""
    ttl, delay, interval = timings.ttl, timings.lock_delay, timings.renew_interval
    if name is None:
        name = f"lockctl schedule on {worker} (ttl {ttl:g}s, lock-delay {delay:g}s)"
    return SessionTerms(name, ttl, delay, BEHAVIOR, interval, node)


def pool_key(terms: SessionTerms) -> PoolKey:
    return PoolKey(terms.ttl, terms.lock_delay, None if terms.node is None else terms.node.name)


@dataclass(eq=False)
class _Kept:
    id: str
    terms: SessionTerms
    holders: list[Holder] = field(default_factory=list)
    timer: Cancellable | None = None
    confirmed: float | None = None  # the newest renewal answered: when it was sent


class SessionPool:
    """The sessions of one core (one replica), by PoolKey."""

    def __init__(
        self,
        store: TickStore,
        clock: TimerClock,
        worker: str,
        node: AgentlessNode | None = None,
        listener: Listener | None = None,
        name: str | None = None,
    ) -> None:
        """`node`: an agentless worker's catalog node, its sessions' home; `name`: the
        sessions' name, when not a replica's (a plain lock's)."""
        self.store, self.clock, self.worker, self.node = store, clock, worker, node
        self.listener, self.name = listener, name
        self._kept: dict[PoolKey, _Kept] = {}
        self.closed = False

    def session_for(self, timings: JobTimings) -> str:
        """The session for these timings, made now if there is none (ConsulError if Consul
        cannot make it: the claim that needs it fails closed)."""
        terms = session_terms(self.worker, timings, self.node, self.name)
        key = pool_key(terms)
        kept = self._kept.get(key)
        if kept is None:
            kept = _Kept(self.store.create_session(terms), terms)
            self._kept[key] = kept
            self._arm(kept, self.clock.monotonic())
            self._note("session-created", f"TTL {terms.ttl:g}s", kept)
        return kept.id

    def hold(self, session_id: str, holder: Holder) -> bool:
        """`holder` holds a lock under `session_id`: whether that session is still kept (a
        renewal may have found it gone while the claim was answered)."""
        kept = self._find(session_id)
        if kept is None:
            return False
        kept.holders.append(holder)
        if kept.confirmed is not None:
            # A renewal sent after the claim says the session lived then, so the lock the claim
            # took was still held: a run whose start waited (a burst's backlog) counts from it,
            # as every holder of the session does; one sent before the claim changes nothing
            holder.confirm(kept.confirmed)
        return True

    def let_go(self, session_id: str, holder: Holder) -> None:
        kept = self._find(session_id)
        if kept is not None and holder in kept.holders:
            kept.holders.remove(holder)

    def drop(self, session_id: str, reason: str) -> None:
        """Consul no longer knows the session: forget it, and tell whoever held a lock under
        it that the lock is gone."""
        kept = self._find(session_id)
        if kept is None:
            return
        del self._kept[pool_key(kept.terms)]
        if kept.timer is not None:
            kept.timer.cancel()
        self._note("session-gone", reason, kept)
        for holder in list(kept.holders):
            holder.lose(reason)

    def keep_only(self, in_use: Iterable[JobTimings]) -> None:
        """After a reload: destroy the sessions no job's timings ask for any more and no lock is
        held under (one a run still holds goes when the next reload finds it free, or at the
        end). Best effort: a session not destroyed ends by its TTL."""
        wanted = {pool_key(session_terms(self.worker, t, self.node, self.name)) for t in in_use}
        for key, kept in list(self._kept.items()):
            if key in wanted or kept.holders:
                continue
            del self._kept[key]
            if kept.timer is not None:
                kept.timer.cancel()
            with contextlib.suppress(ConsulError):
                self.store.destroy_session(kept.id)

    def close(self) -> None:
        """Destroy every session (the end of a core): another replica claims at once, without
        waiting out a TTL and LockDelay. Best effort: a session not destroyed ends by its TTL."""
        self.closed = True
        for kept in list(self._kept.values()):
            if kept.timer is not None:
                kept.timer.cancel()
            with contextlib.suppress(ConsulError):
                self.store.destroy_session(kept.id)
        self._kept.clear()

    def _find(self, session_id: str) -> _Kept | None:
        return next((k for k in self._kept.values() if k.id == session_id), None)

    def _arm(self, kept: _Kept, last_sent: float) -> None:
        # every renew interval from the last send, not from its answer: a slow answer does not
        # push the next renewal later
        due = last_sent + kept.terms.renew_interval
        # the client gives up within half an interval, so renewals never pile up
        timeout = kept.terms.renew_interval / 2
        # sent by the clock, not waited for here: sent on time and answered as prompt timers,
        # ahead of whatever backlog the core's thread has. A renewal in line with the other
        # callbacks (a burst of claims, body starts, completions) was sent, or its answer
        # heard, after the fencing bound, and healthy runs were fenced (docs/tick-core.md)
        kept.timer = self.clock.send_at(
            due,
            lambda: self.store.renew_session(kept.id, timeout=timeout),  # the store's, when sent
            functools.partial(self._renewed, kept),
        )

    def _renewed(self, kept: _Kept, sent: float, answer: Answer[None]) -> None:
        """A renewal's answer (sent at `sent`): the holders confirmed from its send time, the
        next renewal an interval after it; a session gone dropped; no answer, try again."""
        if self._find(kept.id) is not kept:
            return  # dropped or closed meanwhile
        try:
            answer()
        except SessionGone:
            self.drop(kept.id, "the session is gone (Consul no longer knows it)")
            return
        except ConsulError as exc:
            self._arm(kept, sent)  # no answer: the holders' bounds run on; try again
            self._note("renew-failed", str(exc), kept)
            return
        answered = self.clock.monotonic()
        confirmed = confirmation_time(sent, answered)
        kept.confirmed = confirmed
        self._arm(kept, sent)
        for holder in list(kept.holders):
            holder.confirm(confirmed)
        self._note("renewed", "", kept, seconds=answered - sent)

    def _note(self, kind: str, detail: str, kept: _Kept, seconds: float | None = None) -> None:
        if self.listener is not None:
            note = Note(kind, "", None, detail, session=kept.id, terms=kept.terms, seconds=seconds)
            self.listener(note)
