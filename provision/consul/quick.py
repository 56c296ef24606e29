"""A GET or two over one plain socket: `lockctl run`'s cheap skips (a tick's record, or a plain
lock's holder and the node of its session).

A worker whose tick another worker took pays mostly for imports: requests with urllib3 are ~45
ms of them, and even http.client is ~15 (it parses headers with the email package). The two
answers read here are small and Consul's agent writes them one way (HTTP/1.1, a Content-Length
or a chunked body, an IMF-fixdate Date), so this reads them itself, with the socket module (and
ssl only for an https address), on one keep-alive connection: the holder's key and its
session's node cost one connection, one TLS handshake. It answers the one question of each
path (does the key exist, what does it hold, which session holds it, what is the agent's clock;
on which node that session lives) and nothing else. It is an optimisation only: whatever it
cannot read plainly (an error status, a redirect, a refused or broken connection, TLS trouble,
a header or body it does not expect) is None, and the caller takes the full path, whose client
retries and reports errors properly. Same address, token header and TLS material as the full
client; the token travels in the header, never in the URL.
"""

from __future__ import annotations

import base64
import binascii
import json
import socket
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING
from urllib.parse import quote, urlsplit

from provision.consul.keys import checked_key
from provision.consul.settings import ConsulSettings

if TYPE_CHECKING:
    import ssl
    from typing import BinaryIO

MAX_BODY = 1024 * 1024  # a KV value is at most 512 KB; its JSON a little more
MAX_LINE = 8192  # a status, header or chunk-size line
MAX_HEADERS = 100
TIMEOUT = 2.0
_HEX = b"0123456789abcdefABCDEF"
_MONTHS = {
    name: number
    for number, name in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1
    )
}


@dataclass(frozen=True)
class QuickEntry:
    exists: bool
    value: bytes | None
    modify_index: int
    date: datetime | None  # the answering agent's clock (HTTP Date)
    session: str | None = None  # the session holding it as a lock


@dataclass(frozen=True)
class Answer:
    """One HTTP answer, read whole."""

    status: int
    body: bytes
    date: datetime | None  # the answering agent's clock
    keep_alive: bool  # the connection may carry the next request


def quick_get(settings: ConsulSettings, key: str, timeout: float = TIMEOUT) -> QuickEntry | None:
    """The key as Consul's default read sees it, or None: take the full path."""
    with _Reader(settings, timeout) as reader:
        return _read_entry(reader, key)


def quick_holder(
    settings: ConsulSettings, key: str, timeout: float = TIMEOUT
) -> tuple[QuickEntry | None, str | None]:
    """The key as quick_get reads it and, when a session holds it, the node Consul says that
    session lives on (None when gone, not readable to this token: a worker's least-privilege
    token may not read others' sessions, or not plainly read). One connection for both."""
    with _Reader(settings, timeout) as reader:
        entry = _read_entry(reader, key)
        if entry is None or entry.session is None:
            return entry, None
        return entry, _session_node(reader, entry.session)


def _read_entry(reader: _Reader, key: str) -> QuickEntry | None:
    answer = reader.get("/v1/kv/" + quote(checked_key(key), safe="/"))
    if answer is None:
        return None
    if answer.status == 404:
        return QuickEntry(False, None, 0, answer.date)
    return _entry(answer.body, answer.date) if answer.status == 200 else None


def _session_node(reader: _Reader, session_id: str) -> str | None:
    answer = reader.get("/v1/session/info/" + quote(session_id, safe=""))
    if answer is None or answer.status != 200:
        return None
    try:
        node = json.loads(answer.body)[0]["Node"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return node if isinstance(node, str) else None


class _Reader:
    """GETs to one agent over one connection, opened at the first and kept while the agent
    keeps it; closed when the reads are done."""

    def __init__(self, settings: ConsulSettings, timeout: float) -> None:
        self._settings = settings
        self._timeout = min(timeout, settings.timeout)
        self._socket: socket.socket | None = None
        self._stream: BinaryIO | None = None

    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, *_exc: object) -> None:
        self._close()

    def get(self, path: str) -> Answer | None:
        """One GET: its answer, or None when it could not be made or read plainly."""
        try:
            if self._stream is None:
                self._stream = self._open()
            assert self._socket is not None
            self._socket.sendall(self._request(path))
            answer = read_answer(self._stream)
        except (OSError, ValueError):  # ssl's errors are OSErrors, its certificate's ValueErrors
            self._close()
            return None
        if answer is None or not answer.keep_alive:
            self._close()  # what is left of an answer not read plainly must not be read as the next
        return answer

    def _request(self, path: str) -> bytes:
        parts = urlsplit(self._settings.address)
        lines = [f"GET {path} HTTP/1.1", f"Host: {parts.netloc}", "Accept-Encoding: identity"]
        if self._settings.token:
            token = self._settings.token.reveal()
            if not (token.isascii() and token.isprintable()):  # no header may be smuggled in
                raise ValueError("token: not one header value")
            lines.append(f"X-Consul-Token: {token}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")

    def _open(self) -> BinaryIO:
        parts = urlsplit(self._settings.address)
        host, port, https = parts.hostname or "", parts.port, parts.scheme == "https"
        if not host:
            raise ValueError("no host")
        # The host as bytes: given a str, socket and ssl would load the idna codec (~3 ms) to
        # encode it. A host that is not ASCII is a ValueError here: the full path reads it.
        name = host.encode("ascii")
        sock = _connect(name, port or (443 if https else 80), self._timeout)
        try:
            if https:
                sock = _tls_context(self._settings).wrap_socket(sock, server_hostname=name)
            stream = sock.makefile("rb")
        except BaseException:
            sock.close()
            raise
        self._socket = sock
        return stream

    def _close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def _connect(host: bytes, port: int, timeout: float) -> socket.socket:
    """A TCP connection to the first of the host's addresses that takes it (as
    socket.create_connection, which types its host as str)."""
    failed: OSError = OSError(f"{host!r}: no address")
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
        except OSError as exc:
            sock.close()
            failed = exc
            continue
        return sock
    raise failed


def _tls_context(settings: ConsulSettings) -> ssl.SSLContext:
    import ssl  # here, not at the top: an http address never needs it

    context = ssl.create_default_context(cafile=str(settings.ca_cert) if settings.ca_cert else None)
    if not settings.verify_tls:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if settings.client_cert:
        key = str(settings.client_key) if settings.client_key else None
        context.load_cert_chain(str(settings.client_cert), key)
    return context


def read_answer(stream: BinaryIO) -> Answer | None:
    """An HTTP/1.x answer from `stream`: status, headers, a Content-Length or chunked body of at
    most MAX_BODY; None for anything else (no length, an odd line, a short read)."""
    line = stream.readline(MAX_LINE + 1)
    parts = line.split(None, 2)
    if (
        not line.endswith(b"\n")
        or len(parts) < 2
        or parts[0] not in (b"HTTP/1.1", b"HTTP/1.0")
        or not parts[1].isdigit()
    ):
        return None
    headers = _headers(stream)
    if headers is None:
        return None
    body = _body(stream, headers)
    if body is None:
        return None
    status = int(parts[1])
    keep_alive = (
        parts[0] == b"HTTP/1.1"
        and headers.get(b"connection", b"").lower() != b"close"
        and status in (200, 404)
    )
    return Answer(status, body, _date(headers.get(b"date")), keep_alive)


def _headers(stream: BinaryIO) -> dict[bytes, bytes] | None:
    headers: dict[bytes, bytes] = {}
    for _ in range(MAX_HEADERS):
        line = stream.readline(MAX_LINE + 1)
        if line in (b"\r\n", b"\n"):
            return headers
        name, colon, value = line.partition(b":")
        if not line.endswith(b"\n") or not colon or name.strip().lower() in headers:
            return None  # cut short, too long, not a header, or said twice
        headers[name.strip().lower()] = value.strip()
    return None


def _body(stream: BinaryIO, headers: dict[bytes, bytes]) -> bytes | None:
    encoding = headers.get(b"transfer-encoding")
    if encoding is not None:
        return _chunked(stream) if encoding.lower() == b"chunked" else None
    length = headers.get(b"content-length", b"")
    if not length.isdigit() or int(length) > MAX_BODY:
        return None
    body = stream.read(int(length))
    return body if len(body) == int(length) else None


def _chunked(stream: BinaryIO) -> bytes | None:
    body = bytearray()
    while True:
        line = stream.readline(MAX_LINE + 1)
        size = line.split(b";", 1)[0].strip()
        if not line.endswith(b"\n") or not size or size.strip(_HEX):
            return None
        if int(size, 16) == 0:
            break
        if len(body) + int(size, 16) > MAX_BODY:
            return None
        chunk = stream.read(int(size, 16))
        if len(chunk) != int(size, 16) or stream.readline(3) not in (b"\r\n", b"\n"):
            return None
        body += chunk
    return bytes(body) if _headers(stream) is not None else None  # the trailer, if any


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


def _date(text: bytes | None) -> datetime | None:
    """An IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`, what HTTP/1.1 senders must send), else
    None."""
    try:
        _, day, month, year, clock, zone = (text or b"").decode("ascii").split()
        hour, minute, second = clock.split(":")
        if zone != "GMT":
            return None
        numbers = int(year), _MONTHS[month], int(day), int(hour), int(minute), int(second)
        return datetime(*numbers, tzinfo=timezone.utc)
    except (ValueError, KeyError):
        return None
