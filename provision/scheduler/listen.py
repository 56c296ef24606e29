"""`lockctl schedule --listen HOST:PORT`: `/metrics` and `/healthz` over HTTP, nothing else.

The standard library's ThreadingHTTPServer, in a daemon thread of its own: a scrape never
waits for the tick core, and the core never waits for a scrape (they share only the report's
instruments, scheduler/report.py, which prometheus_client makes safe to read while they
change). Bound before any job starts, so a port in use is refused (exit 6) with nothing run.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

from provision.errors import InputError, LocalEnvironmentError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

DEFAULT_HOST = "127.0.0.1"  # loopback: the metrics are for this host's scraper, not the network
CLIENT_TIMEOUT = 10.0  # seconds a connection may sit idle: a stuck client holds no thread long
JOIN_TIMEOUT = 5.0


@dataclass(frozen=True)
class Health:
    """What /healthz answers."""

    status: int  # 200 or 503
    text: str  # one line


def render(registry: CollectorRegistry, accept: str | None) -> tuple[bytes, str]:
    """The exposition (text format, or OpenMetrics when the scraper asks) and its content type."""
    from prometheus_client.exposition import choose_encoder

    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type


@dataclass(frozen=True)
class ListenAddress:
    host: str  # an IP address, or `localhost`
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def loopback(self) -> bool:
        return self.host == "localhost" or ipaddress.ip_address(self.host).is_loopback


def parse_listen(value: str) -> ListenAddress:
    """`HOST:PORT` (IPv6 as `[::1]:PORT`), HOST an IP address or `localhost`, PORT 1..65535;
    `PORT` alone is on 127.0.0.1. InputError (exit 2) naming the flag for anything else."""

    def bad(why: str) -> InputError:
        shown = value if value.isprintable() and len(value) <= 80 else repr(value[:80])
        return InputError(f"--listen {shown}: {why}")

    host, sep, port_text = value.rpartition(":")
    if not sep or not host:  # `9464` or `:9464`: the default host, loopback
        host = DEFAULT_HOST
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if ":" not in host:
            raise bad("brackets are for an IPv6 address only")
    elif ":" in host:
        raise bad("an IPv6 address goes in brackets: [::1]:PORT")
    if not (port_text.isascii() and port_text.isdigit()) or not 1 <= int(port_text) <= 65535:
        raise bad("the port must be a number from 1 to 65535")
    if host != "localhost":
        try:
            host = str(ipaddress.ip_address(host))
        except ValueError:
            raise bad("the host must be an IP address or localhost") from None
    return ListenAddress(host, int(port_text))


class Listener:
    """The HTTP server, bound at construction; `start` serves, `stop` shuts it down."""

    def __init__(
        self, address: ListenAddress, registry: CollectorRegistry, health: Callable[[], Health]
    ) -> None:
        self.address = address
        handler = type(
            "Handler", (_Handler,), {"registry": registry, "health": staticmethod(health)}
        )
        server_class = _IPv6Server if ":" in address.host else _Server
        try:
            self.server = server_class((address.host, address.port), handler)
        except OSError as exc:
            raise LocalEnvironmentError(f"--listen {address}: {_bind_problem(exc)}") from None
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="lockctl-listen", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self.server.shutdown()
            self._thread.join(JOIN_TIMEOUT)
        self.server.server_close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a slow client never holds up the scheduler's exit

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client gone mid-answer is its business: no traceback among the JSON events."""


class _IPv6Server(_Server):
    address_family = socket.AF_INET6


def _bind_problem(exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return "the port is in use (another process listens on it)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return "no such address on this machine"
    if exc.errno == errno.EACCES:
        return "permission denied (a port below 1024 needs privileges)"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host ({exc.strerror})"
    return f"cannot listen ({exc.strerror or exc})"


class _Handler(BaseHTTPRequestHandler):
    registry: ClassVar[CollectorRegistry]
    health: Callable[[], Health]  # a staticmethod of the class made in Listener
    timeout = CLIENT_TIMEOUT
    server_version = "lockctl"
    sys_version = ""

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/metrics":
            body, content_type = render(self.registry, self.headers.get("Accept"))
            self._answer(200, body, content_type)
        elif path == "/healthz":
            verdict = self.health()
            self._answer(verdict.status, f"{verdict.text}\n".encode(), "text/plain; charset=utf-8")
        else:
            self._answer(404, b"not found: /metrics or /healthz\n", "text/plain; charset=utf-8")

    def _answer(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: stderr carries the scheduler's JSON events, one per line, and nothing else."""
