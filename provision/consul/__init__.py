"""The Consul HTTP client: the only code in lockctl that speaks HTTP.

consul = Consul(resolve_settings())          # flag > CONSUL_* environment > defaults
session_id = consul.session.create(name="job", ttl=15, lock_delay=15)
held = consul.kv.put("locks/job/.lock", acquire=session_id)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import requests

from provision.consul.api import ACLAPI, KVAPI, AgentAPI, HealthAPI, SessionAPI, StatusAPI
from provision.consul.settings import ConsulSettings, resolve_settings
from provision.consul.transport import DEFAULT_TOKEN, RetryPolicy, Transport

__all__ = ["DEFAULT_TOKEN", "Consul", "ConsulSettings", "RetryPolicy", "resolve_settings"]


class Consul:
    """One agent's API, by area: `status`, `agent`, `health`, `acl`, `session`, `kv`."""

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
        self.health = HealthAPI(self.transport)
        self.acl = ACLAPI(self.transport)
        self.session = SessionAPI(self.transport)
        self.kv = KVAPI(self.transport)

    def with_settings(self, **changes: Any) -> Consul:
        """The same client pointed elsewhere or with another token, sharing the HTTP pool."""
        settings = dataclasses.replace(self.transport.settings, **changes)
        return Consul(settings, session=self.transport.session, retry=self.transport.retry)

    @property
    def address(self) -> str:
        return self.transport.settings.address
