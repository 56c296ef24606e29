"""An HTTP job's body (under the core's held lock: runner/core_body.py): the replica that
claimed the tick calls its own app.

The request carries what the app needs to guard its work and nothing of the worker's: the tick,
the fencing token (`X-Lockctl-Lock-Index`, the lock's LockIndex), the moment the request is
aborted (`X-Lockctl-Deadline`), the job and the worker, the attempt (`X-Lockctl-Attempt`) and
the run's `Idempotency-Key`, the same for every attempt; never the worker's token, never a TLS
key. Its outcome is the status code: 2xx succeeded (exit status 0), anything else failed (1)
with the status and reason in the record's stderr, and the start of the body in its stdout.
An app that is down fails the same way with the connection error as the reason.

Stopping it (a lost lock, the timeout, a stop) closes the connection: the app sees the request
end, but whatever the app already does goes on unless it checks the token. That is why HTTP
jobs are fenced by the token the app's guarded resource checks, not by a kill.

This is not Consul's HTTP (provision/consul/): a plain http.client connection to the app, with
its own timeout and the system's CA store for https.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from urllib.parse import urlsplit

from provision.fencing import BodyFence
from provision.system.http_call import HttpCall
from provision.system.tails import mask_secrets, output_tail
from provision.system.text import printable

CONTAINMENT = "http"  # what the `acquired` event says of an HTTP job's containment
BODY_KEPT = 2048  # bytes of the app's answer kept for the record's stdout
REASON_LIMIT = 200  # characters of the reason kept for the record's stderr
# The socket's own timeout, past the job's: the supervisor aborts the request at the job's
# timeout (provision/fencing.py); this only bounds a call nobody aborts.
SOCKET_SLACK = 5.0
FAILED = 1  # the exit status of a call that did not answer 2xx
# the lock's names (runner/core_body.py run_env, runner/plain.py plain_env) -> the headers the
# app is sent
HEADERS = {
    "LOCKCTL_TICK": "X-Lockctl-Tick",
    "LOCK_INDEX": "X-Lockctl-Lock-Index",
    "LOCKCTL_JOB": "X-Lockctl-Job",
    "LOCKCTL_WORKER": "X-Lockctl-Worker",
    "LOCKCTL_ATTEMPT": "X-Lockctl-Attempt",
    "LOCKCTL_KEY": "X-Lockctl-Key",  # a keyed run's
}
# The run's key (the same for every attempt of it), in the IETF draft's header
# (draft-ietf-httpapi-idempotency-key-header): a Structured Field string, so in quotes.
IDEMPOTENCY_KEY = ("LOCKCTL_IDEMPOTENCY_KEY", "Idempotency-Key")


def request_headers(
    lock_env: Mapping[str, str], timeout: float, now: datetime | None = None
) -> dict[str, str]:
    """The headers of the call: the lock's facts and the deadline (UTC, RFC 3339)."""
    started = now or datetime.now(timezone.utc)
    deadline = datetime.fromtimestamp(started.timestamp() + timeout, timezone.utc)
    headers = {header: lock_env[name] for name, header in HEADERS.items() if name in lock_env}
    name, header = IDEMPOTENCY_KEY
    if name in lock_env:  # lock_env's key has no quote or backslash to escape (core_body.py)
        headers[header] = f'"{lock_env[name]}"'
    headers["X-Lockctl-Deadline"] = deadline.isoformat(timespec="milliseconds").replace(
        "+00:00", "Z"
    )
    headers["User-Agent"] = "lockctl"
    headers["Content-Length"] = "0"
    return headers


class HttpJob:
    """One call to the app under the held lock; the supervisor sees it as a job body."""

    containment = CONTAINMENT
    warning: str | None = None
    process = None  # no descriptor to wait on: the lock's helpers wait in a thread (wait())

    def __init__(self, call: HttpCall, secrets: Sequence[str] = ()) -> None:
        self.call = call
        self._secrets = list(secrets)  # what the record's tails must not show
        self._guard = threading.Lock()
        self._done = threading.Event()
        self._connection: http.client.HTTPConnection | None = None
        self._status: int | None = None
        self._aborted = False
        self._body = b""
        self._reason: str | None = None
        self._thread: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return None  # no process: the `acquired` event says containment "http"

    @property
    def exit_status(self) -> int | None:
        return self._status

    def start(self, lock_env: Mapping[str, str], fence: BodyFence | None = None) -> None:
        headers = request_headers(lock_env, self.call.timeout)
        self._thread = threading.Thread(
            target=self._call, args=(headers,), name="lockctl-http-job", daemon=True
        )
        self._thread.start()

    def wait(self) -> int:
        self._done.wait()
        assert self._status is not None
        return self._status

    def signal_tree(self, signum: int) -> bool:
        """Abort the request (whatever the signal): close the connection; the call ends now,
        with the status a process killed by `signum` would have."""
        with self._guard:
            if self._status is not None:
                return False
            self._aborted = True
            self._finish(128 + signum, "aborted: the request was cut off by lockctl")
            connection = self._connection
        if connection is not None and connection.sock is not None:
            with contextlib.suppress(OSError):
                connection.sock.shutdown(socket.SHUT_RDWR)  # wakes the thread's recv
        return True

    def tree_alive(self) -> bool:
        """Whether the call still runs. An aborted one does not: nothing more is sent after the
        abort, and its thread ends at the socket's close (a daemon, never waited for)."""
        return self._status is None

    def output_tails(self) -> tuple[str | None, str | None]:
        body = output_tail(self._body, False, self._secrets) or None
        reason = None if self._reason is None else mask_secrets(self._reason, self._secrets)
        return body, reason

    def abort(self) -> None:
        """Nothing is prepared before the lock is ours."""

    def close(self) -> None:
        if self._thread is not None and self._status is not None:
            self._thread.join(0)  # never blocks: an aborted call's thread ends by itself

    def _call(self, headers: dict[str, str]) -> None:
        parts = urlsplit(self.call.url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host, timeout = parts.hostname or "", self.call.timeout + SOCKET_SLACK
        connection: http.client.HTTPConnection
        if parts.scheme == "https":
            context = ssl.create_default_context()
            connection = http.client.HTTPSConnection(
                host, parts.port, timeout=timeout, context=context
            )
        else:
            connection = http.client.HTTPConnection(host, parts.port, timeout=timeout)
        try:
            connection.connect()
            with self._guard:
                if self._aborted:
                    return
                self._connection = connection
            connection.request(self.call.method, target, headers=headers)
            response = connection.getresponse()
            self._body = response.read(BODY_KEPT)
            self._answered(response.status, response.reason)
        except (OSError, http.client.HTTPException) as exc:
            with self._guard:
                self._finish(FAILED, f"no answer: {_describe(exc)}")
        finally:
            connection.close()

    def _answered(self, status: int, reason: str) -> None:
        with self._guard:
            ok = 200 <= status < 300
            self._finish(0 if ok else FAILED, f"HTTP {status} {reason}".rstrip())

    def _finish(self, status: int, reason: str) -> None:
        """Settle the outcome once (the first of the answer and an abort wins); under _guard."""
        if self._status is None:
            self._reason = printable(reason, REASON_LIMIT)
            self._status = status
            self._done.set()


def _describe(exc: BaseException) -> str:
    """An error of the call in a few words (`[Errno 111] Connection refused`, `timed out`)."""
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__
