"""A keyed job under `lockctl schedule` on the real cluster: the spec lists its keys, and two
replicas run it once per tick for each key, under each key's own lock and ledger, the keys'
runs beside each other; the job is told its key; the events name it; `history --key` reads a
key's ledger and the job's own ledger stays empty."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

import pytest
from scheduler_lab import SchedulerProcess
from workers_lab import JobLab, one_job

from provision.keyed import keyed_lock_key
from provision.ledger.records import TickOutcome, TickRecord, parse_tick_name
from provision.ledger.store import Ledger
from tests.lockctl_process import eventually

if TYPE_CHECKING:
    from conftest import LiveCluster

WORKERS = ("worker-1", "worker-2")
KEYS = ("tenant-1", "tenant-2", "tenant-3")
WAIT = 90.0
TICKS = 3  # ticks every key has run before the test looks

# $1: the file each run writes its key and tick to; each run lasts 2 s (the keys' runs of a
# tick go on at once).
JOB = """#!/bin/sh
echo "$LOCKCTL_KEY $LOCKCTL_TICK" >> "$1"
exec sleep 2
"""


@pytest.fixture
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobLab]:
    tmp = tmp_path_factory.mktemp("keyed-schedule")
    script = tmp / "run.sh"
    script.write_text(JOB)
    script.chmod(0o755)
    attributes = {
        "schedule": '"@every 5s"',
        "keys": json.dumps(list(KEYS)),
        "command": json.dumps([str(script), str(tmp / "ran")]),
    }
    with one_job(live_cluster, tmp, "keyed-sched", WORKERS, attributes) as lab:
        yield lab


def key_records(lab: JobLab, key: str) -> list[TickRecord]:
    return Ledger(lab.cluster.management(), keyed_lock_key(lab.lock_key, key)).records()


def runs(lab: JobLab) -> list[tuple[str, datetime]]:
    path = lab.tmp / "ran"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(key, parse_tick_name(tick)) for key, tick in (line.split() for line in lines)]


def test_each_listed_key_runs_once_per_tick_on_its_own_lock(lab: JobLab) -> None:
    schedulers = [SchedulerProcess(lab.configs[worker]) for worker in WORKERS]
    try:

        def every_key_ran() -> dict[str, list[TickRecord]]:
            done = {
                key: [r for r in key_records(lab, key) if r.outcome is TickOutcome.SUCCEEDED]
                for key in KEYS
            }
            return done if all(len(found) >= TICKS for found in done.values()) else {}

        done = eventually(every_key_ran, WAIT)
        assert done, ({k: key_records(lab, k) for k in KEYS}, schedulers[0].lines[-20:])
    finally:
        for scheduler in schedulers:
            assert scheduler.stop() == 0, scheduler.lines
            assert not any("Traceback" in line for line in scheduler.lines), scheduler.lines
    ran = runs(lab)
    assert [run for run, n in Counter(ran).items() if n > 1] == []  # no key's tick twice
    for key in KEYS:
        ticks = {r.tick for r in done[key]}
        assert ticks <= {tick for k, tick in ran if k == key}, (key, ran)  # told its own key
    # the keys of one tick ran at once: each tick every key ran has all three keys' runs
    common = set.intersection(*({r.tick for r in done[key]} for key in KEYS))
    assert common, done
    assert lab.records() == []  # the job's own ledger: a keyed job's ticks are its keys'
    said = [e for s in schedulers for e in s.events("acquired")]
    assert {e.get("key") for e in said} >= set(KEYS), said[:5]
    history = lab.operator("history", "--job", lab.job, "--key", "tenant-2", "--limit", "3")
    assert history.returncode == 0, history.stderr
    print(f"\n$ lockctl history --job {lab.job} --key tenant-2 --limit 3\n{history.stdout}")
    assert f"{lab.job}, key tenant-2" in history.stdout
    status = json.loads(lab.operator("status", "--json").stdout)
    [state] = [s for s in status if s["job"] == lab.job]
    assert state["keys_seen"] == list(KEYS)
    recent = datetime.now(timezone.utc) - timedelta(minutes=5)
    assert all(tick > recent for _, tick in ran)
