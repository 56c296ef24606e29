"""The worker token files: where they live, and whether each holds its worker's current token.

A file is right only when it is a regular file of this user's, closed to group and others, and
holds a secret that Consul says (`GET /v1/acl/token/self` with that secret) is the worker's
managed token. Anything else is a reason for `plan` to rewrite it; no secret is ever returned
or shown, only the verdict.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from provision.acl.state import TokenFileState
from provision.consul import Consul, PermissionDenied
from provision.errors import InputError, LocalEnvironmentError
from provision.spec.names import NAME_RULE, is_valid_name
from provision.system.secrets import (
    MAX_TOKEN_FILE_BYTES,
    Secret,
    check_writable,
    is_token_secret,
    write_secret_file,
)

REVOKED = "token file holds a revoked or unknown secret"
NOT_A_SECRET = "token file does not hold a token secret"  # noqa: S105 - a reason, not a secret


def secret_path(secrets_dir: Path, worker: str) -> Path:
    """Where a worker's token secret lives: `<secrets-dir>/<worker>.token`.

    The name is checked here too (spec names are checked on load): a name with `/` or `..`
    would put a secret outside the folder.
    """
    if not is_valid_name(worker):
        raise InputError(f"worker {worker!r}: not a valid worker name ({NAME_RULE})")
    return secrets_dir / f"{worker}.token"


def check_secrets_dir(secrets_dir: Path) -> None:
    """Prove token files can be written there before any change is made in Consul."""
    check_writable(secrets_dir, f"--secrets-dir {secrets_dir}")


def write_token_file(path: Path, secret: Secret) -> None:
    """Write a worker's token file (atomically, 0600); a failed write is an expected error."""
    try:
        write_secret_file(path, secret)
    except OSError as exc:
        raise LocalEnvironmentError(f"{path}: cannot write token file ({exc.strerror})") from None


def read_token_files(
    consul: Consul, secrets_dir: Path, workers: Iterable[str], concurrency: int
) -> dict[str, TokenFileState]:
    """Each worker's token file checked (a missing file has no entry), `concurrency` at once."""
    names = list(workers)
    if not names:
        return {}
    paths = [secret_path(secrets_dir, worker) for worker in names]
    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(names)))) as pool:
        states = list(pool.map(lambda path: token_file_state(consul, path), paths))
    return {worker: state for worker, state in zip(names, states, strict=True) if state is not None}


def token_file_state(consul: Consul, path: Path) -> TokenFileState | None:
    """What the file at `path` holds and what is wrong with it; None when there is none."""
    local = _local_state(path)
    if local is None:
        return None
    secret, problems = local
    if secret is None:
        return TokenFileState(None, tuple(problems))
    try:
        seen = consul.acl.read_self_token(token=secret)
    except PermissionDenied:  # Consul 1.8 answers an unknown or revoked secret with 403
        return TokenFileState(None, (*problems, REVOKED))
    return TokenFileState(seen.accessor_id, tuple(problems))


def _local_state(path: Path) -> tuple[Secret | None, list[str]] | None:
    """The file's secret (None if it holds none) and its local problems; None if it is absent."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return None, [f"token file cannot be examined ({exc.strerror})"]
    if not stat.S_ISREG(info.st_mode):  # a symlink, a folder, a FIFO (reading it would hang)
        return None, ["token file is not a regular file"]
    problems = []
    if info.st_uid != os.geteuid():
        problems.append(f"token file is owned by uid {info.st_uid}, not by this user")
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        problems.append(f"token file mode {mode:04o} lets group or others in (want 0600)")
    secret, problem = _read_secret(path)
    if problem:
        problems.append(problem)
    return secret, problems


def _read_secret(path: Path) -> tuple[Secret | None, str | None]:
    """The secret in the file, or why there is none; never more than a token file's size read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return None, f"token file cannot be read ({exc.strerror})"
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            return None, "token file is not a regular file"
        raw = handle.read(MAX_TOKEN_FILE_BYTES + 1)
    try:
        secret = Secret(raw.decode("utf-8").strip())
    except UnicodeDecodeError:
        return None, NOT_A_SECRET
    if not secret:
        return None, "token file is empty"
    if len(raw) > MAX_TOKEN_FILE_BYTES or not is_token_secret(secret):
        return None, NOT_A_SECRET
    return secret, None
