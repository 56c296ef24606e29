"""`lockctl schedule --max-concurrent-runs` on the real cluster: three replicas (three client
agents) share an `@every 4s` job; worker-1, at cap 1, is busy with a long job of its own. Each
tick of the shared job after the long one started runs once, never on worker-1, and worker-1
says `at-capacity` for each tick it was first in the claim order for (it passes the tick on;
the next replica claims it at its turn). No timing is asserted: the ledger and the runs' log
are read once the ticks came, with a bound."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from scheduler_lab import SchedulerProcess
from workers_lab import minted_workers

from provision.ledger.records import TickOutcome, tick_name
from provision.ledger.store import Ledger
from provision.ledger.turns import claim_order
from provision.schedule import parse_schedule
from tests.lockctl_process import eventually

if TYPE_CHECKING:
    from conftest import LiveCluster

WORKERS = ("worker-1", "worker-2", "worker-3")
BUSY = "worker-1"
EVERY = 4
TICKS = 5  # ticks of the shared job checked after the long one started
QUICK_DEFAULTS = (
    "defaults {",
    '  ttl            = "10s"',
    '  lock_delay     = "4s"',
    '  renew_interval = "1s"',
    '  kill_grace     = "1s"',
    "}",
)


@dataclass(frozen=True)
class Lab:
    configs: dict[str, Path]
    short: str
    short_key: str
    log: Path
    cluster: LiveCluster


def _spec_text(cluster: LiveCluster, uid: str, log: Path) -> str:
    line = f'echo "$LOCKCTL_TICK $LOCKCTL_WORKER" >> {log}'
    lines = list(QUICK_DEFAULTS)
    for worker in WORKERS:
        lines += [f'worker "{worker}" {{', f'  address = "{cluster.address(worker)}"', "}"]
    lines += [  # the long job: worker-1's alone, its run outlasts the test
        f'job "long-{uid}" {{',
        f'  prefix   = "test/cap-{uid}/long/"',
        f'  workers  = ["{BUSY}"]',
        '  schedule = "@every 2s"',
        f"  command  = {json.dumps(['/bin/sh', '-c', f'echo long >> {log}.long; sleep 300'])}",
        "}",
        f'job "short-{uid}" {{',
        f'  prefix   = "test/cap-{uid}/short/"',
        f"  workers  = {json.dumps(list(WORKERS))}",
        f'  schedule = "@every {EVERY}s"',
        f"  command  = {json.dumps(['/bin/sh', '-c', line])}",
        "}",
    ]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("capacity")
    uid = uuid.uuid4().hex[:8]
    spec_path = tmp / "locks.hcl"
    log = tmp / "runs.log"
    spec_path.write_text(_spec_text(live_cluster, uid, log))
    kv = f"test/cap-{uid}/"
    with minted_workers(live_cluster, spec_path, WORKERS, tmp, uid, kv) as made:
        yield Lab(made.configs, f"short-{uid}", f"{kv}short/.lock", log, live_cluster)


@pytest.fixture
def schedulers(lab: Lab) -> Iterator[dict[str, SchedulerProcess]]:
    started: dict[str, SchedulerProcess] = {}
    try:
        for worker in WORKERS:
            flags = ("--max-concurrent-runs", "1") if worker == BUSY else ()
            started[worker] = SchedulerProcess(lab.configs[worker], *flags)
        yield started
    finally:  # a clean stop: the long run is interrupted and its record completed
        for scheduler in started.values():
            try:
                scheduler.stop()
            finally:
                scheduler.kill()


def _runs(log: Path) -> list[tuple[str, str]]:
    """(tick, worker) of each run of the shared job, as its command wrote them."""
    if not log.exists():
        return []
    return [tuple(line.split()) for line in log.read_text().splitlines()]  # type: ignore[misc]


def test_a_replica_at_its_cap_passes_each_tick_on_and_it_runs_once_elsewhere(
    lab: Lab, schedulers: dict[str, SchedulerProcess]
) -> None:
    busy = schedulers[BUSY]
    # the long job's run holds worker-1's one place from its start on
    claimed = eventually(lambda: [e for e in busy.events("acquired") if "long" in e["job"]], 45)
    assert claimed, busy.lines
    assert busy.events("started")[0]["max_concurrent_runs"] == 1  # the flag's, said at the start
    assert "max_concurrent_runs" not in schedulers["worker-2"].events("started")[0]
    since = datetime.now(timezone.utc)
    schedule = parse_schedule(f"@every {EVERY}s")
    ticks = schedule.next_ticks(since, TICKS + 1)[1:]  # the first may be claimed already
    names = [tick_name(tick) for tick in ticks]
    ledger = Ledger(lab.cluster.management(), lab.short_key)

    def all_recorded() -> bool:
        records = [ledger.read(tick)[0] for tick in ticks]
        return all(r is not None and r.outcome is not TickOutcome.RUNNING for r in records)

    assert eventually(all_recorded, EVERY * (TICKS + 1) + 20, pause=0.5)
    for tick, name in zip(ticks, names, strict=True):
        record = ledger.read(tick)[0]
        assert record is not None and record.outcome is TickOutcome.SUCCEEDED, (name, record)
        assert record.worker != BUSY, record
        ran = [worker for run_tick, worker in _runs(lab.log) if run_tick == name]
        assert ran == [record.worker], (name, ran)  # once, where the ledger says
        if claim_order(lab.short, tick, WORKERS)[0] == BUSY:  # passed on, said why
            said = [
                e for e in busy.events("skipped") if e["job"] == lab.short and e.get("tick") == name
            ]
            assert said and said[0]["reason"].startswith("at-capacity"), (name, said, busy.lines)
    shown = [line for line in busy.lines if "at-capacity" in line or '"started"' in line]
    print("\n" + "\n".join(shown)[:2000])  # for docs/scheduler.md
