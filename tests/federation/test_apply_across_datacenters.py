"""`lockctl apply` on the federated cluster: policies and tokens are made in dc1 (global) and
reach dc2 by ACL replication, so apply writes a dc2 worker's token file only once dc2 knows the
token and its policies. Right after apply returns, the dc2 worker's token (read from the file
apply wrote) is resolved by dc2 and creates a session on its own node there and takes a lock
under its job's prefix: on the first try, with no wait of the test's. The test's spec has an
owner of its own, and the test deletes what apply made."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from provision.acl.replication import NotReplicated, TokenThere, await_replicated, missing_there
from provision.system.secrets import read_secret_file, write_secret_file
from tests.conftest import LiveCluster, LiveFederation
from tests.integration.spec_objects import SpecObjects
from tests.lockctl_process import run_lockctl

WORKERS = {"worker-1": "dc1", "dc2-worker-1": "dc2"}


def _spec(federation: LiveFederation, owner: str, job: str, prefix: str) -> str:
    lines = [f'owner = "{owner}"']
    for worker, datacenter in WORKERS.items():
        address = federation[datacenter].address(worker)
        lines += [f'worker "{worker}" {{', f'  address = "{address}"']
        lines += [f'  datacenter = "{datacenter}"', "}"]
    lines += [f'job "{job}" {{', f'  prefix  = "{prefix}"']
    lines += [f"  workers = {json.dumps(list(WORKERS))}", '  scope   = "datacenter"', "}"]
    return "\n".join(lines) + "\n"


def _apply(
    cluster: LiveCluster, spec_path: Path, secrets: Path, management: Path
) -> dict[str, Any]:
    """`lockctl apply --json` of the spec, through dc1's worker agent; its JSON answer."""
    connection = ["--address", cluster.address("worker-1"), "--token-file", str(management)]
    spec = ["--spec", str(spec_path), "--secrets-dir", str(secrets), "--json"]
    applied = run_lockctl("apply", *spec, *connection, *cluster.tls_flags())
    assert applied.returncode == 0, applied.stderr
    answer: dict[str, Any] = json.loads(applied.stdout)
    return answer


def test_apply_writes_a_dc2_workers_token_file_once_dc2_knows_the_token(
    live_federation: LiveFederation, tmp_path: Path
) -> None:
    uid = uuid.uuid4().hex[:8]
    owner, job, prefix = f"fed-{uid}", f"fed-apply-{uid}", f"test/fed-apply-{uid}/"
    spec_path = tmp_path / "locks.hcl"
    spec_path.write_text(_spec(live_federation, owner, job, prefix))
    dc1, dc2 = live_federation["dc1"], live_federation["dc2"]
    management = tmp_path / "management.token"
    write_secret_file(management, dc1.management_token)
    secrets = tmp_path / "secrets"
    made = SpecObjects(dc1.management, uid)
    made.note(spec_path)
    try:
        _apply(dc1, spec_path, secrets, management)
        secret = read_secret_file(secrets / "dc2-worker-1.token")
        # at once: dc2 resolves the token and its session policy lets it work on its own node
        worker = dc2.client("dc2-worker-1", secret)
        assert worker.acl.read_self_token().description.endswith("dc2-worker-1")
        session = worker.session.create(name=f"test {uid}", ttl=10, lock_delay=0)
        try:
            assert worker.kv.put(f"{prefix}.lock", b"", acquire=session)
        finally:
            worker.session.destroy(session)
            dc2.management("dc2-worker-1").kv.delete(f"{prefix}.lock")
        again = _apply(dc1, spec_path, secrets, management)
        assert again["applied"] == 0, again  # idempotent
    finally:
        made.delete()  # by name, what the spec made: never a list of the whole federation


def test_a_token_its_datacenter_never_gets_is_awaited_then_refused(
    live_federation: LiveFederation,
) -> None:
    """A Local token of dc1 never reaches dc2 (CONSUL_FACTS): dc2 does not know it, dc1 does;
    awaited in dc2, it is refused after the wait, naming what is missing and where, its secret
    nowhere in the words."""
    uid = uuid.uuid4().hex[:8]
    dc1 = live_federation["dc1"].management()
    token = dc1.acl.create_token(f"test {uid}: local to dc1", [], local=True)
    assert token.secret is not None
    try:
        in_dc2 = TokenThere(f"w-{uid}", "dc2", token.secret, ())
        assert missing_there(dc1, in_dc2) == "the token"
        assert missing_there(dc1, replace(in_dc2, datacenter="dc1")) == ""
        # a policy the token does not carry: what dc1 is missing is the token's policies
        named = replace(in_dc2, datacenter="dc1", policies=("global-management",))
        assert missing_there(dc1, named) == "the token's policies as applied"
        with pytest.raises(NotReplicated) as refused:
            await_replicated(dc1, in_dc2, None, wait=1.0)
        said = str(refused.value)
        assert said.startswith(f"dc2 does not know the token of worker w-{uid} after 1 s"), said
        assert token.secret.reveal() not in said and refused.value.exit_code == 3
        await_replicated(dc1, replace(in_dc2, datacenter="dc1"), None, wait=1.0)  # known: at once
    finally:
        dc1.acl.delete_token(token.accessor_id)
