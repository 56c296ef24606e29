"""The operators' commands on a `scope = "datacenter"` job, through one agent in dc1: pause in
dc2 only, status shows it paused in dc2 and not in dc1, history shows each datacenter's own
ledger, resume. Each datacenter's ledger holds one record, written there beforehand. Then a
datacenter Consul cannot reach (a worker of the spec in dc9: "No path to datacenter"): status,
check and pause still show and write dc1 and dc2, dc9 said in one line, exit 7 (check:
UNKNOWN); history and resume collect alike (tests/unit/test_datacenter_failures.py)."""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from provision.consul import Consul
from provision.errors import EXIT_PARTIAL
from provision.ledger.records import TickRecord, tick_key, tick_name
from provision.outcomes import Outcome
from provision.spec import load_spec
from provision.system.control_keys import control_prefix, paused_key
from provision.system.secrets import write_secret_file
from tests.conftest import LiveFederation
from tests.lockctl_process import run_lockctl

WORKERS = {"worker-1": "dc1", "dc2-worker-1": "dc2"}
PERIOD = 6 * 3600  # the job's schedule: ticks at 00, 06, 12 and 18 UTC
LOST = "dc9"  # no such datacenter in the federation: Consul answers "No path to datacenter"


def _spec(
    federation: LiveFederation, job: str, prefix: str, workers: dict[str, str] = WORKERS
) -> str:
    lines = []
    for worker, datacenter in workers.items():
        # dc9's worker is never asked: the commands go through dc1's agent
        there = ("dc1", "worker-1") if datacenter == LOST else (datacenter, worker)
        address = federation[there[0]].address(there[1])
        lines += [f'worker "{worker}" {{', f'  address = "{address}"']
        lines += [f'  datacenter = "{datacenter}"', "}"]
    lines += [
        f'job "{job}" {{',
        f'  prefix   = "{prefix}"',
        f"  workers  = {json.dumps(list(workers))}",
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


def test_a_datacenter_that_cannot_be_read_is_said_and_the_others_are_shown(
    live_federation: LiveFederation, tmp_path: Path
) -> None:
    uid = uuid.uuid4().hex[:8]
    job, prefix = f"ops-lost-{uid}", f"test/ops-lost-{uid}/"
    spec_path = tmp_path / "locks.hcl"
    workers = {**WORKERS, "dc9-worker-1": LOST}
    spec_path.write_text(_spec(live_federation, job, prefix, workers))
    lock_key = load_spec(spec_path).jobs[0].lock_key
    dc1 = live_federation["dc1"]
    token_file = tmp_path / "management.token"
    write_secret_file(token_file, dc1.management_token)
    # Consul retries nothing for us, the client does: dc9's 500 is retried until --timeout
    connection = ["--address", dc1.address("worker-1"), "--token-file", str(token_file)]
    connection += [*dc1.tls_flags(), "--spec", str(spec_path), "--timeout", "3"]
    answered = "Consul answered 500: rpc error making call: No path to datacenter"
    lost = f"lockctl: error: {LOST}: could not be read: {answered}"

    def lockctl(*args: str, exit_code: int = EXIT_PARTIAL) -> Any:
        done = run_lockctl(*args, *connection)
        assert done.returncode == exit_code, (args, done.stdout, done.stderr)
        return done

    tick = datetime.fromtimestamp(time.time() // PERIOD * PERIOD, timezone.utc)
    clients: dict[str, Consul] = {
        dc: live_federation[dc].management(w) for w, dc in WORKERS.items()
    }
    for worker, datacenter in WORKERS.items():
        record = TickRecord(tick, Outcome.SUCCEEDED, worker=worker, exit_status=0, duration=1.0)
        assert clients[datacenter].kv.put(tick_key(lock_key, tick), record.encode())
    try:
        status = lockctl("status", "--json")
        rows = json.loads(status.stdout)
        assert [(r["datacenter"], r["last_tick"]["worker"]) for r in rows[:2]] == [
            ("dc1", "worker-1"),
            ("dc2", "dc2-worker-1"),
        ]
        assert rows[2:] == [{"job": job, "datacenter": LOST, "error": lost.split(": ", 3)[3]}]
        assert status.stderr.splitlines() == [
            lost,
            f"lockctl: error: failed in {LOST} (2 of 3 datacenters done)",
        ]

        checked = lockctl("check", "--job", job, exit_code=3).stdout.splitlines()
        assert checked[0] == f"UNKNOWN: 3 jobs, 1 unknown ({job} in {LOST}), 2 ok", checked
        assert [line.split(":")[0] for line in checked[1:]] == [
            f"OK {job} in dc1",
            f"OK {job} in dc2",
            f"UNKNOWN {job} in {LOST}",
        ]

        paused = lockctl("pause", job, "--reason", "all but dc9")
        assert [line.split(" paused")[0] for line in paused.stdout.splitlines()] == [
            f"dc1: job {job}",
            f"dc2: job {job}",
        ]
        assert paused.stderr.splitlines()[0] == f"lockctl: error: {LOST}: failed: {answered}"
        for client in clients.values():  # each datacenter that answered holds its pause
            assert client.kv.get(paused_key(job))[0] is not None
    finally:
        for client in clients.values():
            client.kv.delete(prefix, recurse=True)
            client.kv.delete(control_prefix(job), recurse=True)
