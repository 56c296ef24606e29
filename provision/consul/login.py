"""Log in with a JWT instead of reading a token file: the token lives in memory only.

A worker whose config names a bearer-token file (a Kubernetes pod's projected service-account
token) exchanges it for a Consul token (`POST /v1/acl/login`) at start, puts it in the token
source every client of the process sends from (consul/tokens.py: the scheduler's pooled client
and every client derived from it see the new one at their next call), logs in again before it
expires, and logs out on a clean stop. The bearer-token file is read again for every login:
the platform rotates it.

A session and the locks it holds do not depend on the token that created them (measured: a
session outlives its creator's logout), so a re-login never disturbs a run. The old token is
logged out once the new one is in place; a call that was already on its way with the old one
and is refused (403) is sent once more with the new one (TokenSource.refresh).

A refused login is not an outage: 403 (no binding rule selects the JWT's claims, or the auth
method does not exist) and 500 with a JWT validation error (expired, wrong audience, a signature
no key validates: CONSUL_FACTS) are LoginRefused, exit 4, with Consul's reason on one line. Only
a 500 that is not about the JWT (no leader, an RPC failure) and an unreachable agent count as
Consul being unavailable.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provision.consul.errors import ConsulError, ConsulHTTPError, ConsulUnavailable
from provision.consul.identity import IdentityAPI, LoginToken
from provision.consul.tokens import TokenSource
from provision.errors import EXIT_DENIED, InputError
from provision.system.files import UnreadableFile, read_regular_file
from provision.system.secrets import Secret
from provision.system.text import printable

log = logging.getLogger("provision.consul")

MAX_BEARER_BYTES = 64 * 1024  # a projected service-account token is 1-2 KiB
REASON_CHARS = 200  # Consul's reason, as shown: one bounded line
RELOGIN_SHARE = 2 / 3  # log in again when this share of the token's life has passed
UNKNOWN_LIFETIME_RELOGIN = 300.0  # seconds, for a token Consul gave no expiry (none seen)
KNOWN_WAIT = 10.0  # seconds a new token may take to be known where it is sent
RETRY_FIRST, RETRY_MAX = 1.0, 10.0  # seconds between re-login attempts after a failure
# What Consul's 500 says when it refused the JWT, not when it failed (1.8.7's go-jose and its
# jwt auth method's own messages; see CONSUL_FACTS)
_JWT_REFUSALS = (
    "error validating",
    "error parsing token",
    "no known key",
    "token is expired",
    "claim",
    "go-jose",
    "signature",
    "audience",
)
_RPC_PREFIX = "rpc error making call:"


class LoginRefused(ConsulError):
    """Consul refused the JWT: the login is not retried as an outage (exit 4)."""

    exit_code = EXIT_DENIED


def refusal_reason(status: int, body: str) -> str | None:
    """Consul's reason when a login answer with `status` and `body` is a refusal of the JWT (a
    short printable line); None when it is a server fault to treat as Consul unavailable."""
    reason = body.strip()
    while reason.lower().startswith(_RPC_PREFIX):
        reason = reason[len(_RPC_PREFIX) :].strip()
    lowered = reason.lower()
    if status == 403:
        unknown = "acl not found" in lowered
        hint = "no such auth method?" if unknown else "no binding rule selects the JWT's claims"
        reason = f"{reason} ({hint})"
    elif status >= 500:
        if not any(marker in lowered for marker in _JWT_REFUSALS):
            return None  # no leader, an RPC failure: Consul is unavailable, not refusing
    elif status < 400:
        return None
    return printable(reason or f"HTTP {status}", REASON_CHARS)


def relogin_delay(lifetime: float | None) -> float:
    """Seconds after a login to log in again: when RELOGIN_SHARE of the token's life has
    passed (a third of it is left for retries should Consul be down then)."""
    if lifetime is None or lifetime <= 0:
        return UNKNOWN_LIFETIME_RELOGIN
    return lifetime * RELOGIN_SHARE


def retry_delay(failures: int, left: float | None) -> float:
    """Seconds before the next attempt after `failures` failed ones in a row: doubling from
    RETRY_FIRST up to RETRY_MAX, and never past half of what is `left` of the token's life."""
    pause = min(RETRY_FIRST * 2.0 ** max(failures - 1, 0), RETRY_MAX)
    if left is not None and left > 0:
        pause = min(pause, max(left / 2, RETRY_FIRST / 4))
    return pause


@dataclass(frozen=True)
class LoginConfig:
    """How a worker logs in: the auth method and the file the platform keeps its JWT in."""

    auth_method: str
    bearer_token_file: Path


def read_bearer_token(path: Path) -> Secret:
    """The JWT in `path` (whitespace around it stripped): an InputError naming the file when it
    cannot be read or is not one line of text."""
    try:
        raw = read_regular_file(path, MAX_BEARER_BYTES)
    except UnreadableFile as exc:
        raise InputError(f"{path}: cannot read bearer token file: {exc}") from None
    try:
        value = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise InputError(f"{path}: bearer token file is not a JWT (not ASCII)") from None
    if not value or len(raw) > MAX_BEARER_BYTES or not value.isprintable() or " " in value:
        raise InputError(f"{path}: bearer token file is not a JWT (empty, or not one line)")
    return Secret(value)


Emit = Callable[..., Any]  # an EventLog's emit(event, **fields)


class Login:
    """The process's login: the token it holds, renewed before it expires, logged out at end."""

    def __init__(
        self,
        identity: IdentityAPI,
        tokens: TokenSource,
        config: LoginConfig,
        *,
        emit: Emit | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._identity, self._tokens, self.config = identity, tokens, config
        self._emit = emit or (lambda *_a, **_k: None)
        self._clock, self._sleep = clock, sleep
        self._held: LoginToken | None = None
        self._expires_at: float | None = None  # on the monotonic clock
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # the renewing thread against close()

    @property
    def accessor_id(self) -> str | None:
        held = self._held
        return None if held is None else held.accessor_id

    def login(self) -> LoginToken:
        """Log in now and send the new token from now on; the old one, if any, is logged out.
        Raises LoginRefused, ConsulUnavailable (or another ConsulError), or InputError (the
        bearer-token file)."""
        bearer = read_bearer_token(self.config.bearer_token_file)
        sent = self._clock()
        try:
            token = self._identity.login(self.config.auth_method, bearer)
        except ConsulHTTPError as exc:
            reason = refusal_reason(exc.status, exc.body)
            if reason is None and exc.status >= 500:  # a fault, not a verdict on the JWT
                raise ConsulUnavailable(str(exc)) from None
            if reason is None:
                raise
            raise LoginRefused(
                f"login through auth method {self.config.auth_method!r} refused "
                f"({exc.status}): {reason}"
            ) from None
        self._await_known(token)  # before any call sends it (and the old one goes)
        old: LoginToken | None
        why = "relogin"
        with self._lock:
            if self._closed:  # close() came while this login was on its way: undo it
                old, why = token, "stop"
            else:
                old, self._held = self._held, token
                # from when the request was sent: the token cannot outlive that
                self._expires_at = None if token.lifetime is None else sent + token.lifetime
                self._tokens.replace(token.secret)
        self._emit("login", accessor=token.accessor_id, **_ttl_fields(token))
        if old is not None:
            self._logout(old, why)
        return token

    def _await_known(self, token: LoginToken) -> None:
        """Wait (at most KNOWN_WAIT) until the agent knows the new token: sent at once, it can
        be refused for a moment (CONSUL_FACTS: a fresh token reaches the followers a moment
        after the leader). Past the bound it is used all the same; a call refused then fails
        as any 403 does."""
        give_up_at = self._clock() + KNOWN_WAIT
        pause = 0.02
        while not self._known(token):
            if self._clock() > give_up_at:
                self._emit(
                    "login-not-known", accessor=token.accessor_id, waited_ms=KNOWN_WAIT * 1e3
                )
                return
            self._sleep(pause)
            pause = min(pause * 2, 0.5)

    def _known(self, token: LoginToken) -> bool:
        try:
            return self._identity.token_known(token.secret)
        except ConsulError:  # cannot tell now: the token is good, use it
            return True

    def start(self) -> None:
        """Keep logging in again before the token expires, on a thread of its own."""
        self._thread = threading.Thread(target=self._renew, name="lockctl-login", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop renewing and log out (a clean stop): the token is gone from Consul."""
        with self._lock:
            self._closed = True
            held, self._held = self._held, None
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if held is not None:
            self._logout(held, "stop")

    def _renew(self) -> None:
        failures = 0
        assert self._held is not None or self._closed
        pause = relogin_delay(self._held.lifetime if self._held else None)
        while not self._wake.wait(pause):
            with self._lock:
                if self._closed:
                    return
            try:
                token = self.login()
            except (ConsulError, InputError) as exc:
                failures += 1
                pause = retry_delay(failures, self._left())
                kind = "login-refused" if isinstance(exc, LoginRefused) else "login-failed"
                self._emit(kind, error=str(exc), retry_in_ms=round(pause * 1000))
                continue
            failures = 0
            pause = relogin_delay(token.lifetime)

    def _left(self) -> float | None:
        expires = self._expires_at
        return None if expires is None else expires - self._clock()

    def _logout(self, token: LoginToken, why: str) -> None:
        """Best effort: a token whose logout failed expires on its own (max_token_ttl)."""
        try:
            self._identity.logout(token.secret)
        except ConsulError as exc:
            self._emit("logout-failed", accessor=token.accessor_id, error=str(exc))
            return
        self._emit("logout", accessor=token.accessor_id, reason=why)


def _ttl_fields(token: LoginToken) -> dict[str, int]:
    if token.lifetime is None:
        return {}
    return {"ttl_ms": round(token.lifetime * 1000)}
