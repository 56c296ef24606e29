"""The one place lockctl speaks HTTP: timeouts, TLS, the token header, retries (answers.py maps
what comes back).

Every call has a client-side timeout (a partitioned agent can hold a call open for longer than a
session's TTL). Calls are retried with capped exponential backoff within a deadline when that is
safe: always when the connection could not be opened (nothing was sent), and on read timeouts and
5xx answers only for calls the caller marks idempotent.

The timeout bounds the whole call, retries included, not each attempt: a call ends within
`timeout` (the settings' timeout, or the one the call passes, e.g. a blocking query's wait plus
the settings' timeout) whatever the agent does. Each attempt gets what is left of it, for its
connect and its reads together; a retry starts only within the retry deadline and with at least
MIN_ATTEMPT left. So an agent that accepts connections and never answers costs one timeout, not
one per retry.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import quote

import requests
from requests.adapters import HTTPAdapter
from urllib3.util import Timeout

from provision.consul.answers import (
    PLAIN_HTTP_REFUSAL,
    ConsulResponse,
    answer_date,
    decode,
    excerpt,
    speaks_https,
    unavailable,
)
from provision.consul.clock import AgentClock
from provision.consul.errors import (
    AnswerTooLarge,
    ConsulHTTPError,
    ConsulNotReached,
    ConsulUnavailable,
    PermissionDenied,
)
from provision.consul.gate import CallGate, RequestCount
from provision.consul.settings import ConsulSettings, token_file_to_reread
from provision.consul.tokens import TokenSource
from provision.system.secrets import Secret

log = logging.getLogger("provision.consul")

# the endpoints a datacenter other than the agent's is asked through (`?dc=`): the ones of one
# datacenter's own state; ACLs are global, the agent's endpoints are its own
DATACENTER_PATHS = ("/v1/kv/", "/v1/session/", "/v1/txn")
MIN_ATTEMPT = 0.05  # seconds: no retry is started with less of the call's timeout left
POOLED_HOSTS = 4  # agents whose connections a sized pool keeps (bootstrap visits a few)
STREAM_CHUNK = 16 * 1024  # bytes read at a time from an answer read with a byte cap


class _DefaultToken:
    """Sentinel: send the settings' token (a call may instead pass a token, or None for none)."""

    def __repr__(self) -> str:
        return "DEFAULT_TOKEN"


DEFAULT_TOKEN: Final = _DefaultToken()
TokenChoice = Secret | None | _DefaultToken


@dataclass(frozen=True)
class RetryPolicy:
    """How long a call may keep retrying, and how it backs off."""

    deadline: float = 15.0  # seconds; covers a leader election (3-4 s) with room to spare
    first_backoff: float = 0.05
    max_backoff: float = 1.0


NO_RETRY = RetryPolicy(deadline=0.0)


def _session_for(address: str, pool_size: int | None = None) -> requests.Session:
    """A session that reads the environment once, not on every request.

    requests looks up proxies (a scan of os.environ) and ~/.netrc on each call when `trust_env`
    is on: about 0.3 ms per request, on the lock hand-over's critical path. The proxies for this
    agent (honouring NO_PROXY) are resolved here once instead; the CA bundle variables are read
    by `_verify`; netrc credentials mean nothing to Consul, which takes a token header.

    `pool_size`: connections kept open per agent, for callers with that many calls in flight
    (requests keeps 10; a call beyond them opens and closes a connection of its own).
    """
    session = requests.Session()
    session.proxies.update(requests.utils.get_environ_proxies(address))
    session.trust_env = False
    if pool_size is not None:
        adapter = HTTPAdapter(pool_connections=POOLED_HOSTS, pool_maxsize=max(pool_size, 1))
        session.mount("http://", adapter)
        session.mount("https://", adapter)
    return session


def _environ_ca_bundle() -> str | None:
    """The CA bundle requests would take from the environment (its own variables)."""
    return os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or None


def quote_path(*segments: str) -> str:
    """URL-quote path segments; '/' inside a segment is kept (KV keys are paths)."""
    return "/".join(quote(segment, safe="/") for segment in segments)


@dataclass(frozen=True)
class Call:
    """What one call asks of Consul, sent again as it is by every attempt.

    `token`: the settings' token by default, or another (None: none). `redact`: secrets sent
    in the body (not the header), scrubbed from any error body quoted in an exception, like the
    token is. `answers`: error statuses that are answers to this call (a transaction's 409
    carries which operation failed), returned with their decoded body instead of raised.
    `max_bytes`: the answer's body is read as it comes and the call ends with AnswerTooLarge,
    the connection closed, once it passes that many bytes (Consul has no size filter: a value
    anyone may write is read whole).
    """

    method: str
    path: str
    params: Mapping[str, str | int] | None = None
    json_body: Any = None
    data: bytes | None = None
    token: TokenChoice = DEFAULT_TOKEN
    redact: tuple[Secret, ...] = ()
    answers: tuple[int, ...] = ()
    max_bytes: int | None = None


@dataclass(frozen=True)
class Sending:
    """How a call is sent. `idempotent`: safe to send again after a read timeout or a 5xx
    (a connection never opened is always retried). `timeout`: the whole call's, retries
    included (None: the settings'). `retry`: None: the transport's. `urgent`: before other
    waiting calls, when calls at once are limited (CallGate)."""

    idempotent: bool = False
    timeout: float | None = None
    retry: RetryPolicy | None = None
    urgent: bool = False


IDEMPOTENT = Sending(idempotent=True)


@dataclass(frozen=True)
class HTTPPool:
    """What transports derived from one another share: the `requests.Session` and its
    connections, the count of requests sent over it, the limit on calls at once (None: none),
    the agent's clock learnt from the answers, and the time seams (tests drive them)."""

    session: requests.Session
    count: RequestCount = field(default_factory=RequestCount)
    gate: CallGate | None = None
    agent_clock: AgentClock | None = None
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    @classmethod
    def open(
        cls,
        address: str,
        *,
        session: requests.Session | None = None,
        pool_size: int | None = None,
        max_in_flight: int | None = None,
        agent_clock: AgentClock | None = None,
    ) -> HTTPPool:
        """A pool for the agent at `address`: over `session` (tests inject one), else a new
        one keeping `pool_size` connections open (see `_session_for`); at most `max_in_flight`
        calls at once, blocking queries aside."""
        if session is None:
            session = _session_for(address, pool_size)
        gate = None if max_in_flight is None else CallGate(max_in_flight, time.monotonic)
        return cls(session, gate=gate, agent_clock=agent_clock)


class Transport:
    """Sends requests to one Consul agent over a shared `HTTPPool`, counting them."""

    def __init__(
        self,
        settings: ConsulSettings,
        pool: HTTPPool | None = None,  # None: a new pool of its own
        *,
        retry: RetryPolicy = RetryPolicy(),  # frozen, so a shared default is safe
        tokens: TokenSource | None = None,
    ) -> None:
        self.settings = settings
        self.pool = pool if pool is not None else HTTPPool.open(settings.address)
        # the token sent by default: the settings' own, until a refusal finds another in its file
        self.tokens = tokens or TokenSource(settings.token, token_file_to_reread(settings))
        self.retry = retry
        # Fixed for the transport's life, like the session's proxies: not re-read per request.
        self._tls_verify = self._verify()
        self._tls_cert = self._client_cert()

    @property
    def session(self) -> requests.Session:
        return self.pool.session

    @property
    def count(self) -> RequestCount:
        return self.pool.count

    @property
    def agent_clock(self) -> AgentClock | None:
        """Learns the agent's clock from every answer's Date."""
        return self.pool.agent_clock

    def derive(
        self, *, settings: ConsulSettings | None = None, retry: RetryPolicy | None = None
    ) -> Transport:
        """A transport with other settings or retries over the same pool (and its count); with
        the same token and file, it shares the token source (a token re-read is seen by both)."""
        same_token = settings is None or (
            settings.token == self.settings.token
            and settings.token_file == self.settings.token_file
        )
        return Transport(
            settings if settings is not None else self.settings,
            self.pool,
            retry=retry if retry is not None else self.retry,
            tokens=self.tokens if same_token else None,
        )

    def request(self, call: Call, sending: Sending = Sending()) -> ConsulResponse:
        """Send one call (with retries where safe); return the answer or raise a ConsulError."""
        method, path = call.method, call.path
        policy = sending.retry if sending.retry is not None else self.retry
        default = isinstance(call.token, _DefaultToken)
        chosen = self.tokens.current if isinstance(call.token, _DefaultToken) else call.token
        budget = sending.timeout if sending.timeout is not None else self.settings.timeout
        clock = self.pool.clock
        started = clock()
        ends_at = started + budget  # every attempt, pause and retry ends by then
        retries_until = started + min(policy.deadline, budget)
        backoff = policy.first_backoff
        attempt = 0
        while True:
            attempt += 1
            left = ends_at - clock()
            try:
                return self._send_once(call, chosen, left, sending.urgent)
            except PermissionDenied:
                # a rotated token: the file holds a new one (once per call, whatever the policy:
                # a 403 is an answer, refused before anything was applied)
                fresh = self.tokens.refresh(chosen) if default else None
                if fresh is None:
                    raise
                log.debug("%s %s: token refused; retrying with its file's new one", method, path)
                chosen, default = fresh, False
            except (ConsulUnavailable, ConsulHTTPError) as exc:
                if not _retryable(exc, sending.idempotent):
                    raise
                pause = min(backoff, policy.max_backoff) * random.uniform(0.5, 1.0)  # noqa: S311
                resume = clock() + pause
                if resume > retries_until or ends_at - resume < MIN_ATTEMPT:
                    raise
                log.debug("retrying %s %s after %s (attempt %d)", method, path, exc, attempt)
                self.pool.sleep(pause)
                backoff *= 2

    def _send_once(
        self, call: Call, token: Secret | None, timeout: float, urgent: bool
    ) -> ConsulResponse:
        params, gate, clock = call.params, self.pool.gate, self.pool.clock
        blocking = params is not None and "index" in params  # a watch: it holds its connection
        if gate is None or blocking:
            return self._send(call, token, timeout)
        began = clock()
        if not gate.enter(max(timeout, 0.0), urgent=urgent):
            where = f"{call.method} {call.path} on {self.settings.address}"
            raise unavailable(where, requests.exceptions.Timeout("no turn within the timeout"))
        try:
            return self._send(call, token, timeout - (clock() - began))
        finally:
            gate.leave()

    def _send(self, call: Call, token: Secret | None, timeout: float) -> ConsulResponse:
        """One attempt of `call`, sent with `token` (None: none) within `timeout` seconds."""
        method, path, max_bytes = call.method, call.path, call.max_bytes
        url = f"{self.settings.address}{path}"
        where = f"{method} {path} on {self.settings.address}"
        params, dc = call.params, self.settings.datacenter
        if dc is not None and path.startswith(DATACENTER_PATHS):
            params = {**(params or {}), "dc": dc}
            where += f" (datacenter {dc})"
        headers = {"X-Consul-Token": token.reveal()} if token else {}
        clock = self.pool.clock
        started = clock()
        self.count.add_one()
        if timeout <= 0:  # the call's deadline passed before it could be sent: no answer in time
            raise unavailable(where, requests.exceptions.Timeout("the call's time ran out"))
        try:
            answer = self.session.request(
                method,
                url,
                params=params,
                json=call.json_body,
                data=call.data,
                headers=headers,
                # total: connecting and every read share `timeout`, as a float would give
                # each of them all of it (the stubs do not know urllib3's Timeout; requests does).
                timeout=Timeout(total=timeout),  # type: ignore[arg-type]
                verify=self._tls_verify,
                cert=self._tls_cert,
                allow_redirects=False,
                stream=max_bytes is not None,
            )
            if max_bytes is not None:
                self._read_capped(answer, max_bytes, where, started + timeout)
        except requests.exceptions.RequestException as exc:
            raise unavailable(where, exc) from None
        received = clock()
        if self.agent_clock is not None:  # an error's answer tells the agent's clock too
            self.agent_clock.observe(started, received, answer_date(answer.headers))
        elapsed_ms = (received - started) * 1000
        log.debug("%s -> %d in %.1f ms", where, answer.status_code, elapsed_ms)
        if answer.status_code >= 300 and answer.status_code not in call.answers:
            secrets = (token, self.settings.token, self.tokens.current, *call.redact)
            body = excerpt(answer.text, secrets)
            if answer.status_code == 400 and PLAIN_HTTP_REFUSAL in body:
                raise speaks_https(where, self.settings.address, body)
            # answer.headers stays case-insensitive: a proxy or HTTP/2 may lower-case names.
            raise ConsulHTTPError.from_status(
                f"consul: {where}: {answer.status_code} {body}".rstrip(),
                status=answer.status_code,
                body=body,
                headers=answer.headers,
            )
        return ConsulResponse(answer.status_code, decode(answer), answer.headers)

    def _read_capped(
        self, answer: requests.Response, max_bytes: int, where: str, ends_at: float
    ) -> None:
        """Read the streamed body, at most `max_bytes` (decoded: a compressed answer is
        counted as it unpacks) and until `ends_at` (a socket timeout only bounds each read: a
        trickle of bytes would outlast it); over either, close the connection and raise."""
        chunks, size = [], 0
        try:
            for chunk in answer.iter_content(STREAM_CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    raise AnswerTooLarge(
                        f"consul: {where}: answer over {max_bytes} bytes: not read further"
                    )
                if self.pool.clock() > ends_at:
                    raise unavailable(where, requests.exceptions.Timeout("reading the answer"))
                chunks.append(chunk)
        except BaseException:
            answer.close()
            raise
        answer._content = b"".join(chunks)  # what .content, .text and .json() read

    def _verify(self) -> bool | str:
        if not self.settings.verify_tls:
            return False
        if self.settings.ca_cert:
            return str(self.settings.ca_cert)
        return _environ_ca_bundle() or True

    def _client_cert(self) -> tuple[str, str] | str | None:
        if self.settings.client_cert and self.settings.client_key:
            return (str(self.settings.client_cert), str(self.settings.client_key))
        return str(self.settings.client_cert) if self.settings.client_cert else None


def _retryable(exc: Exception, idempotent: bool) -> bool:
    if isinstance(exc, ConsulNotReached):
        return True
    if isinstance(exc, ConsulHTTPError):
        return idempotent and exc.status >= 500
    return idempotent
