"""The Consul HTTP client: the only code in lockctl that speaks HTTP.

    consul = Consul(resolve_settings())          # flag > CONSUL_* environment > defaults
    session_id = consul.session.create(name="job", ttl=15, lock_delay=15)
    held = consul.kv.put("locks/job/.lock", acquire=session_id)
"""

from __future__ import annotations

import requests

from provision.consul.api import ACLAPI, KVAPI, AgentAPI, SessionAPI, StatusAPI
from provision.consul.settings import ConsulSettings, resolve_settings
from provision.consul.transport import DEFAULT_TOKEN, RetryPolicy, Transport

__all__ = ["DEFAULT_TOKEN", "Consul", "ConsulSettings", "RetryPolicy", "resolve_settings"]


class Consul:
    """One agent's API, by area: `status`, `agent`, `acl`, `session`, `kv`."""

    def __init__(
        self,
        settings: ConsulSettings,
        *,
        session: requests.Session | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.transport = Transport(settings, session=session, retry=retry or RetryPolicy())
        self.status = StatusAPI(self.transport)
        self.agent = AgentAPI(self.transport)
        self.acl = ACLAPI(self.transport)
        self.session = SessionAPI(self.transport)
        self.kv = KVAPI(self.transport)

    @property
    def address(self) -> str:
        return self.transport.settings.address
