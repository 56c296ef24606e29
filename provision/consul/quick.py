"""A GET or two with the standard library's http.client: `lockctl run`'s cheap skips (a tick's
record, or a plain lock's holder and the node of its session).

A worker whose tick another worker took pays mostly for imports, and requests with urllib3 are
~45 ms of them; http.client is ~5 ms. This answers the one question of each path (does the key
exist, what does it hold, which session holds it, what is the agent's clock; on which node
that session lives) and nothing else. It is an optimisation
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
    session: str | None = None  # the session holding it as a lock


def quick_get(settings: ConsulSettings, key: str, timeout: float = TIMEOUT) -> QuickEntry | None:
    """The key as Consul's default read sees it, or None: take the full path."""
    answer = _get(settings, "/v1/kv/" + quote(checked_key(key), safe="/"), timeout)
    if answer is None:
        return None
    status, body, date = answer
    if status == 404:
        return QuickEntry(False, None, 0, date)
    return _entry(body, date) if status == 200 else None


def quick_session_node(
    settings: ConsulSettings, session_id: str, timeout: float = TIMEOUT
) -> str | None:
    """The node Consul says the session lives on; None when gone, not readable to this token
    (a worker's least-privilege token may not read others' sessions), or not plainly read."""
    answer = _get(settings, "/v1/session/info/" + quote(session_id, safe=""), timeout)
    if answer is None or answer[0] != 200:
        return None
    try:
        node = json.loads(answer[1])[0]["Node"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return node if isinstance(node, str) else None


def _get(
    settings: ConsulSettings, path: str, timeout: float
) -> tuple[int, bytes, datetime | None] | None:
    """One GET: its status, its body (at most MAX_BODY) and the agent's clock; None when it could
    not be made or read plainly."""
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
    return None if len(body) > MAX_BODY else (status, body, date)


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
        session = raw.get("Session") or None
        if session is not None and not isinstance(session, str):
            return None
        return QuickEntry(True, value, int(raw["ModifyIndex"]), date, session)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, binascii.Error):
        return None


def _date(text: str | None) -> datetime | None:
    try:
        date = parsedate_to_datetime(text) if text else None
    except (TypeError, ValueError, IndexError):
        return None
    return date if date is not None and date.tzinfo is not None else None
