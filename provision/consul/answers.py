"""What an agent's HTTP answer becomes: a ConsulResponse, or the ConsulError that says why not.

Error bodies are quoted short, on one line and secret-free; a failure to reach the agent is told
apart from one that reached it and got no answer (only the first is always safe to retry).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any

import requests
from urllib3.exceptions import NewConnectionError

from provision.consul.errors import ConsulNotReached, ConsulUnavailable, SpeaksHttps
from provision.system.secrets import MASK, Secret
from provision.system.text import printable

BODY_EXCERPT_CHARS = 200
PLAIN_HTTP_REFUSAL = "Client sent an HTTP request to an HTTPS server."  # Go's TLS server, 400


@dataclass(frozen=True)
class ConsulResponse:
    """A successful answer: decoded body plus Consul's consistency headers."""

    status: int
    body: Any
    headers: Mapping[str, str] = field(repr=False)

    @property
    def index(self) -> int | None:
        """X-Consul-Index: the raft index to pass to the next blocking query."""
        return int_header(self.headers, "X-Consul-Index")

    @property
    def known_leader(self) -> bool | None:
        value = self.headers.get("X-Consul-Knownleader")
        return None if value is None else value.lower() == "true"

    @property
    def last_contact_ms(self) -> int | None:
        return int_header(self.headers, "X-Consul-Lastcontact")

    @property
    def date(self) -> datetime | None:
        """The answering agent's clock (HTTP Date, whole seconds, rounded down), or None."""
        return answer_date(self.headers)


def answer_date(headers: Mapping[str, str]) -> datetime | None:
    value = headers.get("Date")
    if not value:
        return None
    # a busy client reads the same Date on many answers a second: parsed once (a real one is
    # 29 characters; anything longer is parsed each time, not kept)
    return _cached_date(value) if len(value) <= DATE_MAX else _parse_date(value)


DATE_MAX = 40


@functools.lru_cache(maxsize=256)
def _cached_date(value: str) -> datetime | None:
    return _parse_date(value)


def _parse_date(value: str) -> datetime | None:
    try:
        date = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return date if date is not None and date.tzinfo is not None else None


def int_header(headers: Mapping[str, str], name: str) -> int | None:
    value = headers.get(name)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def unavailable(where: str, exc: requests.exceptions.RequestException) -> ConsulUnavailable:
    if isinstance(exc, requests.exceptions.ConnectTimeout) or connection_refused(exc):
        return ConsulNotReached(f"consul: {where}: cannot connect ({type(exc).__name__})")
    if isinstance(exc, requests.exceptions.Timeout):
        return ConsulUnavailable(f"consul: {where}: no answer within the client timeout")
    if isinstance(exc, requests.exceptions.SSLError):
        return ConsulUnavailable(f"consul: {where}: TLS failure ({type(exc).__name__})")
    return ConsulUnavailable(f"consul: {where}: connection failed ({type(exc).__name__})")


def speaks_https(where: str, address: str, body: str) -> SpeaksHttps:
    """Go's TLS server answered plain HTTP: name the address to give instead."""
    https = "https://" + address.removeprefix("http://")
    return SpeaksHttps(f"consul: {where}: 400 {body}: this address speaks HTTPS: use {https}")


def connection_refused(exc: requests.exceptions.RequestException) -> bool:
    reason = exc.args[0] if exc.args else None
    inner = getattr(reason, "reason", None)
    return isinstance(exc, requests.exceptions.ConnectionError) and isinstance(
        inner, NewConnectionError
    )


def excerpt(text: str, secrets: tuple[Secret | None, ...]) -> str:
    """A short, single-line, secret-free excerpt of an error body, safe to print: whatever the
    far end sent (an ESC, a bidi override) shows as an escape, never raw."""
    for secret in secrets:
        if secret:
            text = text.replace(secret.reveal(), MASK)
    return printable(" ".join(text.split()), BODY_EXCERPT_CHARS)


def decode(answer: requests.Response) -> Any:
    if not answer.content:
        return None
    try:
        return answer.json()
    except ValueError:
        return answer.text
