"""One GET of one KV key with the standard library's http.client: `lockctl run`'s cheap skip.

A worker whose tick another worker took pays mostly for imports, and requests with urllib3 are
~45 ms of them; http.client is ~5 ms. This answers the one question of that path (does the key
exist, what does it hold, what is the agent's clock) and nothing else. It is an optimisation
only: whatever it cannot read plainly (an error status, a redirect, a refused or broken
connection, TLS trouble, an odd body) is None, and the caller takes the full path, whose client
retries and reports errors properly. Same address, token header and TLS material as the full
client; the token travels in the header, never in the URL.
"""

from __future__ import annotations

import base64
import binascii
import http.client
import json
import ssl
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime
from urllib.parse import quote, urlsplit

from provision.consul.keys import checked_key
from provision.consul.settings import ConsulSettings

MAX_BODY = 1024 * 1024  # a KV value is at most 512 KB; its JSON a little more
TIMEOUT = 2.0


@dataclass(frozen=True)
class QuickEntry:
    exists: bool
    value: bytes | None
    modify_index: int
    date: datetime | None  # the answering agent's clock (HTTP Date)


def quick_get(settings: ConsulSettings, key: str, timeout: float = TIMEOUT) -> QuickEntry | None:
    """The key as Consul's default read sees it, or None: take the full path."""
    path = "/v1/kv/" + quote(checked_key(key), safe="/")
    headers = {"X-Consul-Token": settings.token.reveal()} if settings.token else {}
    try:
        connection = _connection(settings, min(timeout, settings.timeout))
    except (OSError, ValueError, ssl.SSLError):
        return None
    try:
        connection.request("GET", path, headers=headers)
        answer = connection.getresponse()
        body = answer.read(MAX_BODY + 1)
        date = _date(answer.getheader("Date"))
        status = answer.status
    except (OSError, http.client.HTTPException, ValueError):
        return None
    finally:
        connection.close()
    if status == 404:
        return QuickEntry(False, None, 0, date)
    if status != 200 or len(body) > MAX_BODY:
        return None
    return _entry(body, date)


def _connection(settings: ConsulSettings, timeout: float) -> http.client.HTTPConnection:
    parts = urlsplit(settings.address)
    host, port = parts.hostname or "", parts.port
    if parts.scheme != "https":
        return http.client.HTTPConnection(host, port, timeout=timeout)
    context = ssl.create_default_context(cafile=str(settings.ca_cert) if settings.ca_cert else None)
    if not settings.verify_tls:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if settings.client_cert:
        key = str(settings.client_key) if settings.client_key else None
        context.load_cert_chain(str(settings.client_cert), key)
    return http.client.HTTPSConnection(host, port, timeout=timeout, context=context)


def _entry(body: bytes, date: datetime | None) -> QuickEntry | None:
    try:
        raw = json.loads(body)[0]
        encoded = raw.get("Value")
        value = base64.b64decode(encoded) if encoded is not None else None
        return QuickEntry(True, value, int(raw["ModifyIndex"]), date)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, binascii.Error):
        return None


def _date(text: str | None) -> datetime | None:
    try:
        date = parsedate_to_datetime(text) if text else None
    except (TypeError, ValueError, IndexError):
        return None
    return date if date is not None and date.tzinfo is not None else None
