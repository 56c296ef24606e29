"""An HTTP job's call (the sidecar shape: the replica that claimed the tick calls its own app):
what it is, and the pure checks the spec and the worker config both make of it.

The URL is checked like an address, and no secret may ride in it: it is stored in the worker
config, shown in events and docs, and a query string ends in every access log. So userinfo
(`user:pass@`) is refused, and so is a query whose names say credential (token, key, ...).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

METHODS = ("POST", "PUT", "GET", "PATCH", "DELETE")
DEFAULT_METHOD = "POST"
DEFAULT_TIMEOUT = "30s"
TIMEOUT_BOUNDS = (1.0, 86400.0)  # seconds: a request is a tick's work, not a week's
MAX_URL = 2048
# A label of a host name (RFC 1123): letters, digits, inner hyphens.
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
_PATH = re.compile(r"^(/[A-Za-z0-9._~!$&'()*+,;=:@%-]*)*$")
# Query names that carry a credential (matched case-insensitively inside the name).
_SECRET_NAMES = (
    "token",
    "secret",
    "password",
    "passwd",
    "pwd",
    "key",
    "auth",
    "signature",
    "sig",
    "credential",
    "session",
)


@dataclass(frozen=True)
class HttpCall:
    """The request an HTTP job makes: `method` to `url`, aborted after `timeout` seconds."""

    url: str
    method: str = DEFAULT_METHOD
    timeout: float = 30.0


def url_problem(url: str) -> str | None:
    """Why `url` cannot be an HTTP job's URL (None: it can). Never echoes a refused URL, which
    may hold the very secret it is refused for."""
    if len(url) > MAX_URL or not url.isprintable() or any(c.isspace() for c in url):
        return f"must be a printable URL without spaces, at most {MAX_URL} characters"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "is not a URL with a valid port (like http://127.0.0.1:8080/jobs/refresh)"
    if parts.scheme not in ("http", "https"):
        return "must start with http:// or https://"
    if "@" in parts.netloc:
        return "must not carry credentials (user:password@): the app trusts the loopback call"
    if parts.fragment:
        return "must not have a #fragment"
    if port is None:
        return "must name a port (like http://127.0.0.1:8080/...)"
    host = parts.hostname or ""
    if not _host_ok(host):
        return "must name a host: an IP address or a DNS name"
    if not _PATH.match(parts.path or "/"):
        return "must have a plain path (/, /jobs/refresh): percent-encode other characters"
    for name, _ in parse_qsl(parts.query, keep_blank_values=True):
        if any(word in name.lower() for word in _SECRET_NAMES):
            return "must not carry credentials in its query string (a name like token or key)"
    return None


def _host_ok(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    labels = host.rstrip(".").split(".")
    return 0 < len(host) <= 253 and all(_LABEL.match(label) for label in labels)


def method_problem(method: str) -> str | None:
    """Why `method` is not one an HTTP job may use (None: it is)."""
    if method in METHODS:
        return None
    return f"must be one of {', '.join(METHODS)}"


def timeout_problem(timeout: float, every: float | None) -> str | None:
    """Why `timeout` does not fit: its bounds, and below the schedule's interval (a request
    still running at the next tick would make that tick an overlap skip)."""
    low, high = TIMEOUT_BOUNDS
    if not low <= timeout <= high:
        return f"must be between {low:g}s and {high:g}s"
    if every is not None and timeout >= every:
        return f"must be below the schedule's interval ({every:g}s)"
    return None
