"""`scope = "datacenter"` on the federated cluster: a job whose workers are in dc1 and dc2 runs
once per tick in each datacenter, each worker claiming through its own agent in its own
datacenter's KV; a second run in a datacenter for the same tick is skipped there. The spec's
policies and tokens are made in dc1 (global) and used in dc2 once replicated, as `apply` makes
them."""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime
from pathlib import Path

from provision.acl.render import render_policies
from provision.consul import Consul, ConsulError
from provision.ledger.records import decode, ticks_prefix
from provision.spec import load_spec
from provision.system.deadline import Deadline, attempts
from provision.system.secrets import Secret, write_secret_file
from provision.system.templates import find_templates_dir
from provision.workers.files import Placement, write_worker_files
from tests.conftest import LiveCluster, LiveFederation
from tests.lockctl_process import run_lockctl

WORKERS = {"worker-1": "dc1", "dc2-worker-1": "dc2"}
REPLICATION_WAIT = 60.0
PERIOD = 6 * 3600  # the job's schedule: ticks at 00, 06, 12 and 18 UTC
# the test's runs take seconds: started this close to a tick, they could straddle two ticks, so
# the test first lets the tick come (at most this long, once in six hours)
CLEARANCE = 90
COMMAND = ("--", "/bin/sh", "-c", "true")


def _spec(federation: LiveFederation, job: str, prefix: str) -> str:
    lines = ["defaults {", '  ttl = "10s"', '  lock_delay = "4s"', '  renew_interval = "1s"']
    lines += ['  kill_grace = "1s"', "}"]
    for worker, datacenter in WORKERS.items():
        address = federation[datacenter].address(worker)
        lines += [f'worker "{worker}" {{', f'  address = "{address}"']
        lines += [f'  datacenter = "{datacenter}"', "}"]
    lines += [
        f'job "{job}" {{',
        f'  prefix         = "{prefix}"',
        f"  workers        = {json.dumps(list(WORKERS))}",
        '  scope          = "datacenter"',
        '  schedule       = "@every 6h"',
        '  start_deadline = "7h"',
        '  command        = ["/bin/sh", "-c", "true"]',
        "}",
    ]
    return "\n".join(lines) + "\n"


def _usable(cluster: LiveCluster, worker: str, secret: Secret) -> None:
    """A token made in dc1 is in dc2 once replicated: wait for it, within a bound."""
    client = cluster.client(worker, secret)
    for _ in attempts(Deadline(REPLICATION_WAIT), 0.2):
        try:
            client.acl.read_self_token()
            return
        except ConsulError:
            continue
    raise AssertionError(f"{worker}'s token not usable in its datacenter in {REPLICATION_WAIT}s")


def _records(client: Consul, prefix: str) -> dict[str, str | None]:
    """Each tick recorded in this datacenter's KV, and the worker that claimed it."""
    under = ticks_prefix(f"{prefix}.lock")
    found = {}
    for entry in client.kv.tree(under):
        tick = datetime.fromisoformat(entry.key.removeprefix(under).replace("Z", "+00:00"))
        found[entry.key.removeprefix(under)] = decode(tick, entry.value).worker
    return found


def _events(stderr: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def _clear_of_the_next_tick() -> None:
    left = PERIOD - time.time() % PERIOD
    if left < CLEARANCE:
        time.sleep(left + 1)


def test_a_job_scoped_per_datacenter_runs_once_per_tick_in_each(
    live_federation: LiveFederation, tmp_path: Path
) -> None:
    uid = uuid.uuid4().hex[:8]
    job, prefix = f"per-dc-{uid}", f"test/per-dc-{uid}/"
    spec_path = tmp_path / "locks.hcl"
    spec_path.write_text(_spec(live_federation, job, prefix))
    spec = load_spec(spec_path)
    assert spec.jobs[0].scope == "datacenter"
    rendered = render_policies(spec, find_templates_dir())
    dc1 = live_federation["dc1"].management()
    for policy in rendered.policies:  # global: made in the primary, replicated to dc2
        if dc1.acl.read_policy_by_name(policy.name) is None:
            dc1.acl.create_policy(policy.name, policy.rules, f"test {uid}")
    configs = {}
    for plan in rendered.tokens:
        token = dc1.acl.create_token(f"test {uid}: {plan.worker}", list(plan.policies))
        assert token.secret is not None
        write_secret_file(tmp_path / "secrets" / f"{plan.worker}.token", token.secret)
        cluster = live_federation[WORKERS[plan.worker]]
        _usable(cluster, plan.worker, token.secret)
        # each datacenter's workers carry its own agents' certificate pairs (one CA for all)
        tls_dir = cluster.layout.tls_dir if cluster.layout.tls else None
        placement = Placement(None, tmp_path / "secrets", "lockctl", tls_dir)
        templates = find_templates_dir()
        write_worker_files(spec, [plan.worker], tmp_path / "workers", templates, placement)
        configs[plan.worker] = tmp_path / "workers" / plan.worker / "lockctl.json"

    _clear_of_the_next_tick()
    runs = {
        worker: run_lockctl("run", "--config", str(configs[worker]), "--job", job, *COMMAND)
        for worker in WORKERS
    }
    again = run_lockctl("run", "--config", str(configs["dc2-worker-1"]), "--job", job, *COMMAND)

    for worker, done in runs.items():
        assert done.returncode == 0, (worker, done.stderr)
    assert again.returncode == 0, again.stderr
    in_dc1 = _records(live_federation["dc1"].management("worker-1"), prefix)
    in_dc2 = _records(live_federation["dc2"].management("dc2-worker-1"), prefix)
    # one tick, claimed once in each datacenter, by that datacenter's worker; the second run in
    # dc2 found it taken there and added nothing
    assert len(in_dc1) == 1 and list(in_dc1.values()) == ["worker-1"], in_dc1
    assert len(in_dc2) == 1 and list(in_dc2.values()) == ["dc2-worker-1"], in_dc2
    assert in_dc1.keys() == in_dc2.keys()
    skipped = [e for e in _events(again.stderr) if e["event"] == "skipped"]
    assert [e["taken_by"] for e in skipped] == ["dc2-worker-1"], again.stderr
    # each datacenter's lock has its own LockIndex: the first holder in each is 1
    for worker, done in runs.items():
        [acquired] = [e for e in _events(done.stderr) if e["event"] == "acquired"]
        assert acquired["worker"] == worker and acquired["lock_index"] == 1
