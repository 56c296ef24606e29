"""The Consul HTTP client: the only code in lockctl that speaks HTTP.

consul = Consul(resolve_settings())          # flag > CONSUL_* environment > defaults
session_id = consul.session.create(name="job", ttl=15, lock_delay=15)
held = consul.kv.put("locks/job/.lock", acquire=session_id)

Callers take everything from here (the client, its settings, retry policies, the errors) and
never reach into the transport: `Consul(settings, pool_size=48)` keeps connections open for 48
calls in flight, and `consul.requests_sent` counts the HTTP requests made over its pool.

Importing the package loads only the errors and the settings: the client and its HTTP stack
(requests, ~45 ms) load when first asked for, so `lockctl run`'s cheap skip (quick.py, the
standard library's http.client) never pays for them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from provision.consul.clock import AgentClock
from provision.consul.errors import (
    AnswerTooLarge,
    ConsulError,
    ConsulHTTPError,
    ConsulNotReached,
    ConsulServerError,
    ConsulUnavailable,
    NotFound,
    PermissionDenied,
)
from provision.consul.settings import (
    ConsulSettings,
    GivenSettings,
    check_tls_files,
    normalize_address,
    resolve_settings,
)

if TYPE_CHECKING:
    from provision.consul.client import Consul
    from provision.consul.transport import DEFAULT_TOKEN, NO_RETRY, RetryPolicy
    from provision.consul.txn import KVOp, TxnAnswer, TxnError

_LAZY = {
    "Consul": "client",
    "DEFAULT_TOKEN": "transport",
    "NO_RETRY": "transport",
    "RetryPolicy": "transport",
    "KVOp": "txn",
    "TxnAnswer": "txn",
    "TxnError": "txn",
}

__all__ = [
    "DEFAULT_TOKEN",
    "NO_RETRY",
    "AgentClock",
    "AnswerTooLarge",
    "Consul",
    "ConsulError",
    "ConsulHTTPError",
    "ConsulNotReached",
    "ConsulServerError",
    "ConsulSettings",
    "ConsulUnavailable",
    "GivenSettings",
    "KVOp",
    "NotFound",
    "PermissionDenied",
    "RetryPolicy",
    "TxnAnswer",
    "TxnError",
    "check_tls_files",
    "normalize_address",
    "resolve_settings",
]


def __getattr__(name: str) -> Any:
    """The client's names, imported on first use (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"provision.consul.{module}"), name)
    globals()[name] = value
    return value
