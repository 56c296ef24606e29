"""The ACL writes apply and rotate both make: a create that rides out a leader election and
never leaves a duplicate (it adopts what a failed try made), the check that a secret Consul gave
is a real one before it reaches a file, and a 403 turned into an error that names the permission.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TypeVar

from provision.acl.plan import PolicyChange
from provision.consul import (
    Consul,
    ConsulError,
    ConsulServerError,
    ConsulUnavailable,
    PermissionDenied,
)
from provision.consul.models import Policy, Token
from provision.errors import EXIT_DENIED, LocalEnvironmentError, LockctlError
from provision.system.deadline import Deadline, attempts
from provision.system.secrets import Secret, is_token_secret

WRITE_DEADLINE = 20.0  # seconds a create may keep retrying: a leader election takes 3-4 s
RETRY_PAUSE = 0.2
ACL_WRITE_HINT = (
    'the token needs acl = "write" (a management token, or a policy with acl = "write"); '
    "give one with --token-file or CONSUL_HTTP_TOKEN_FILE"
)
ACL_READ_HINT = (
    'the token needs acl = "read" to plan and acl = "write" to apply; give one with '
    "--token-file or CONSUL_HTTP_TOKEN_FILE"
)

T = TypeVar("T")


class ACLPermissionError(LockctlError):
    """Consul refused an ACL call (403); the message names the permission that is missing."""

    exit_code = EXIT_DENIED


def real_secret(secret: Secret | None, whose: str) -> Secret:
    """`secret` if it is a token secret; Consul shows "<hidden>" to a caller without acl =
    "write", and that (or anything else) must never reach a token file."""
    if secret is None:
        raise LocalEnvironmentError(f"Consul returned no secret for {whose}")
    if not is_token_secret(secret):
        raise ACLPermissionError(
            f"Consul did not reveal the secret of {whose} (a redacted SecretID): the management "
            'token needs acl = "write" to read token secrets; no token file was written'
        )
    return secret


@contextlib.contextmanager
def denied_as(hint: str, what: str) -> Iterator[None]:
    """Turn a 403 into ACLPermissionError naming what was refused and what is needed."""
    try:
        yield
    except PermissionDenied:
        raise ACLPermissionError(
            f"Consul refused to {what} (403 permission denied): {hint}"
        ) from None


# --- creates that adopt ------------------------------------------------------------------


def create_policy(consul: Consul, change: PolicyChange) -> Policy:
    """Create, riding out an election: after a failed try, look the name up before retrying,
    since the failed call may have been applied (a second create would be refused)."""

    def adopt() -> Policy | None:
        existing = _find_policy(consul, change.name)
        if existing is None:
            return None
        return consul.acl.update_policy(existing, change.name, change.rules, change.description)

    return _create_or_adopt(
        lambda: consul.acl.create_policy(change.name, change.rules, change.description), adopt
    )


def _find_policy(consul: Consul, name: str) -> str | None:
    try:
        return next((p.id for p in consul.acl.list_policies() if p.name == name), None)
    except (ConsulServerError, ConsulUnavailable):
        return None


def mint_token(
    consul: Consul, description: str, policies: list[str], before: frozenset[str] = frozenset()
) -> Token:
    """Mint a token; after a failed try adopt the token if it was made, so none is duplicated.

    `before`: accessor IDs with this description known before (none, when the plan says create).
    """

    def adopt() -> Token | None:
        now = _managed_tokens(consul, description)
        made = [t for t in now or () if t.accessor_id not in before]
        return consul.acl.read_token(made[0].accessor_id) if made else None

    return _create_or_adopt(lambda: consul.acl.create_token(description, policies), adopt)


def _managed_tokens(consul: Consul, description: str) -> list[Token] | None:
    """This description's tokens; None when Consul cannot say right now."""
    try:
        return [t for t in consul.acl.list_tokens() if t.description == description]
    except (ConsulServerError, ConsulUnavailable):
        return None


def _create_or_adopt(create: Callable[[], T], adopt: Callable[[], T | None]) -> T:
    """`create()` until WRITE_DEADLINE; before each retry `adopt()` what a failed try may have
    made (its answer, unless None). A 5xx or no answer is retried; the last one is raised."""
    error: ConsulError | None = None
    for number in attempts(Deadline(WRITE_DEADLINE), RETRY_PAUSE):
        adopted = adopt() if number > 1 else None
        if adopted is not None:
            return adopted
        try:
            return create()
        except (ConsulServerError, ConsulUnavailable) as exc:
            error = exc
    assert error is not None  # attempts() ended, so the last create failed
    raise error
