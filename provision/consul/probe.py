"""Transport-security probes of one agent, for `lockctl verify`'s tls-http check: what a plain-HTTP
client, a TLS client that checks the agent's certificate, and a TLS client without a certificate
each get from its address. Plain facts: nothing here decides pass or fail
(provision/verify/tls_judge.py does).

Raw sockets and the standard library's ssl, not requests: the probes must see what requests
hides (a handshake that completed before the agent's refusal, an alert, a connection closed
without an answer). Each probe sends one `GET /v1/status/leader` (no token: it needs none, and a
probe that may go over plain HTTP must never carry one) and reads at most MAX_ANSWER bytes, all
within its timeout.
"""

from __future__ import annotations

import socket
import ssl
import time
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

from provision.consul.settings import ConsulSettings
from provision.system.text import printable

PROBE_PATH = "/v1/status/leader"
PLAIN_HTTP_REFUSAL = "Client sent an HTTP request to an HTTPS server."  # Go's TLS server, 400
MAX_ANSWER = 4096  # bytes of an answer read: a status line, headers and a short body
PROBE_TIMEOUT = 5.0  # seconds for one probe at most, its connect, handshake and reads together
DETAIL_LIMIT = 200

# What one probe got (Outcome.kind):
ANSWERED = "answered"  # an HTTP answer: `status` and the body's start in `detail`
TLS_REFUSED = "tls-refused"  # the TLS layer failed: an alert from the agent (a missing or bad
# client certificate) or a protocol mismatch; `detail` is the reason
CLOSED = "closed"  # the connection closed or was reset before an answer
UNTRUSTED = "untrusted"  # our side refused the agent's certificate; `detail` says why
UNREACHABLE = "unreachable"  # no connection (refused, no route, no connect within the timeout)
TIMEOUT = "timeout"  # connected, but no answer within the timeout
ERROR = "error"  # the probe could not be made (an unreadable CA file or client pair)


@dataclass(frozen=True)
class Outcome:
    kind: str
    status: int | None = None
    detail: str = ""  # printable: the agent's words, or the error's
    handshake_done: bool = False  # TLS: the handshake completed (the agent's certificate was
    # checked, when the probe checks it), whatever came after


@dataclass(frozen=True)
class TlsProbe:
    """What one agent address did with plain HTTP and with TLS."""

    address: str
    plain_http: Outcome  # plain HTTP to the address's host and port
    verified: Outcome | None  # https only: TLS checking the agent's certificate (chain and host
    # name) against `ca`, presenting lockctl's client pair when one is given
    without_cert: Outcome | None  # https only: TLS without a client certificate (not checking the
    # agent's: this one asks only whether the agent refuses a client that has none)
    ca: str  # what `verified` checked against: the CA file, or "the system CAs"
    client_pair: bool  # `verified` presented a client certificate
    peer: str  # the agent's certificate, as `verified` saw it: subject, names, issuer

    @property
    def https(self) -> bool:
        return self.address.startswith("https://")


def probe_tls(settings: ConsulSettings, address: str) -> TlsProbe:
    """Probe `address` (scheme://host:port) with the CA and client pair of `settings`."""
    parts = urlsplit(address)
    host, port = parts.hostname or "", parts.port or 0
    budget = min(settings.timeout, PROBE_TIMEOUT)
    ca = str(settings.ca_cert) if settings.ca_cert else "the system CAs"
    pair = settings.client_cert is not None
    plain = _plain_http(host, port, budget)
    if parts.scheme != "https":
        return TlsProbe(address, plain, None, None, ca, pair, "")
    verified, peer = _over_tls(host, port, budget, lambda: _checking_context(settings))
    without_cert, _ = _over_tls(host, port, budget, _anonymous_context)
    return TlsProbe(address, plain, verified, without_cert, ca, pair, peer)


def _plain_http(host: str, port: int, budget: float) -> Outcome:
    deadline = time.monotonic() + budget
    try:
        raw = socket.create_connection((host, port), timeout=budget)
    except OSError as exc:
        return Outcome(UNREACHABLE, detail=_reason(exc))
    with raw:
        return _exchange(raw, host, deadline)


def _over_tls(host: str, port: int, budget: float, context_for: Any) -> tuple[Outcome, str]:
    """One request over TLS; what it got, and the agent's certificate when it was checked."""
    deadline = time.monotonic() + budget
    try:
        context: ssl.SSLContext = context_for()
    except (OSError, ValueError) as exc:  # a missing CA file, a key that does not match
        return Outcome(ERROR, detail=f"cannot load the TLS files: {_reason(exc)}"), ""
    try:
        raw = socket.create_connection((host, port), timeout=budget)
    except OSError as exc:
        return Outcome(UNREACHABLE, detail=_reason(exc)), ""
    name = host if context.check_hostname else None
    with context.wrap_socket(raw, server_hostname=name, do_handshake_on_connect=False) as tls:
        try:
            _bound(tls, deadline)
            tls.do_handshake()
        except ssl.SSLCertVerificationError as exc:
            return Outcome(UNTRUSTED, detail=printable(exc.verify_message or str(exc))), ""
        except OSError as exc:
            return _failure(exc), ""
        peer = _describe(tls.getpeercert()) if context.verify_mode != ssl.CERT_NONE else ""
        return replace(_exchange(tls, host, deadline), handshake_done=True), peer


def _checking_context(settings: ConsulSettings) -> ssl.SSLContext:
    cafile = str(settings.ca_cert) if settings.ca_cert else None
    context = ssl.create_default_context(cafile=cafile)  # chain and host name checked
    if settings.client_cert:
        key = str(settings.client_key) if settings.client_key else None
        context.load_cert_chain(str(settings.client_cert), key)
    return context


def _anonymous_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # this probe asks only about the client's certificate
    return context


def _exchange(sock: socket.socket, host: str, deadline: float) -> Outcome:
    """Send the probe's request; what came back. With TLS 1.3 a refused client certificate
    shows here, on the first read, not in the handshake (measured on 1.8.7)."""
    request = f"GET {PROBE_PATH} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    received = b""
    try:
        _bound(sock, deadline)
        sock.sendall(request.encode("ascii"))
        while len(received) < MAX_ANSWER:
            _bound(sock, deadline)
            chunk = sock.recv(MAX_ANSWER - len(received))
            if not chunk:
                break
            received += chunk
    except OSError as exc:
        if not received:
            return _failure(exc)
    return _answer(received)


def _answer(received: bytes) -> Outcome:
    head, _, body = received.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    fields = status_line.split(" ", 2)
    if len(fields) < 2 or not fields[0].startswith("HTTP/") or not fields[1].isdigit():
        if not received:
            return Outcome(CLOSED, detail="closed without an answer")
        return Outcome(ERROR, detail=f"not an HTTP answer: {printable(status_line, 80)}")
    text = body.decode("utf-8", errors="replace").strip()
    return Outcome(ANSWERED, status=int(fields[1]), detail=printable(text, DETAIL_LIMIT))


def _failure(exc: OSError) -> Outcome:
    if isinstance(exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError, ConnectionError)):
        return Outcome(CLOSED, detail=_reason(exc))  # reset, broken pipe, EOF: a refusal too
    if isinstance(exc, ssl.SSLError):
        return Outcome(TLS_REFUSED, detail=_reason(exc))
    if isinstance(exc, TimeoutError):
        return Outcome(TIMEOUT, detail="no answer within the probe's timeout")
    return Outcome(ERROR, detail=_reason(exc))


def _bound(sock: socket.socket, deadline: float) -> None:
    """Give the next socket operation what is left of the probe's time (at least a little)."""
    sock.settimeout(max(deadline - time.monotonic(), 0.01))


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return printable(f"{exc.reason} ({type(exc).__name__})", DETAIL_LIMIT)
    if isinstance(exc, OSError) and exc.strerror:
        return printable(f"{exc.strerror} ({type(exc).__name__})", DETAIL_LIMIT)
    return printable(f"{exc} ({type(exc).__name__})".strip(), DETAIL_LIMIT)


def _describe(cert: dict[str, Any] | None) -> str:
    """Subject CN, alternative names and issuer CN of a checked certificate, printable."""
    if not cert:
        return ""
    subject = _common_name(cert.get("subject", ()))
    issuer = _common_name(cert.get("issuer", ()))
    names = ", ".join(f"{kind}:{value}" for kind, value in cert.get("subjectAltName", ()))
    return printable(f"{subject} [{names}] issued by {issuer}", DETAIL_LIMIT * 2)


def _common_name(name: Any) -> str:
    for rdn in name:
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return "?"
