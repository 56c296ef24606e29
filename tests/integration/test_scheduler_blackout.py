"""A blackout window on the real cluster: three `lockctl schedule` replicas run an `@every 2s`
job whose spec holds a window that opens every 20 s for 6 s (on the epoch's grid, so the test
behaves the same at any time of day). Every tick inside a window is recorded `blackout` naming
it, by one replica, and none runs; the ticks outside run; `history` shows the records and
`check` does not page."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from scheduler_lab import SchedulerProcess
from workers_lab import minted_workers, operator_command, spec_text

from provision.ledger.records import TickRecord
from provision.ledger.store import Ledger
from provision.outcomes import Outcome
from tests.lockctl_process import eventually

if TYPE_CHECKING:
    from conftest import LiveCluster

WORKERS = ("worker-1", "worker-2", "worker-3")
WINDOW, EVERY, LENGTH = "quiet", 20, 6  # a window opens every 20 s and lasts 6 s: 3 ticks
WAIT = 55.0  # a whole window and a run after it come within 20 + 6 + 2 s of the first turn


@dataclass
class Lab:
    cluster: LiveCluster
    spec_path: Path
    job: str
    lock_key: str
    configs: dict[str, Path]
    runs: Path  # one line per run of the job
    secrets: list[str] = field(default_factory=list, repr=False)  # never printed


@pytest.fixture(scope="module")
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("blackout")
    uid = uuid.uuid4().hex[:8]
    job, runs = f"blackout-{uid}", tmp / "runs.log"
    command = json.dumps(["/bin/sh", "-c", f"echo ran >> {runs}"])
    prefix = f"test/blackout-{uid}/"
    attributes = {"prefix": f'"{prefix}"', "schedule": '"@every 2s"', "command": command}
    text = spec_text(live_cluster, WORKERS, {job: attributes})
    block = (
        f'  blackout "{WINDOW}" {{\n    schedule = "@every {EVERY}s"\n'
        f'    duration = "{LENGTH}s"\n  }}\n'
    )
    spec_path = tmp / "locks.hcl"
    spec_path.write_text(text.replace(f'job "{job}" {{\n', f'job "{job}" {{\n{block}'))
    with minted_workers(live_cluster, spec_path, WORKERS, tmp, uid, prefix) as made:
        yield Lab(live_cluster, spec_path, job, f"{prefix}.lock", made.configs, runs, made.secrets)


def in_window(tick: datetime) -> bool:
    return int(tick.timestamp()) % EVERY < LENGTH


def records(lab: Lab, since: datetime) -> list[TickRecord]:
    return [r for r in Ledger(lab.cluster.management(), lab.lock_key).records() if r.tick >= since]


def settled(lab: Lab, since: datetime) -> bool:
    """A window's ticks recorded (LENGTH / 2 of them at least), and a run after them."""
    found = records(lab, since)
    held = [r for r in found if r.outcome is Outcome.BLACKOUT]
    ran_after = held and any(
        r.outcome is Outcome.SUCCEEDED and r.tick > held[-1].tick for r in found
    )
    return len(held) >= LENGTH // 2 and bool(ran_after)


def test_ticks_in_a_window_are_recorded_blackout_and_none_runs(lab: Lab) -> None:
    began = datetime.now(timezone.utc)
    schedulers = [SchedulerProcess(lab.configs[worker]) for worker in WORKERS]
    try:
        assert eventually(lambda: settled(lab, began), WAIT), records(lab, began)
        found = records(lab, began)
        for record in found:
            if in_window(record.tick):
                assert record.outcome is Outcome.BLACKOUT, record
                assert record.window == WINDOW and record.worker in WORKERS, record
                assert record.claimed_at is None and record.exit_status is None, record
            else:
                assert record.outcome is not Outcome.BLACKOUT, record
        ran = [r for r in found if r.outcome is Outcome.SUCCEEDED]
        assert ran and all(not in_window(r.tick) for r in ran)
        skips = [e for s in schedulers for e in s.events("skipped")]
        assert any(WINDOW in str(e.get("reason")) for e in skips), skips

        history = operator_command(
            lab.cluster, lab.spec_path, lab.secrets, "history", "--job", lab.job, "--limit", "8"
        )
        assert history.returncode == 0, history.stderr
        print(f"\n$ lockctl history --job {lab.job} --limit 8\n{history.stdout}")  # for docs
        assert f"blackout (window {WINDOW})" in history.stdout
        check = operator_command(lab.cluster, lab.spec_path, lab.secrets, "check", "--job", lab.job)
        print(f"\n$ lockctl check --job {lab.job}\n{check.stdout}")  # for docs
        assert check.returncode == 0, check.stdout  # a window's ticks are no missed runs
        for scheduler in schedulers:
            assert scheduler.stop() == 0, scheduler.lines
            assert not any("Traceback" in line for line in scheduler.lines), scheduler.lines
    finally:
        for scheduler in schedulers:
            scheduler.kill()
