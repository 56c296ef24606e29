"""The errors the Consul client raises, translated from requests at one seam (transport.py).

    ConsulError                      5  base
    +-- ConsulUnavailable            3  connection refused/reset, TLS failure, client timeout
    +-- SpeaksHttps                  2  an http:// address whose port serves HTTPS only
    +-- AnswerTooLarge               5  an answer read with a byte cap passed it
    +-- ConsulHTTPError(status)      5  Consul answered with an error status
        +-- PermissionDenied         4  403: no token, unknown token, or the token lacks a right
        +-- NotFound                 5  404
        +-- ConsulServerError        5  5xx still failing after the retries allowed

Messages name the method, path and agent address, plus a short excerpt of Consul's body; they
never contain a token secret (the transport scrubs the secret from any body it quotes), and the
excerpt is one line with every control character escaped (provision/system/text.py), so an error
body cannot drive the terminal it is printed on.
"""

from __future__ import annotations

from collections.abc import Mapping

from provision.errors import (
    EXIT_CONSUL_API,
    EXIT_DENIED,
    EXIT_INPUT,
    EXIT_UNAVAILABLE,
    LockctlError,
)


class ConsulError(LockctlError):
    """Base of every error from talking to Consul."""

    exit_code = EXIT_CONSUL_API


class ConsulUnavailable(ConsulError):
    """Consul could not be reached, or did not answer within the client timeout."""

    exit_code = EXIT_UNAVAILABLE


class ConsulNotReached(ConsulUnavailable):
    """The connection was never opened (refused, or no connect within the timeout): the request
    cannot have been applied, so even a call that is not idempotent may be sent again."""


class SpeaksHttps(ConsulError):
    """Plain HTTP sent to a port that serves HTTPS only: Go's TLS server answers 400 "Client sent
    an HTTP request to an HTTPS server." before Consul sees the request. Not an answer from
    Consul's API, and no retry helps: the address given is wrong (bad input, exit 2)."""

    exit_code = EXIT_INPUT


class AnswerTooLarge(ConsulError):
    """An answer read with a byte cap (`max_bytes`) passed it: the rest was not read. Not
    retried: the same data gives the same answer."""


class ConsulHTTPError(ConsulError):
    """Consul answered with an error status; `status` and `body` say which."""

    def __init__(
        self, message: str, *, status: int, body: str, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        self.headers: Mapping[str, str] = headers or {}

    @classmethod
    def from_status(
        cls, message: str, *, status: int, body: str, headers: Mapping[str, str] | None = None
    ) -> ConsulHTTPError:
        """Pick the subclass for `status` (the one place that maps codes to classes)."""
        error_class: type[ConsulHTTPError] = cls
        if status == 403:
            error_class = PermissionDenied
        elif status == 404:
            error_class = NotFound
        elif status >= 500:
            error_class = ConsulServerError
        return error_class(message, status=status, body=body, headers=headers)


class PermissionDenied(ConsulHTTPError):
    """403: ACLs refused the request."""

    exit_code = EXIT_DENIED


class NotFound(ConsulHTTPError):
    """404: the object (session, token, policy, route) does not exist."""


class ConsulServerError(ConsulHTTPError):
    """5xx: Consul failed (no leader, invalid session, legacy ACL mode, ...)."""
