"""Tiny local apps for the HTTP-job tests: a threaded http.server in this process on a loopback
address of the test subnet, recording every request lockctl sends it. What it answers is chosen
by the path: /ok (200), /fail (500 with a body), /hang (no answer until the caller hangs up or
HANG_LIMIT passes: it records whether the caller aborted), /slow (a handler that works SLOW
seconds whatever the caller does, as a real one cannot be stopped, then answers 503) and /busy
(works BUSY seconds, then answers 503). Each records when its handler finished."""

from __future__ import annotations

import select
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HANG_LIMIT = 30.0  # seconds a /hang request waits for its caller to hang up
SLOW = 4.0  # seconds a /slow handler works: past an HTTP job's 2 s timeout
BUSY = 1.0  # seconds a /busy handler works before its 503


@dataclass
class Request:
    path: str
    method: str
    headers: dict[str, str]
    at: float  # time.monotonic() of its arrival
    aborted_after: float | None = None  # /hang: seconds until the caller closed the connection
    finished_at: float | None = None  # time.monotonic() when its handler was done (before any
    # answer is sent: a request the answer caused arrives after it)


@dataclass
class App:
    """One app: its address, and the requests it got (appended by its handler threads)."""

    host: str
    server: ThreadingHTTPServer
    requests: list[Request] = field(default_factory=list)
    thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def url(self, path: str) -> str:
        return f"http://{self.host}:{self.port}{path}"

    def got(self, path: str) -> list[Request]:
        return [r for r in list(self.requests) if r.path == path]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        if self.thread is not None:
            self.thread.join(10)


def start_app(host: str) -> App:
    """An app listening on `host` at a free port, served by a daemon thread until stop()."""
    app: App

    class Handler(BaseHTTPRequestHandler):
        def _any(self) -> None:
            request = Request(self.path, self.command, dict(self.headers), time.monotonic())
            app.requests.append(request)
            if self.path == "/hang":
                request.aborted_after = _wait_for_hang_up(self)
                request.finished_at = time.monotonic()
                return
            status, body = (200, b"refreshed\n") if self.path == "/ok" else (500, b"db is down\n")
            if self.path in ("/slow", "/busy"):
                time.sleep(SLOW if self.path == "/slow" else BUSY)  # the handler's own work
                status, body = 503, b"busy\n"
            request.finished_at = time.monotonic()
            try:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:
                pass  # the caller hung up (its timeout): the work was done all the same

        do_POST = do_PUT = do_GET = _any

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet: the test reads `requests`

    server = ThreadingHTTPServer((host, 0), Handler)
    server.daemon_threads = True
    app = App(host, server)
    app.thread = threading.Thread(target=server.serve_forever, daemon=True)
    app.thread.start()
    return app


def _wait_for_hang_up(handler: BaseHTTPRequestHandler) -> float | None:
    """Seconds until the caller closed the connection (None: it did not within HANG_LIMIT)."""
    began = time.monotonic()
    while time.monotonic() - began < HANG_LIMIT:
        readable, _, _ = select.select([handler.connection], [], [], 0.05)
        if readable:
            try:
                data = handler.connection.recv(1)
            except OSError:
                data = b""
            if not data:
                return time.monotonic() - began
    return None
