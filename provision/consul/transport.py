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
from dataclasses import dataclass
from typing import Any, Final, NamedTuple
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


class _Call(NamedTuple):
    """One HTTP call's arguments, as the retry loop hands them to each attempt."""

    method: str
    path: str
    params: Mapping[str, str | int] | None
    json_body: Any
    data: bytes | None
    token: Secret | None
    redact: tuple[Secret, ...]
    answers: tuple[int, ...]
    max_bytes: int | None = None


class Transport:
    """Sends requests to one Consul agent over an injected `requests.Session`, counting them."""

    def __init__(
        self,
        settings: ConsulSettings,
        *,
        session: requests.Session | None = None,
        pool_size: int | None = None,
        retry: RetryPolicy = RetryPolicy(),  # frozen, so a shared default is safe
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        count: RequestCount | None = None,
        max_in_flight: int | CallGate | None = None,
        tokens: TokenSource | None = None,
        agent_clock: AgentClock | None = None,
    ) -> None:
        self.settings = settings
        # the token sent by default: the settings' own, until a refusal finds another in its file
        self.tokens = tokens or TokenSource(settings.token, token_file_to_reread(settings))
        self.agent_clock = agent_clock  # learns the agent's clock from every answer's Date
        # At most this many calls at once (blocking queries aside), the others wait their turn
        # within their own timeout: a scheduler whose 300 jobs tick at once would otherwise
        # open 300 connections (TLS handshakes, Consul's 200 per client address) at :00.
        self._gate = (
            CallGate(max_in_flight, clock) if isinstance(max_in_flight, int) else max_in_flight
        )
        self.session = session if session is not None else _session_for(settings.address, pool_size)
        self.retry = retry
        self.count = count if count is not None else RequestCount()
        self._clock = clock
        self._sleep = sleep
        # Fixed for the transport's life, like the session's proxies: not re-read per request.
        self._tls_verify = self._verify()
        self._tls_cert = self._client_cert()

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
            session=self.session,
            retry=retry if retry is not None else self.retry,
            clock=self._clock,
            sleep=self._sleep,
            count=self.count,
            max_in_flight=self._gate,
            tokens=self.tokens if same_token else None,
            agent_clock=self.agent_clock,
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None = None,
        json_body: Any = None,
        data: bytes | None = None,
        token: TokenChoice = DEFAULT_TOKEN,
        idempotent: bool = False,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
        redact: tuple[Secret, ...] = (),
        answers: tuple[int, ...] = (),
        urgent: bool = False,
        max_bytes: int | None = None,
    ) -> ConsulResponse:
        """Send one call (with retries where safe); return the answer or raise a ConsulError.

        `redact` names secrets sent in the body (not the header): they are scrubbed from any
        error body quoted in an exception, like the token is. `answers`: error statuses that are
        answers to this call (a transaction's 409 carries which operation failed), returned
        with their decoded body instead of raised. `urgent`: before other waiting calls, when
        calls at once are limited (CallGate). `max_bytes`: the answer's body is read as it
        comes and the call ends with AnswerTooLarge, the connection closed, once it passes that
        many bytes (Consul has no size filter: a value anyone may write is read whole).
        """
        policy = retry if retry is not None else self.retry
        default = isinstance(token, _DefaultToken)
        chosen = self.tokens.current if isinstance(token, _DefaultToken) else token
        budget = timeout if timeout is not None else self.settings.timeout
        started = self._clock()
        ends_at = started + budget  # every attempt, pause and retry ends by then
        retries_until = started + min(policy.deadline, budget)
        backoff = policy.first_backoff
        attempt = 0
        while True:
            attempt += 1
            left = ends_at - self._clock()
            try:
                call = _Call(
                    method, path, params, json_body, data, chosen, redact, answers, max_bytes
                )
                return self._send_once(call, left, urgent)
            except PermissionDenied:
                # a rotated token: the file holds a new one (once per call, whatever the policy:
                # a 403 is an answer, refused before anything was applied)
                fresh = self.tokens.refresh(chosen) if default else None
                if fresh is None:
                    raise
                log.debug("%s %s: token refused; retrying with its file's new one", method, path)
                chosen, default = fresh, False
            except (ConsulUnavailable, ConsulHTTPError) as exc:
                if not _retryable(exc, idempotent):
                    raise
                pause = min(backoff, policy.max_backoff) * random.uniform(0.5, 1.0)  # noqa: S311
                resume = self._clock() + pause
                if resume > retries_until or ends_at - resume < MIN_ATTEMPT:
                    raise
                log.debug("retrying %s %s after %s (attempt %d)", method, path, exc, attempt)
                self._sleep(pause)
                backoff *= 2

    def _send_once(self, call: _Call, timeout: float, urgent: bool) -> ConsulResponse:
        params = call.params
        blocking = params is not None and "index" in params  # a watch: it holds its connection
        if self._gate is None or blocking:
            return self._send(call, timeout)
        began = self._clock()
        if not self._gate.enter(max(timeout, 0.0), urgent=urgent):
            where = f"{call.method} {call.path} on {self.settings.address}"
            raise unavailable(where, requests.exceptions.Timeout("no turn within the timeout"))
        try:
            return self._send(call, timeout - (self._clock() - began))
        finally:
            self._gate.leave()

    def _send(self, call: _Call, timeout: float) -> ConsulResponse:
        method, path, params, json_body, data, token, redact, answers, max_bytes = call
        url = f"{self.settings.address}{path}"
        where = f"{method} {path} on {self.settings.address}"
        headers = {"X-Consul-Token": token.reveal()} if token else {}
        started = self._clock()
        self.count.add_one()
        if timeout <= 0:  # the call's deadline passed before it could be sent: no answer in time
            raise unavailable(where, requests.exceptions.Timeout("the call's time ran out"))
        try:
            answer = self.session.request(
                method,
                url,
                params=params,
                json=json_body,
                data=data,
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
        received = self._clock()
        if self.agent_clock is not None:  # an error's answer tells the agent's clock too
            self.agent_clock.observe(started, received, answer_date(answer.headers))
        elapsed_ms = (received - started) * 1000
        log.debug("%s -> %d in %.1f ms", where, answer.status_code, elapsed_ms)
        if answer.status_code >= 300 and answer.status_code not in answers:
            body = excerpt(answer.text, (token, self.settings.token, self.tokens.current, *redact))
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
                if self._clock() > ends_at:
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
