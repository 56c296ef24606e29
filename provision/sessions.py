"""lockctl's own Consul sessions, made, renewed and destroyed one way wherever a key is held:
the runner's job lock (runner/lock.py) and lockctl's apply lock (acl/serialize.py).

A renew has a client timeout below the renew interval and is not retried, so renewals never
pile up behind a slow one (the next interval is the retry). A destroy is best effort: a session
whose destroy failed ends with its TTL.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from provision.consul import NO_RETRY, Consul, ConsulError


@dataclass(frozen=True)
class SessionTerms:
    """What a session is made with: its name (shown by `consul operator` and `lockctl status`),
    TTL and LockDelay in seconds, Behavior ("release" or "delete"), and how often it is renewed."""

    name: str
    ttl: float
    lock_delay: float
    behavior: str
    renew_interval: float


class OwnSession:
    """One session on the agent we talk to (its node's serfHealth check), or one made by someone
    else and only used here (`adopt`: renewed, never destroyed)."""

    def __init__(self, consul: Consul, terms: SessionTerms) -> None:
        self.consul = consul
        self.terms = terms
        self.id = ""
        self.adopted = False

    def create(self) -> str:
        """Create the session (PermissionDenied without session write on the node)."""
        terms = self.terms
        self.id = self.consul.session.create(
            name=terms.name, ttl=terms.ttl, lock_delay=terms.lock_delay, behavior=terms.behavior
        )
        return self.id

    def adopt(self, session_id: str) -> None:
        """Use a session someone else keeps and destroys (the scheduler's, across ticks)."""
        self.id, self.adopted = session_id, True

    @property
    def renew_timeout(self) -> float:
        """The client timeout of one renew: below the renew interval, so renewals never pile up."""
        return min(self.terms.renew_interval / 2, self.consul.settings.timeout)

    def renew(self) -> None:
        """Renew once, not retried; NotFound when Consul no longer knows the session."""
        self.consul.session.renew(self.id, timeout=self.renew_timeout, retry=NO_RETRY)

    def destroy(self) -> None:
        """Destroy the session, best effort (the TTL ends it anyway); never an adopted one."""
        if not self.id or self.adopted:
            return
        with contextlib.suppress(ConsulError):
            self.consul.session.destroy(self.id)
