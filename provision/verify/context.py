"""What the checks work with: the spec, a client per worker (its own agent, its own token), an
optional management client, and a cleanup registry so checks leave nothing behind."""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

from provision.consul import Consul, ConsulSettings
from provision.consul.errors import ConsulError, ConsulUnavailable
from provision.consul.settings import normalize_address
from provision.errors import InputError
from provision.spec import Job, Spec
from provision.system.files import UnreadableFile, read_regular_file
from provision.system.secrets import Secret, read_secret_file

MAX_INVENTORY_BYTES = 1024 * 1024
VERIFY_KEY = ".lockctl-verify"  # checks that take a lock use <prefix>.lockctl-verify/..., never
# the job's real lock key: verifying a live cluster must not make a real runner skip its tick.


class _Own:
    """Sentinel: the worker's own token."""


OWN = _Own()


@dataclass(frozen=True)
class WorkerAccess:
    name: str
    address: str
    token: Secret | None  # None: no token file for this worker


@dataclass
class VerifyContext:
    spec: Spec
    settings: ConsulSettings  # TLS, timeout, and the management token if one was given
    workers: dict[str, WorkerAccess]
    templates_dir: Path | None = None  # what live-policies-lint renders with; None: lockctl's
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    cleanup: Cleanup = field(default_factory=lambda: Cleanup())
    # JWTs to log in with, by worker (or a stranger's name): --bearer-token-file (login_checks)
    bearer_tokens: dict[str, Secret] = field(default_factory=dict)
    # the operators' token (pause, trigger, break): --operator-token-file (control_checks)
    operator_token: Secret | None = field(default=None, repr=False)

    @cached_property
    def management(self) -> Consul | None:
        return Consul(self.settings) if self.settings.token else None

    def client(self, worker: str, token: Secret | _Own | None = OWN) -> Consul:
        """A client of `worker`'s own agent, with its own token, another token, or none."""
        access = self.workers[worker]
        chosen = access.token if isinstance(token, _Own) else token
        return Consul(replace(self.settings, address=access.address, token=chosen))

    def require_reachable(self) -> None:
        """Raise `ConsulUnavailable` (exit 3) when an agent the checks talk to does not answer.

        Asked once before the checks, of every agent at once: an agent that is down or hangs
        is not a failed promise but no cluster to check, and each check finding that out for
        itself, call by call, took minutes. So this ends within one client timeout.
        """
        addresses = {access.address for access in self.workers.values()}
        if self.management is not None:
            addresses.add(self.settings.address)
        clients = [Consul(replace(self.settings, address=a, token=None)) for a in sorted(addresses)]
        with ThreadPoolExecutor(max_workers=max(1, len(clients))) as pool:
            errors = list(pool.map(_unavailable, clients))
        for error in errors:
            if error is not None:
                raise error

    def with_token(self) -> list[WorkerAccess]:
        return [w for w in self.workers.values() if w.token is not None]

    def verify_key(self, job: Job, check: str) -> str:
        return f"{job.prefix}{VERIFY_KEY}/{check}-{self.run_id}"

    def shared_job(self) -> tuple[Job, str, str] | None:
        """A job two workers with tokens may both run: what the race checks compete for."""
        usable = {w.name for w in self.with_token()}
        for job in self.spec.jobs:
            both = [w for w in job.workers if w in usable]
            if len(both) >= 2:
                return job, both[0], both[1]
        return None


def _unavailable(client: Consul) -> ConsulUnavailable | None:
    """Why `client`'s agent cannot be reached, or None when it answers (whatever it says)."""
    try:
        client.status.leader()  # needs no token: any answer shows the agent is there
    except ConsulUnavailable as exc:
        return exc
    except ConsulError:
        return None  # it answered; the checks report what the answer means
    return None


class Cleanup:
    """Sessions and keys the checks made, destroyed at the end, also on failure or Ctrl-C."""

    def __init__(self) -> None:
        self._sessions: list[tuple[Consul, str]] = []
        self._keys: list[tuple[Consul, str]] = []
        self._guard = threading.Lock()

    def session(self, client: Consul, session_id: str) -> str:
        with self._guard:
            self._sessions.append((client, session_id))
        return session_id

    def key(self, client: Consul, key: str) -> str:
        with self._guard:
            self._keys.append((client, key))
        return key

    def run(self) -> int:
        """Destroy every session, then delete every key; how many objects failed to go."""
        with self._guard:
            sessions, self._sessions = self._sessions, []
            keys, self._keys = self._keys, []
        failed = 0
        for client, session_id in sessions:
            try:
                client.session.destroy(session_id)
            except ConsulError:
                failed += 1
        for client, key in keys:
            with contextlib.suppress(ConsulError):
                client.kv.delete(key)
        return failed


def load_workers(
    spec: Spec, secrets_dir: Path | None, inventory: Path | None
) -> dict[str, WorkerAccess]:
    """Each worker's agent address (spec, or the inventory) and token (<secrets-dir>/<w>.token)."""
    addresses = {w.name: w.address for w in spec.workers}
    if inventory is not None:
        addresses.update(_inventory(inventory, set(addresses)))
    workers = {}
    for name, address in addresses.items():
        token = None
        if secrets_dir is not None and (secrets_dir / f"{name}.token").is_file():
            token = read_secret_file(secrets_dir / f"{name}.token")
        workers[name] = WorkerAccess(name, normalize_address(address), token)
    return workers


def _inventory(path: Path, known: set[str]) -> dict[str, str]:
    """An inventory file: JSON {"worker-1": "http://10.0.0.21:8500", ...}."""
    try:
        data = read_regular_file(path, MAX_INVENTORY_BYTES)
        if len(data) > MAX_INVENTORY_BYTES:
            raise ValueError(f"larger than {MAX_INVENTORY_BYTES} bytes")
        raw = json.loads(data.decode("utf-8"))
    except (UnreadableFile, ValueError, RecursionError) as exc:  # a FIFO, /dev/zero, [[[[...
        why = str(exc) or "nested too deep"
        raise InputError(f"{path}: not a readable JSON inventory ({why})") from None
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise InputError(f'{path}: must be a JSON object of worker -> address, like {{"w": "..."}}')
    unknown = sorted(set(raw) - known)
    if unknown:
        raise InputError(f"{path}: {unknown[0]}: not a worker in the spec")
    return {str(k): str(v) for k, v in raw.items()}
