"""The two-datacenter federation `lockctl cluster up --datacenters 2` starts (the session's
`live_federation`: one server and one worker agent per datacenter): WAN-joined, ACLs replicated
from dc1, and the Consul facts a job once per datacenter stands on (a global token works in
both once replicated, a Local one only where it was made, each datacenter its own KV)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from provision.cli.app import app
from provision.consul import Consul, ConsulError, PermissionDenied
from provision.spec.names import MANAGED_MARKER
from provision.system.deadline import Deadline, attempts
from tests.conftest import LiveFederation

REPLICATION_WAIT = 60.0  # seconds: a new token reaches the secondary at its next replication round


def test_both_datacenters_see_each_other_and_dc2_replicates(
    live_federation: LiveFederation,
) -> None:
    status = live_federation.status
    assert status.names == ("dc1", "dc2")
    assert status.healthy
    dc1, dc2 = status.datacenters
    assert {"dc1", "dc2"} <= set(dc1.wan) and {"dc1", "dc2"} <= set(dc2.wan)
    assert dc1.replication is None  # the primary replicates from no one
    assert dc2.replication is not None and dc2.replication.source_datacenter == "dc1"
    assert dc2.replication.kind == "tokens" and dc2.replication.running
    # node names stay unique across the federation, as the spec's worker names are
    assert [a.name for a in dc2.cluster.layout.agents] == ["dc2-server-1", "dc2-worker-1"]


def test_cluster_status_shows_both_datacenters_and_the_replication(
    live_federation: LiveFederation, federation_state_dir: Path
) -> None:
    runner = CliRunner()
    state = str(federation_state_dir)
    shown = runner.invoke(app, ["cluster", "status", "--state-dir", state])
    assert shown.exit_code == 0, shown.output
    assert "datacenter dc1 (primary)" in shown.output
    assert "datacenter dc2 (secondary)" in shown.output
    assert "ACL replication: tokens, running" in shown.output
    assert "federation healthy: yes" in shown.output
    record = json.loads(
        runner.invoke(app, ["cluster", "status", "--state-dir", state, "--json"]).output
    )
    assert [dc["datacenter"] for dc in record["datacenters"]] == ["dc1", "dc2"]
    assert record["healthy"] is True and record["datacenters"][1]["replication"] == "tokens"


def test_a_global_token_reaches_dc2_and_each_datacenter_keeps_its_own_kv(
    live_federation: LiveFederation,
) -> None:
    """A job once per datacenter: the same prefix and the same (global) policy in both, and
    what one datacenter writes under it the other never sees."""
    dc1 = live_federation["dc1"].management("worker-1")
    name = f"fed-{uuid.uuid4().hex[:8]}"
    prefix = f"locks/{name}/"
    dc1.acl.create_policy(name, f'key_prefix "{prefix}" {{ policy = "write" }}', MANAGED_MARKER)
    minted = dc1.acl.create_token(f"{MANAGED_MARKER}: {name}", [name])
    assert minted.secret is not None and not minted.local
    in_dc2 = live_federation["dc2"].client("dc2-worker-1", minted.secret)
    for _ in attempts(Deadline(REPLICATION_WAIT), 0.2):
        try:
            in_dc2.kv.put(f"{prefix}where", b"dc2")
            break
        except PermissionDenied:
            continue  # not replicated yet
    else:
        pytest.fail(f"the token made in dc1 was not replicated to dc2 in {REPLICATION_WAIT:g} s")
    in_dc1 = live_federation["dc1"].client("worker-1", minted.secret)
    in_dc1.kv.put(f"{prefix}where", b"dc1")
    assert _value(in_dc2, f"{prefix}where") == b"dc2"
    assert _value(in_dc1, f"{prefix}where") == b"dc1"
    with pytest.raises(PermissionDenied):  # the token reaches its prefix only
        in_dc2.kv.put(f"locks/other-{name}/where", b"dc2")


def test_a_local_token_of_dc2_is_unknown_in_dc1(live_federation: LiveFederation) -> None:
    dc2 = live_federation["dc2"].management("dc2-server-1")
    name = f"fed-local-{uuid.uuid4().hex[:8]}"
    local = dc2.acl.create_token(f"{MANAGED_MARKER}: {name}", [], local=True)
    assert local.secret is not None and local.local
    assert (
        live_federation["dc2"].client("dc2-worker-1").acl.read_self_token(token=local.secret).local
    )
    with pytest.raises(ConsulError):  # 403 "ACL not found": dc1 never heard of it
        live_federation["dc1"].client("worker-1").acl.read_self_token(token=local.secret)


def _value(client: Consul, key: str) -> bytes | None:
    entry, _ = client.kv.get(key)
    return None if entry is None else entry.value
