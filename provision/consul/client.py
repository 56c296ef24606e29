"""The Consul client: one agent's API by area, over one transport (see the package's docs)."""

from __future__ import annotations

import copy
import dataclasses
from typing import TYPE_CHECKING, Any

from provision.consul.api import ACLAPI, KVAPI, AgentAPI, HealthAPI, SessionAPI, StatusAPI
from provision.consul.catalog import CatalogAPI
from provision.consul.clock import AgentClock
from provision.consul.identity import IdentityAPI
from provision.consul.settings import ConsulSettings
from provision.consul.transport import HTTPPool, RetryPolicy, Transport
from provision.consul.txn import TxnAPI

if TYPE_CHECKING:
    import requests

    from provision.system.secrets import Secret


class Consul:
    """One agent's API, by area: `status`, `agent`, `health`, `acl`, `session`, `catalog`, `kv`,
    `txn`.

    `pool_size`: connections kept open per agent, for callers with that many calls in flight
    (default: requests' 10). `max_in_flight`: at most that many calls at once, blocking queries
    aside; the others wait their turn within their timeout. `batch_txns`: transactions sent
    with `batch=True` at the same moment are merged (consul/batch.py: a scheduler's claims and
    completions when many jobs tick at once). `agent_clock`: learns the agent's clock from every
    answer (consul/clock.py). `session`: an injected `requests.Session` (tests).
    """

    def __init__(
        self,
        settings: ConsulSettings,
        *,
        retry: RetryPolicy | None = None,
        pool_size: int | None = None,
        session: requests.Session | None = None,
        max_in_flight: int | None = None,
        batch_txns: bool = False,
        agent_clock: AgentClock | None = None,
    ) -> None:
        self._batch_txns = batch_txns
        pool = HTTPPool.open(
            settings.address,
            session=session,
            pool_size=pool_size,
            max_in_flight=max_in_flight,
            agent_clock=agent_clock,
        )
        transport = Transport(settings, pool, retry=retry or RetryPolicy())
        self._attach(transport)

    def _attach(self, transport: Transport) -> None:
        self.transport = transport
        self.status = StatusAPI(transport)
        self.agent = AgentAPI(transport)
        self.health = HealthAPI(transport)
        self.acl = ACLAPI(transport)
        self.identity = IdentityAPI(transport)  # auth methods, roles, binding rules, login
        self.session = SessionAPI(transport)
        self.catalog = CatalogAPI(transport)  # a worker without an agent: its node
        self.kv = KVAPI(transport)
        self.txn = TxnAPI(transport, batched=self._batch_txns)

    def _over(self, transport: Transport) -> Consul:
        clone = copy.copy(self)
        clone._attach(transport)
        return clone

    def with_settings(self, **changes: Any) -> Consul:
        """The same client pointed elsewhere or with another token, sharing the HTTP pool."""
        settings = dataclasses.replace(self.transport.settings, **changes)
        return self._over(self.transport.derive(settings=settings))

    def in_datacenter(self, datacenter: str | None) -> Consul:
        """The same client asking `datacenter`'s KV, sessions and transactions (None: the
        agent's own), sharing the HTTP pool and its token."""
        if datacenter == self.settings.datacenter:
            return self
        return self.with_settings(datacenter=datacenter)

    def with_retry(self, retry: RetryPolicy) -> Consul:
        """The same client with another retry policy for every call, sharing the HTTP pool."""
        return self._over(self.transport.derive(retry=retry))

    def with_pool(self, pool_size: int) -> Consul:
        """The same client over a new pool of `pool_size` connections, its count at zero."""
        return Consul(
            self.settings, retry=self.retry, pool_size=pool_size, agent_clock=self.agent_clock
        )

    def use_token(self, token: Secret | None) -> None:
        """Send `token` by default from now on, in this client and every one sharing its token
        source (a reload read the same token file again)."""
        self.transport.tokens.replace(token)

    @property
    def settings(self) -> ConsulSettings:
        return self.transport.settings

    @property
    def agent_clock(self) -> AgentClock | None:
        return self.transport.agent_clock

    @property
    def retry(self) -> RetryPolicy:
        return self.transport.retry

    @property
    def address(self) -> str:
        return self.transport.settings.address

    @property
    def requests_sent(self) -> int:
        """HTTP requests sent over this client's pool so far, retries included, by every client
        sharing the pool (`with_settings`, `with_retry`)."""
        return self.transport.count.value
