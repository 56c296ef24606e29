"""Rotate a worker's token: mint a new one with the same policies, write it, read it back from
the file and through Consul, and only then revoke the old one(s). Any doubt keeps the old token.

The whole of it runs under lockctl's own lock (acl.serialize), so concurrent rotates (and
applies) take turns: each reads the worker's tokens only once it holds the lock, and what it
announces was the live token when it finished.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from provision.acl.serialize import DEFAULT_LOCK_WAIT, StopFlag, apply_lock, check_stop
from provision.acl.token_files import check_secrets_dir, secret_path, write_token_file
from provision.acl.writes import ACL_WRITE_HINT, RETRY_PAUSE, denied_as, mint_token, real_secret
from provision.consul import Consul, ConsulServerError, ConsulUnavailable, PermissionDenied
from provision.consul.models import Token
from provision.errors import LocalEnvironmentError
from provision.spec.names import DEFAULT_OWNER, token_description
from provision.system.deadline import Deadline, retry_until
from provision.system.secrets import read_secret_file

READ_BACK_DEADLINE = 10.0  # a follower may not know a brand-new token for a moment
# A follower may not know a brand-new token yet (403 "ACL not found"), or be between leaders.
NOT_KNOWN_YET = (PermissionDenied, ConsulServerError, ConsulUnavailable)


@dataclass(frozen=True)
class RotateResult:
    worker: str
    accessor_id: str
    path: Path
    revoked: tuple[str, ...]

    def to_record(self) -> dict[str, object]:
        """One worker's entry in `lockctl rotate --json`."""
        return {
            "worker": self.worker,
            "accessor_id": self.accessor_id,
            "file": str(self.path),
            "revoked": list(self.revoked),
        }


def rotate_worker_token(
    consul: Consul,
    worker: str,
    secrets_dir: Path,
    *,
    read_back_deadline: float = READ_BACK_DEADLINE,
    lock_wait: float = DEFAULT_LOCK_WAIT,
    stop: StopFlag | None = None,
    owner: str = DEFAULT_OWNER,
) -> RotateResult:
    """Mint a new token for `worker` with the same policies, write it, read it back from the
    file and through Consul, and only then revoke the old one(s); under lockctl's lock.

    `stop` (the CLI's, set by its signal handlers) is asked up to the mint: a stop by then
    raises Interrupted with nothing changed. Once the new token exists the rotate finishes (a
    few calls, the read-back bounded): stopping there would leave the worker two tokens."""
    path = secret_path(secrets_dir, worker)  # checks the name before anything is read
    check_secrets_dir(secrets_dir)
    with apply_lock(consul, "rotate", wait=lock_wait, stop=stop):
        token = _WorkerToken(worker, token_description(worker, owner))
        return _rotate(consul, token, path, read_back_deadline, stop)


@dataclass(frozen=True)
class _WorkerToken:
    """Which token a rotate replaces: the worker's, by the description of the spec's owner."""

    worker: str
    description: str


def _rotate(
    consul: Consul,
    token: _WorkerToken,
    path: Path,
    read_back_deadline: float,
    stop: StopFlag | None,
) -> RotateResult:
    worker, description = token.worker, token.description
    with denied_as(ACL_WRITE_HINT, "list ACL tokens"):
        current = [t for t in consul.acl.list_tokens() if t.description == description]
    if not current:
        raise LocalEnvironmentError(
            f"no lockctl token for worker {worker} in Consul; run `lockctl apply` first"
        )
    policies = sorted(set().union(*(t.policy_names for t in current)))
    check_stop(stop, f"before rotating the token of {worker} (nothing changed)")
    with denied_as(ACL_WRITE_HINT, "create a token"):
        before = frozenset(t.accessor_id for t in current)
        minted = mint_token(consul, description, policies, before)
    write_token_file(path, real_secret(minted.secret, f"the new token of {worker}"))
    _read_back(consul, path, minted, read_back_deadline)
    old = [t.accessor_id for t in current if t.accessor_id != minted.accessor_id]
    with denied_as(ACL_WRITE_HINT, "revoke the old token"):
        for accessor_id in old:
            consul.acl.delete_token(accessor_id)
    return RotateResult(worker, minted.accessor_id, path, tuple(old))


def _read_back(consul: Consul, path: Path, minted: Token, deadline: float) -> None:
    """The file holds the new secret and Consul accepts it as the new token; else keep the old."""
    held = read_secret_file(path)
    if minted.secret is None or held.reveal() != minted.secret.reveal():
        raise LocalEnvironmentError(f"{path}: reads back a different secret; old token kept")
    try:
        seen = retry_until(
            Deadline(deadline),
            lambda: consul.acl.read_self_token(token=held),
            retry_on=NOT_KNOWN_YET,
            pause=RETRY_PAUSE,
        )
    except NOT_KNOWN_YET:
        raise LocalEnvironmentError(
            f"the new token in {path} was not accepted by Consul within {deadline:g} s; "
            "the old token was kept"
        ) from None
    if seen.accessor_id != minted.accessor_id:
        raise LocalEnvironmentError(f"{path}: Consul read back another token; old token kept")
