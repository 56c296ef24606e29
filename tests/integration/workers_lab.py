"""Real workers for tests that run `lockctl run`: a spec's policies and worker tokens created on
the live cluster (names suffixed with a uid, so test modules never collide), the token files and
worker configs written, and everything deleted again at the end."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from provision.acl.render import render_policies
from provision.consul import Consul, ConsulError, PermissionDenied
from provision.ledger.records import TickRecord
from provision.ledger.store import Ledger
from provision.spec import load_spec
from provision.system.control_keys import control_prefix
from provision.system.secrets import Secret, write_secret_file
from provision.system.templates import find_templates_dir
from provision.workers.files import Placement, write_worker_files
from tests.lockctl_process import LOCKCTL

if TYPE_CHECKING:
    from conftest import LiveCluster


FAST_DEFAULTS = {"ttl": "10s", "lock_delay": "4s", "renew_interval": "1s", "kill_grace": "1s"}


def spec_text(
    cluster: LiveCluster,
    workers: Sequence[str],
    jobs: dict[str, dict[str, str]],
    defaults: dict[str, str] = FAST_DEFAULTS,
) -> str:
    """A spec for the live cluster: `workers` at their agents' addresses, and each job with its
    attributes as HCL source (`'"@every 3s"'`, `'["/bin/sh", "-c", "true"]'`), on all workers."""
    lines = ["defaults {", *(f"  {k} = {json.dumps(v)}" for k, v in defaults.items()), "}"]
    for worker in workers:
        lines += [f'worker "{worker}" {{', f'  address = "{cluster.address(worker)}"', "}"]
    for name, attributes in jobs.items():
        lines += [f'job "{name}" {{', f"  workers = {json.dumps(list(workers))}"]
        lines += [f"  {key} = {value}" for key, value in attributes.items()]
        lines += ["}"]
    return "\n".join(lines) + "\n"


@dataclass
class MintedWorkers:
    """What was made: the worker configs, every secret minted (never to be printed), and a way
    to mint more tokens over the same policies."""

    configs: dict[str, Path]
    secrets: list[str] = field(default_factory=list, repr=False)  # never printed
    policy_names: dict[str, str] = field(default_factory=dict)  # rendered name -> live name
    management: Consul | None = None
    uid: str = ""
    token_ids: list[str] = field(default_factory=list)

    def mint(self, description: str, policies: Sequence[str], path: Path) -> Secret:
        """A token with these (rendered) policies, its secret written to `path` (0600). Its
        description starts with the lab's uid, never with lockctl's token marker: no apply
        --prune, nor any apply's list of stale managed objects, takes it for lockctl's own."""
        assert self.management is not None
        live = [self.policy_names[name] for name in policies]
        token = self.management.acl.create_token(f"test {self.uid}: {description}", live)
        assert token.secret is not None
        self.token_ids.append(token.accessor_id)
        self.secrets.append(token.secret.reveal())
        write_secret_file(path, token.secret)
        return token.secret


@contextlib.contextmanager
def minted_workers(
    cluster: LiveCluster, spec_path: Path, workers: Sequence[str], tmp: Path, uid: str, kv: str
) -> Iterator[MintedWorkers]:
    """The spec's policies and one token per worker on the cluster, and the workers' files in
    `tmp` (secrets/, workers/); the KV tree `kv` is deleted at the end with the rest."""
    spec = load_spec(spec_path)
    rendered = render_policies(spec, find_templates_dir())
    management = cluster.management()
    out = tmp / "workers"
    made = MintedWorkers({w: out / w / "lockctl.json" for w in workers}, management=management)
    made.uid = uid
    made.policy_names = {p.name: f"{p.name}-{uid}" for p in rendered.policies}
    policy_ids: list[str] = []
    try:
        for policy in rendered.policies:
            created = management.acl.create_policy(made.policy_names[policy.name], policy.rules)
            policy_ids.append(created.id)
        for plan in rendered.tokens:
            made.mint(plan.description, plan.policies, tmp / "secrets" / f"{plan.worker}.token")
        # The workers' own client agents' certificate pairs, as `--tls-dir` names them.
        tls_dir = cluster.layout.tls_dir if cluster.layout.tls else None
        placement = Placement(None, tmp / "secrets", "lockctl", tls_dir)
        write_worker_files(spec, list(workers), out, find_templates_dir(), placement)
        for worker in workers:
            secret = Secret((tmp / "secrets" / f"{worker}.token").read_text().strip())
            eventually_usable(cluster.client(worker, secret))
        yield made
    finally:
        for token_id in made.token_ids:
            with contextlib.suppress(ConsulError):
                management.acl.delete_token(token_id)
        for policy_id in policy_ids:
            with contextlib.suppress(ConsulError):
                management.acl.delete_policy(policy_id)
        with contextlib.suppress(ConsulError):
            management.kv.delete(kv, recurse=True)


@dataclass
class JobLab:
    """One job of a test's own on real workers (`one_job`): its spec, lock key and configs."""

    cluster: LiveCluster
    spec_path: Path
    job: str
    lock_key: str
    configs: dict[str, Path]
    tmp: Path
    uid: str
    secrets: list[str] = field(default_factory=list, repr=False)  # never printed

    def records(self) -> list[TickRecord]:
        """The job's ledger, oldest tick first."""
        return Ledger(self.cluster.management(), self.lock_key).records()

    def operator(self, *args: str, token: Path | None = None) -> subprocess.CompletedProcess[str]:
        """An operator's `lockctl` command on the lab's spec (`operator_command`)."""
        return operator_command(self.cluster, self.spec_path, self.secrets, *args, token=token)


@contextlib.contextmanager
def one_job(
    cluster: LiveCluster, tmp: Path, stem: str, workers: Sequence[str], attributes: dict[str, str]
) -> Iterator[JobLab]:
    """A job `<stem>-<uid>` under `test/<stem>-<uid>/` with these HCL attributes, on `workers`
    with minted tokens; at the end its control keys go with the rest (`minted_workers`)."""
    uid = uuid.uuid4().hex[:8]
    job, kv = f"{stem}-{uid}", f"test/{stem}-{uid}/"
    spec_path = tmp / "locks.hcl"
    spec_path.write_text(spec_text(cluster, workers, {job: {"prefix": f'"{kv}"', **attributes}}))
    with minted_workers(cluster, spec_path, workers, tmp, uid, kv) as made:
        lab = JobLab(cluster, spec_path, job, f"{kv}.lock", made.configs, tmp, uid, made.secrets)
        try:
            yield lab
        finally:
            with contextlib.suppress(ConsulError):
                cluster.management().kv.delete(control_prefix(job), recurse=True)


def eventually_usable(consul: Consul) -> None:
    """A fresh token reaches the followers a moment after the leader (CONSUL_FACTS.md)."""
    give_up_at = time.monotonic() + 10
    while True:
        try:
            consul.acl.read_self_token()
            return
        except PermissionDenied:
            if time.monotonic() > give_up_at:
                raise
            time.sleep(0.1)


def operator_command(
    cluster: LiveCluster, spec: Path, secrets: Sequence[str], *args: str, token: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """An operator's `lockctl` command on `spec` (pause, resume, trigger, status, history), with
    the management token (as `apply` takes it) unless told; none of `secrets` nor the management
    token may show in its output, nor a traceback."""
    flags = ["--spec", str(spec), "--address", cluster.address("server-1")]
    flags += ["--token-file", str(token or cluster.layout.management_token_file)]
    result = subprocess.run(
        [*LOCKCTL, *args, *flags, *cluster.tls_flags()],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    shown = result.stdout + result.stderr
    assert not any(secret in shown for secret in [*secrets, cluster.management_token.reveal()])
    assert "Traceback" not in result.stderr, result.stderr
    return result
