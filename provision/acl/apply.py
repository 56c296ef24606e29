"""Apply: read live ACLs, plan, and execute the plan with bounded concurrency.

The live state is read with the two list endpoints (plus a read of any policy whose hash
differs), so a no-op run costs two requests whatever the size of the spec. Writes run in
phases, each with at most `concurrency` calls in flight (give a client pooled for as many,
`consul.with_pool(concurrency)`):

    policies create/update -> auth methods, roles, binding rules create/update -> binding
    rules, roles, auth methods delete -> tokens create/update/write-secret -> token deletes ->
    policy deletes

Every step is safe to interrupt: a re-run adopts what exists by name (policies) or marker
(tokens), re-reads a token whose file was not written (or holds anything but the worker's live
token), and removes a duplicate token left by an interrupted rotate, so it converges without
duplicates. Changes are made under lockctl's own lock (acl.serialize), one run at a time.
Secrets go only to files (0600), and only real ones; the writes themselves are acl.writes'.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from provision.acl.concurrency import DEFAULT_CONCURRENCY
from provision.acl.identity_apply import identity_phases, read_live_identity
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
from provision.acl.replication import NotReplicated, TokenThere, await_replicated
from provision.acl.serialize import DEFAULT_LOCK_WAIT, StopFlag, apply_lock, check_stop

# check_secrets_dir and secret_path are re-exported: rotate and the CLI take them from here.
from provision.acl.token_files import check_secrets_dir as check_secrets_dir
from provision.acl.token_files import read_token_files, write_token_file
from provision.acl.token_files import secret_path as secret_path
from provision.acl.writes import (
    ACL_READ_HINT,
    ACL_WRITE_HINT,
    ACLPermissionError,
    create_policy,
    denied_as,
    mint_token,
    real_secret,
)
from provision.consul import Consul, ConsulError, PermissionDenied
from provision.errors import Interrupted, LocalEnvironmentError, LockctlError
from provision.system.secrets import Secret

Progress = Callable[[int, int], None]


class ApplyFailed(LockctlError):
    """A write failed after others succeeded; a re-run converges. Keeps the cause's exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# --- reading --------------------------------------------------------------------------------


def read_live_state(
    consul: Consul, desired: Desired, concurrency: int, *, prune: bool = False
) -> LiveState:
    """Policies and tokens from the list endpoints; rules only where the hash differs. The
    identity objects too when the spec has any, or for --prune (it may delete managed ones)."""
    with denied_as(ACL_READ_HINT, "list ACL policies and tokens"):
        policies = consul.acl.list_policies()
        tokens = consul.acl.list_tokens()
    live = LiveState(
        tuple(LivePolicy(p.id, p.name, p.description, p.hash, p.rules) for p in policies),
        tuple(
            LiveToken(t.accessor_id, t.description, t.policy_names, t.create_index) for t in tokens
        ),
    )
    if desired.identity or prune:
        methods = {m.name for m in desired.identity.methods}
        live = replace(live, identity=read_live_identity(consul, methods))
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
    return replace(live, policies=with_rules)


def plan_against(
    consul: Consul,
    desired: Desired,
    secrets_dir: Path,
    *,
    prune: bool = False,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> Plan:
    """Read the live state and check the token files against it, and plan. Changes nothing."""
    live = read_live_state(consul, desired, concurrency, prune=prune)
    workers = workers_with_tokens(desired, live)
    files = read_token_files(consul, secrets_dir, workers, concurrency)
    return plan_changes(desired, live, token_files=files, prune=prune)


# --- applying -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ApplyTarget:
    """What apply makes Consul match: the rendered spec, the folder of the workers' token
    files, and whether managed objects no longer in the spec are deleted (--prune). Planned
    from once without lockctl's lock and once more under it."""

    desired: Desired
    secrets_dir: Path
    prune: bool = False

    def plan(self, consul: Consul, concurrency: int = DEFAULT_CONCURRENCY) -> Plan:
        """The plan against Consul's live state now (see plan_against). Changes nothing."""
        return plan_against(
            consul, self.desired, self.secrets_dir, prune=self.prune, concurrency=concurrency
        )


@dataclass(frozen=True)
class ApplyResult:
    plan: Plan
    applied: int
    secrets_written: tuple[Path, ...]
    seconds: float


def apply_spec(
    consul: Consul,
    target: ApplyTarget,
    planned: Plan,
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    progress: Progress | None = None,
    lock_wait: float = DEFAULT_LOCK_WAIT,
    stop: StopFlag | None = None,
) -> ApplyResult:
    """Apply the spec, one lockctl at a time: when `planned` (made without the lock) has any
    change, take lockctl's lock, plan `target` again under it (another run may have done the
    work while this one waited) and apply that plan. A no-op needs no lock.

    `stop` (the CLI's, set by its signal handlers) is asked at safe points: before the lock, as
    it is taken, before the plan under it and between calls, never within one (a token is not
    minted without its file written); a stop raises Interrupted, with the lock released."""
    check_stop(stop, "before apply changed anything")
    if not planned.has_changes:
        return ApplyResult(planned, 0, (), 0.0)
    with apply_lock(consul, "apply", wait=lock_wait, stop=stop):
        fresh = target.plan(consul, concurrency)
        return apply_plan(
            consul, fresh, target.secrets_dir, concurrency=concurrency, progress=progress, stop=stop
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
    counter = _Counter(len(plan.policies) + len(plan.tokens) + len(plan.identity), progress)

    def secret_to_file(worker: str, secret: Secret | None) -> None:
        path = secret_path(secrets_dir, worker)
        write_token_file(path, real_secret(secret, f"{worker}'s token"))
        with written_lock:
            written.append(path)

    identity_writes, identity_deletes = identity_phases(consul, plan.identity)
    phases: list[list[Callable[[], None]]] = [
        [_policy_call(consul, c) for c in plan.policies if c.action in ("create", "update")],
        *identity_writes,  # after the policies a role links, before the tokens
        *identity_deletes,  # before the policies a deleted role linked are deleted
        [
            _token_call(consul, c, secret_to_file, stop)
            for c in plan.tokens
            if c.action in ("create", "update", "write-secret")
        ],
        [_token_call(consul, c, secret_to_file, stop) for c in plan.tokens if c.action == "delete"],
        [_policy_call(consul, c) for c in plan.policies if c.action == "delete"],
    ]
    for calls in phases:
        try:
            _run_all(calls, concurrency, counter.tick, stop)
        except LockctlError as exc:
            raise _failed(exc, counter.done, counter.total) from None
    return ApplyResult(plan, counter.done, tuple(sorted(written)), time.monotonic() - began)


def _policy_call(consul: Consul, change: PolicyChange) -> Callable[[], None]:
    def call() -> None:
        if change.action == "create":
            create_policy(consul, change)
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
    consul: Consul,
    change: TokenChange,
    secret_to_file: Callable[[str, Secret | None], None],
    stop: StopFlag | None,
) -> Callable[[], None]:
    """One token's change; a worker's token file is written only once the worker's
    datacenter knows the token (replication.py), and an update returns only then too."""

    def known_there(secret: Secret | None) -> Secret | None:
        if change.datacenter is not None and change.worker is not None:
            wanted = real_secret(secret, f"{change.worker}'s token")
            there = TokenThere(change.worker, change.datacenter, wanted, change.policies)
            await_replicated(consul, there, stop)
        return secret

    def call() -> None:
        if change.action == "delete":
            assert change.accessor_id is not None
            consul.acl.delete_token(change.accessor_id)
            return
        assert change.worker is not None
        if change.action == "create":
            token = mint_token(consul, change.description, list(change.policies))
            secret_to_file(change.worker, known_there(token.secret))
            return
        assert change.accessor_id is not None
        if change.action == "update":
            consul.acl.update_token(change.accessor_id, change.description, list(change.policies))
            if change.datacenter is not None:
                known_there(consul.acl.read_token(change.accessor_id).secret)
        else:
            secret = consul.acl.read_token(change.accessor_id).secret
            secret_to_file(change.worker, known_there(secret))

    return call


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


def _failed(exc: LockctlError, done: int, total: int) -> LockctlError:
    progress = f"{done} of {total} changes were applied; run apply again to converge"
    if isinstance(exc, Interrupted):
        return Interrupted(f"{exc}: {progress}")
    if isinstance(exc, PermissionDenied):
        return ACLPermissionError(
            f"Consul refused an ACL write (403 permission denied): {ACL_WRITE_HINT}; {progress}"
        )
    if isinstance(exc, ConsulError | LocalEnvironmentError | ACLPermissionError | NotReplicated):
        return ApplyFailed(f"{exc}; {progress}", exc.exit_code)
    return exc
