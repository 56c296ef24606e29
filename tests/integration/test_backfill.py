"""`lockctl backfill` on the real cluster: a job on @every 5s, four past ticks of which one ran
(its record written before); the command lists three to run and one skipped, and writes the
backfill; a second one is refused while it is pending, and a range over catchup_limit without
--yes; two `lockctl schedule` replicas then run each of the three once (one `acquired` across
both, one log line), recorded as backfill with who and why, and leave the one that ran as it
was."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from scheduler_lab import SchedulerProcess
from workers_lab import minted_workers, operator_command, spec_text

from provision.ledger.records import TickOutcome, TickRecord, tick_key, tick_name, timestamp
from provision.ledger.store import Ledger
from provision.schedule import parse_schedule
from provision.system.control_keys import control_prefix
from tests.lockctl_process import eventually

if TYPE_CHECKING:
    from conftest import LiveCluster

WORKERS = ("worker-1", "worker-2")
SCHEDULE = parse_schedule("@every 5s")
WAIT = 30.0


@dataclass
class Lab:
    cluster: LiveCluster
    spec_path: Path
    job: str
    lock_key: str
    configs: dict[str, Path]
    log: Path
    secrets: list[str] = field(default_factory=list, repr=False)  # never printed


@pytest.fixture(scope="module")
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("backfill")
    uid = uuid.uuid4().hex[:8]
    job, log, kv = f"backfill-{uid}", tmp / "ran.log", f"test/backfill-{uid}/"
    line = f'echo "$LOCKCTL_TICK $LOCKCTL_WORKER" >> {log}'
    attributes = {
        "prefix": json.dumps(kv),
        "schedule": '"@every 5s"',
        "command": json.dumps(["/bin/sh", "-c", line]),
    }
    spec_path = tmp / "locks.hcl"
    spec_path.write_text(spec_text(live_cluster, WORKERS, {job: attributes}))
    with minted_workers(live_cluster, spec_path, WORKERS, tmp, uid, kv) as made:
        yield Lab(live_cluster, spec_path, job, f"{kv}.lock", made.configs, log, made.secrets)
        live_cluster.management().kv.delete(control_prefix(job), recurse=True)


def lockctl(lab: Lab, *args: str) -> subprocess.CompletedProcess[str]:
    return operator_command(lab.cluster, lab.spec_path, lab.secrets, *args)


def records(lab: Lab) -> dict[datetime, TickRecord]:
    return {r.tick: r for r in Ledger(lab.cluster.management(), lab.lock_key).records()}


def _pending(lab: Lab) -> str | None:
    states = json.loads(lockctl(lab, "status", "--json").stdout)
    (state,) = [s for s in states if s["job"] == lab.job]
    return state["backfill_pending"]


def logged(lab: Lab) -> list[str]:
    return lab.log.read_text().splitlines() if lab.log.exists() else []


def test_a_backfill_runs_each_tick_nobody_ran_once_across_two_replicas(lab: Lab) -> None:
    now = datetime.now(timezone.utc)
    ticks = SCHEDULE.next_ticks(now - timedelta(seconds=45), 4)  # long closed, all four
    ran = TickRecord(ticks[1], TickOutcome.SUCCEEDED, worker="before", exit_status=0)
    lab.cluster.management().kv.put(tick_key(lab.lock_key, ticks[1]), ran.encode())
    # the ledger's oldest record, a minute before: a backfill never runs a tick older than it
    # (retention may have pruned that tick's record)
    oldest = TickRecord(ticks[0] - timedelta(seconds=60), TickOutcome.MISSED, worker="before")
    lab.cluster.management().kv.put(tick_key(lab.lock_key, oldest.tick), oldest.encode())
    span = ["--from", timestamp(ticks[0]), "--to", timestamp(ticks[-1])]

    wide = ["--from", timestamp(ticks[0] - timedelta(seconds=60)), "--to", timestamp(ticks[-1])]
    over = lockctl(lab, "backfill", lab.job, *wide, "--dry-run")
    print(f"\n$ lockctl backfill {lab.job} {' '.join(wide)} --dry-run\n{over.stdout}{over.stderr}")
    assert over.returncode == 1 and "over the job's catchup_limit (10)" in over.stderr

    asked = lockctl(lab, "backfill", lab.job, *span, "--reason", "the outage")
    print(f"\n$ lockctl backfill {lab.job} {' '.join(span)} --reason 'the outage'\n{asked.stdout}")
    assert asked.returncode == 0, asked.stderr
    assert f"job {lab.job}: 3 ticks to run, 1 skipped" in asked.stdout
    assert f"skip {tick_name(ticks[1])}: already recorded succeeded" in asked.stdout
    backfill_id = asked.stdout.split("(backfill ", 1)[1].split(")", 1)[0]

    again = lockctl(lab, "backfill", lab.job, *span)
    assert again.returncode == 1
    assert again.stderr.startswith(f"lockctl: error: job {lab.job} has a backfill pending")

    pending = _pending(lab)
    assert pending is not None and pending.startswith("3 of 3 ticks left, asked by "), pending
    print(f"\n$ lockctl status\n{lockctl(lab, 'status').stdout}")  # for docs
    wanted = [ticks[0], ticks[2], ticks[3]]
    schedulers = [SchedulerProcess(lab.configs[worker]) for worker in WORKERS]
    try:

        def done() -> bool:
            found = records(lab)
            return all(t in found and found[t].finished for t in wanted)

        assert eventually(done, WAIT), (records(lab), [s.lines[-20:] for s in schedulers])
        assert eventually(lambda: _pending(lab) is None, WAIT)  # done: no longer said
        acquired = [e for s in schedulers for e in s.events("acquired")]
    finally:
        for scheduler in schedulers:
            scheduler.stop()
    found = records(lab)
    for tick in wanted:  # each once, on one replica of two, recorded as the backfill's
        record = found[tick]
        assert record.outcome is TickOutcome.SUCCEEDED, tick_name(tick)
        assert (record.backfill, record.reason) == (backfill_id, "the outage")
        assert [e["worker"] for e in acquired if e["tick"] == tick_name(tick)] == [record.worker]
        assert logged(lab).count(f"{tick_name(tick)} {record.worker}") == 1
    assert found[ticks[1]].worker == "before" and found[ticks[1]].backfill is None
    assert not [line for line in logged(lab) if line.startswith(tick_name(ticks[1]))]
    history = lockctl(lab, "history", "--job", lab.job, "--since", "2m")
    print(f"\n$ lockctl history --job {lab.job} --since 2m\n{history.stdout}")  # for docs
    assert history.stdout.count("succeeded (backfill, by ") == 3, history.stdout
    assert "Traceback" not in "\n".join(line for s in schedulers for line in s.lines)
