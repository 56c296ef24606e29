"""The operators' commands on a `scope = "datacenter"` job, through one agent in dc1: pause in
dc2 only, status shows it paused in dc2 and not in dc1, history shows each datacenter's own
ledger, resume. Each datacenter's ledger holds one record, written there beforehand."""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from provision.consul import Consul
from provision.ledger.records import TickRecord, tick_key, tick_name
from provision.outcomes import Outcome
from provision.spec import load_spec
from provision.system.control_keys import control_prefix
from provision.system.secrets import write_secret_file
from tests.conftest import LiveFederation
from tests.lockctl_process import run_lockctl

WORKERS = {"worker-1": "dc1", "dc2-worker-1": "dc2"}
PERIOD = 6 * 3600  # the job's schedule: ticks at 00, 06, 12 and 18 UTC


def _spec(federation: LiveFederation, job: str, prefix: str) -> str:
    lines = []
    for worker, datacenter in WORKERS.items():
        address = federation[datacenter].address(worker)
        lines += [f'worker "{worker}" {{', f'  address = "{address}"']
        lines += [f'  datacenter = "{datacenter}"', "}"]
    lines += [
        f'job "{job}" {{',
        f'  prefix   = "{prefix}"',
        f"  workers  = {json.dumps(list(WORKERS))}",
        '  scope    = "datacenter"',
        '  schedule = "@every 6h"',
        '  command  = ["/bin/true"]',
        "}",
    ]
    return "\n".join(lines) + "\n"


def test_pause_in_one_datacenter_status_and_history_per_datacenter(
    live_federation: LiveFederation, tmp_path: Path
) -> None:
    uid = uuid.uuid4().hex[:8]
    job, prefix = f"ops-dc-{uid}", f"test/ops-dc-{uid}/"
    spec_path = tmp_path / "locks.hcl"
    spec_path.write_text(_spec(live_federation, job, prefix))
    lock_key = load_spec(spec_path).jobs[0].lock_key
    dc1 = live_federation["dc1"]
    token_file = tmp_path / "management.token"
    write_secret_file(token_file, dc1.management_token)
    # every command goes to dc1's agent: dc2's keys are reached through it (?dc=dc2)
    connection = ["--address", dc1.address("worker-1"), "--token-file", str(token_file)]
    connection += [*dc1.tls_flags(), "--spec", str(spec_path)]

    def lockctl(*args: str) -> Any:
        done = run_lockctl(*args, *connection)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done

    # each datacenter's ledger: the latest tick, run by that datacenter's worker
    tick = datetime.fromtimestamp(time.time() // PERIOD * PERIOD, timezone.utc)
    clients: dict[str, Consul] = {
        dc: live_federation[dc].management(w) for w, dc in WORKERS.items()
    }
    for worker, datacenter in WORKERS.items():
        record = TickRecord(tick, Outcome.SUCCEEDED, worker=worker, exit_status=0, duration=1.0)
        assert clients[datacenter].kv.put(tick_key(lock_key, tick), record.encode())
    try:
        paused = lockctl("pause", job, "--datacenter", "dc2", "--reason", "dc2 maintenance")
        assert paused.stdout.startswith(f"dc2: job {job} paused by "), paused.stdout
        assert "dc1" not in paused.stdout

        states = {s["datacenter"]: s for s in json.loads(lockctl("status", "--json").stdout)}
        assert set(states) == {"dc1", "dc2"}
        assert states["dc1"]["paused"] is None
        assert states["dc2"]["paused"] is not None and "dc2 maintenance" in states["dc2"]["paused"]
        assert states["dc1"]["last_tick"]["worker"] == "worker-1"
        assert states["dc2"]["last_tick"]["worker"] == "dc2-worker-1"

        histories = json.loads(lockctl("history", "--job", job, "--json").stdout)
        assert [h["datacenter"] for h in histories] == ["dc1", "dc2"]
        for history in histories:
            recorded = [row["worker"] for row in history["ticks"] if row["recorded"]]
            expected = "worker-1" if history["datacenter"] == "dc1" else "dc2-worker-1"
            assert recorded == [expected], history
        only = json.loads(lockctl("history", "--job", job, "--json", "--datacenter", "dc2").stdout)
        assert [h["datacenter"] for h in only] == ["dc2"]
        named = lockctl("history", "--job", job, "--tick", tick_name(tick), "--json").stdout
        assert [(r["datacenter"], r["worker"]) for r in json.loads(named)] == [
            ("dc1", "worker-1"),
            ("dc2", "dc2-worker-1"),
        ]

        resumed = lockctl("resume", job)  # both: dc1 was never paused
        assert resumed.stdout.splitlines() == [
            f"dc1: job {job} was not paused",
            f"dc2: job {job} resumed",
        ]
        states = {s["datacenter"]: s for s in json.loads(lockctl("status", "--json").stdout)}
        assert states["dc1"]["paused"] is None and states["dc2"]["paused"] is None
    finally:
        for client in clients.values():
            client.kv.delete(prefix, recurse=True)
            client.kv.delete(control_prefix(job), recurse=True)
