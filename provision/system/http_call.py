"""An HTTP job's call (the sidecar shape: the replica that claimed the tick calls its own app):
what it is, and the pure checks the spec and the worker config both make of it.

The URL is checked like an address, and no secret may ride in it: it is stored in the worker
config, shown in events and docs, and a query string ends in every access log. So userinfo
(`user:pass@`) is refused, and so is a query whose names say credential (token, key, ...).

Its target is judged by what the URL says (`judge_target`), never by a DNS answer: the spec and
lint stay pure and offline, and a name may resolve elsewhere later anyway.
"""

from __future__ import annotations

import enum
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


# Why an HTTP job never retries a timed-out call (the spec, the worker config and the retry
# decision all say it in these words): the handler that timed out may still be running.
RETRY_ON_TIMEOUT_REFUSED = (
    "an HTTP handler cannot be stopped, so a timed-out call is never retried (the retry would "
    "run beside the handler still going); make the handler idempotent with the Idempotency-Key "
    "header, or use a command job"
)

# Link-local and cloud instance-metadata targets, refused by the spec unless the job says
# allow_remote_target: the answer's first 2 KB go into the tick record, which every reader of
# the job's prefix can read, and a metadata service answers with credentials (role keys,
# tokens). Networks as the providers document them; names as they resolve inside those clouds
# (the short ones through the instances' DNS search domain).
METADATA_TARGETS = (
    "169.254.0.0/16",  # IPv4 link-local: the IMDS of AWS, GCP, Azure, OCI, OpenStack, DO...
    "fe80::/10",  # IPv6 link-local
    "fd00:ec2::254/128",  # AWS IMDS over IPv6
    "100.100.100.200/32",  # Alibaba Cloud
    "192.0.0.192/32",  # Oracle Cloud's older metadata address
    "168.63.129.16/32",  # Azure's WireServer (the host's agent endpoint)
    "metadata",  # GCE's short name
    "metadata.google.internal",
    "metadata.goog",
    "metadata.azure.com",
    "instance-data",  # EC2's short name
    "instance-data.ec2.internal",
    "metadata.tencentyun.com",
    "metadata.platformequinix.com",
    "metadata.packet.net",
)
_METADATA_NETWORKS = tuple(ipaddress.ip_network(t) for t in METADATA_TARGETS if "/" in t)
_METADATA_NAMES = frozenset(t for t in METADATA_TARGETS if "/" not in t)
# One part of an IPv4 address as inet_aton(3) reads it (and so the system's resolver, which
# never asks DNS for it): 0x-hex, 0-octal or decimal; `http://2852039166:80/` is 169.254.169.254.
_C_NUMBER = re.compile(r"0[xX][0-9A-Fa-f]+|0[0-7]*|[1-9][0-9]*")


class Target(str, enum.Enum):
    """What an HTTP job's URL says it calls (judge_target)."""

    LOCAL = "local"  # localhost or a loopback literal: the replica's own app
    REMOTE = "remote"  # any other host: `lockctl lint` warns
    METADATA = "metadata"  # link-local or a cloud metadata service: the spec refuses it


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


def judge_target(url: str) -> Target:
    """Whether `url` calls the replica's own app, another host, or a link-local or metadata
    service: by what the URL says (its host, as a literal the system's resolver would read
    without DNS, or as a name), never by a lookup."""
    host = (urlsplit(url).hostname or "").rstrip(".")
    if host == "localhost":
        return Target.LOCAL
    address = _literal(host)
    if address is None:
        return Target.METADATA if host in _METADATA_NAMES else Target.REMOTE
    if address.is_loopback:
        return Target.LOCAL
    if any(address in network for network in _METADATA_NETWORKS):
        return Target.METADATA
    return Target.REMOTE


def _literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address `host` is a literal of, an IPv4-mapped IPv6 one as its IPv4 (the socket
    connects there); None for a name."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return _inet_aton(host)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _inet_aton(host: str) -> ipaddress.IPv4Address | None:
    """`host` as inet_aton(3) reads it (1 to 4 parts, the last filling the remaining bytes:
    `127.1`, `0x7f000001`), or None when it is not such a number."""
    parts = host.split(".")
    if not 1 <= len(parts) <= 4 or not all(_C_NUMBER.fullmatch(part) for part in parts):
        return None
    *head, last = [_c_value(part) for part in parts]
    if any(value > 255 for value in head) or last >= 256 ** (4 - len(head)):
        return None
    number = 0
    for value in head:
        number = number * 256 + value
    return ipaddress.IPv4Address(number * 256 ** (4 - len(head)) + last)


def _c_value(part: str) -> int:
    if part[:2].lower() == "0x":
        return int(part, 16)
    return int(part, 8) if part.startswith("0") else int(part)
