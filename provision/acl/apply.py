"""Apply: read live ACLs, plan, and execute the plan with bounded concurrency.

The live state is read with the two list endpoints (plus a read of any policy whose hash
differs), so a no-op run costs two requests whatever the size of the spec. Writes run in
phases, each with at most `concurrency` calls in flight (give a client pooled for as many,
`consul.with_pool(concurrency)`):

    policies create/update -> tokens create/update/write-secret -> token deletes -> policy deletes

Every step is safe to interrupt: a re-run adopts what exists by name (policies) or marker
(tokens), re-reads a token whose file was not written (or holds anything but the worker's live
token), and removes a duplicate token left by an interrupted rotate, so it converges without
duplicates. Changes are made under lockctl's own lock (acl.serialize), one run at a time.
Secrets go only to files (0600), and only real ones.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from provision.acl.concurrency import DEFAULT_CONCURRENCY
from provision.acl.plan import (
    Desired,
    LivePolicy,
    LiveState,
    LiveToken,
    Plan,
    PolicyChange,
    TokenChange,
    plan_changes,
    policies_to_read,
    workers_with_tokens,
)
from provision.acl.serialize import DEFAULT_LOCK_WAIT, StopFlag, apply_lock, check_stop

# check_secrets_dir and secret_path are re-exported: rotate and the CLI take them from here.
from provision.acl.token_files import check_secrets_dir as check_secrets_dir
from provision.acl.token_files import read_token_files, write_token_file
from provision.acl.token_files import secret_path as secret_path
from provision.consul import (
    Consul,
    ConsulError,
    ConsulServerError,
    ConsulUnavailable,
    PermissionDenied,
)
from provision.consul.models import Policy, Token
from provision.errors import EXIT_DENIED, Interrupted, LocalEnvironmentError, LockctlError
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

Progress = Callable[[int, int], None]
T = TypeVar("T")


class ACLPermissionError(LockctlError):
    """Consul refused an ACL call (403); the message names the permission that is missing."""

    exit_code = EXIT_DENIED


class ApplyFailed(LockctlError):
    """A write failed after others succeeded; a re-run converges. Keeps the cause's exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# --- reading --------------------------------------------------------------------------------


def read_live_state(consul: Consul, desired: Desired, concurrency: int) -> LiveState:
    """Policies and tokens from the list endpoints; rules only where the hash differs."""
    with denied_as(ACL_READ_HINT, "list ACL policies and tokens"):
        policies = consul.acl.list_policies()
        tokens = consul.acl.list_tokens()
    live = LiveState(
        tuple(LivePolicy(p.id, p.name, p.description, p.hash, p.rules) for p in policies),
        tuple(
            LiveToken(t.accessor_id, t.description, t.policy_names, t.create_index) for t in tokens
        ),
    )
    to_read = set(policies_to_read(desired, live))
    if not to_read:
        return live
    with denied_as(ACL_READ_HINT, "read ACL policies"):
        read = _run_all(
            [functools.partial(consul.acl.read_policy, pid) for pid in sorted(to_read)],
            concurrency,
            None,
        )
    rules = {policy.id: policy.rules for policy in read}
    with_rules = tuple(replace(p, rules=rules.get(p.id, p.rules)) for p in live.policies)
    return LiveState(with_rules, live.tokens)


def plan_against(
    consul: Consul,
    desired: Desired,
    secrets_dir: Path,
    *,
    prune: bool = False,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> Plan:
    """Read the live state and check the token files against it, and plan. Changes nothing."""
    live = read_live_state(consul, desired, concurrency)
    workers = workers_with_tokens(desired, live)
    files = read_token_files(consul, secrets_dir, workers, concurrency)
    return plan_changes(desired, live, token_files=files, prune=prune)


# --- applying -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ApplyResult:
    plan: Plan
    applied: int
    secrets_written: tuple[Path, ...]
    seconds: float


def apply_spec(
    consul: Consul,
    desired: Desired,
    secrets_dir: Path,
    planned: Plan,
    *,
    prune: bool = False,
    concurrency: int = DEFAULT_CONCURRENCY,
    progress: Progress | None = None,
    lock_wait: float = DEFAULT_LOCK_WAIT,
    stop: StopFlag | None = None,
) -> ApplyResult:
    """Apply the spec, one lockctl at a time: when `planned` (made without the lock) has any
    change, take lockctl's lock, plan again under it (another run may have done the work
    while this one waited) and apply that plan. A no-op needs no lock.

    `stop` (the CLI's, set by its signal handlers) is asked at safe points: before the lock, as
    it is taken, before the plan under it and between calls, never within one (a token is not
    minted without its file written); a stop raises Interrupted, with the lock released."""
    check_stop(stop, "before apply changed anything")
    if not planned.has_changes:
        return ApplyResult(planned, 0, (), 0.0)
    with apply_lock(consul, "apply", wait=lock_wait, stop=stop):
        fresh = plan_against(consul, desired, secrets_dir, prune=prune, concurrency=concurrency)
        return apply_plan(
            consul, fresh, secrets_dir, concurrency=concurrency, progress=progress, stop=stop
        )


def apply_plan(
    consul: Consul,
    plan: Plan,
    secrets_dir: Path,
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    progress: Progress | None = None,
    stop: StopFlag | None = None,
) -> ApplyResult:
    """Execute `plan` phase by phase; on the first failure (or a stop requested) stop starting
    calls and raise."""
    began = time.monotonic()
    written: list[Path] = []
    written_lock = threading.Lock()
    counter = _Counter(len(plan.policies) + len(plan.tokens), progress)

    def secret_to_file(worker: str, secret: Secret | None) -> None:
        path = secret_path(secrets_dir, worker)
        write_token_file(path, real_secret(secret, f"{worker}'s token"))
        with written_lock:
            written.append(path)

    phases: list[list[Callable[[], None]]] = [
        [_policy_call(consul, c) for c in plan.policies if c.action in ("create", "update")],
        [
            _token_call(consul, c, secret_to_file)
            for c in plan.tokens
            if c.action in ("create", "update", "write-secret")
        ],
        [_token_call(consul, c, secret_to_file) for c in plan.tokens if c.action == "delete"],
        [_policy_call(consul, c) for c in plan.policies if c.action == "delete"],
    ]
    for calls in phases:
        try:
            _run_all(calls, concurrency, counter.tick, stop)
        except LockctlError as exc:
            raise _failed(exc, counter.done, counter.total) from None
    return ApplyResult(plan, counter.done, tuple(sorted(written)), time.monotonic() - began)


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


def _policy_call(consul: Consul, change: PolicyChange) -> Callable[[], None]:
    def call() -> None:
        if change.action == "create":
            _create_policy(consul, change)
        elif change.action == "update":
            assert change.policy_id is not None
            consul.acl.update_policy(
                change.policy_id, change.name, change.rules, change.description
            )
        else:
            assert change.policy_id is not None
            consul.acl.delete_policy(change.policy_id)

    return call


def _token_call(
    consul: Consul, change: TokenChange, secret_to_file: Callable[[str, Secret | None], None]
) -> Callable[[], None]:
    def call() -> None:
        if change.action == "delete":
            assert change.accessor_id is not None
            consul.acl.delete_token(change.accessor_id)
            return
        assert change.worker is not None
        if change.action == "create":
            token = mint_token(consul, change.description, list(change.policies))
            secret_to_file(change.worker, token.secret)
            return
        assert change.accessor_id is not None
        if change.action == "update":
            consul.acl.update_token(change.accessor_id, change.description, list(change.policies))
        else:
            secret_to_file(change.worker, consul.acl.read_token(change.accessor_id).secret)

    return call


def _create_policy(consul: Consul, change: PolicyChange) -> Policy:
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


# --- running calls --------------------------------------------------------------------------


class _Counter:
    def __init__(self, total: int, progress: Progress | None) -> None:
        self.total = total
        self.done = 0
        self._progress = progress
        self._lock = threading.Lock()

    def tick(self) -> None:
        with self._lock:
            self.done += 1
            done = self.done
        if self._progress is not None:
            self._progress(done, self.total)


def _run_all(
    calls: Sequence[Callable[[], Any]],
    concurrency: int,
    tick: Callable[[], None] | None,
    stop: StopFlag | None = None,
) -> list[Any]:
    """Run `calls` with at most `concurrency` in flight; results in order.

    On the first failure, or once a stop is requested, no further call is started; those in
    flight finish, then the first error (or Interrupted) is raised.
    """
    if not calls:
        return []
    results: list[Any] = [None] * len(calls)
    first_error: BaseException | None = None
    pending = iter(enumerate(calls))
    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(calls)))) as pool:
        running: dict[Future[Any], int] = {}

        def start_next() -> None:
            if stop is not None and stop.requested:
                return
            for index, call in pending:
                running[pool.submit(call)] = index
                return

        for _ in range(min(concurrency, len(calls))):
            start_next()
        while running:
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                index = running.pop(future)
                error = future.exception()
                if error is not None:
                    first_error = first_error or error
                    continue
                results[index] = future.result()
                if tick is not None:
                    tick()
                if first_error is None:
                    start_next()
    if first_error is not None:
        raise first_error
    if next(pending, None) is not None:  # a stop kept it from starting every call
        check_stop(stop, "")
    return results


@contextlib.contextmanager
def denied_as(hint: str, what: str) -> Iterator[None]:
    """Turn a 403 into ACLPermissionError naming what was refused and what is needed."""
    try:
        yield
    except PermissionDenied:
        raise ACLPermissionError(
            f"Consul refused to {what} (403 permission denied): {hint}"
        ) from None


def _failed(exc: LockctlError, done: int, total: int) -> LockctlError:
    progress = f"{done} of {total} changes were applied; run apply again to converge"
    if isinstance(exc, Interrupted):
        return Interrupted(f"{exc}: {progress}")
    if isinstance(exc, PermissionDenied):
        return ACLPermissionError(
            f"Consul refused an ACL write (403 permission denied): {ACL_WRITE_HINT}; {progress}"
        )
    if isinstance(exc, ConsulError | LocalEnvironmentError | ACLPermissionError):
        return ApplyFailed(f"{exc}; {progress}", exc.exit_code)
    return exc
