"""A scheduled job's `lockctl run` refused for Consul's lock-delay says so, on the real cluster.

The holder of a job's lock (a `lockctl run` on worker-1) has its session destroyed while its job
runs: Consul frees the lock and puts it in the session's lock-delay, the job's `lock_delay`,
long here. A `lockctl run` of the next tick on worker-2 inside that delay finds the tick
unrecorded and the lock free, and its claim is refused by Consul for the lock-delay: a `skipped`
event whose reason says lock-delay, exit 0 (docs/runner.md's exit codes), its command never run.
After a release (the holder's job ended) there is no lock-delay: the next tick's run runs.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from workers_lab import minted_workers, spec_text

from provision.ledger.records import TickOutcome, tick_name
from provision.ledger.store import Ledger
from provision.schedule import parse_schedule
from tests.lockctl_process import LOCKCTL

if TYPE_CHECKING:
    from conftest import LiveCluster

WORKERS = ("worker-1", "worker-2")
EVERY = 3  # seconds between ticks
SCHEDULE = parse_schedule(f"@every {EVERY}s")
LOCK_DELAY = 45.0  # the job's: a run of the next tick is asked well inside it, however loaded
JOBS = ("delayed", "released")
WAIT = 90.0  # seconds a runner may take at most (a loaded machine)
DEADLINE = 30.0  # seconds the test waits at most for what it polls


@dataclass(frozen=True)
class Lab:
    tmp: Path
    configs: dict[str, Path]
    jobs: dict[str, str]
    keys: dict[str, str]
    cluster: LiveCluster


@pytest.fixture(scope="module")
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("run-lock-delay")
    uid = uuid.uuid4().hex[:8]
    kv = f"test/run-lock-delay-{uid}/"
    jobs = {
        f"{short}-{uid}": {
            "prefix": f'"{kv}{short}/"',
            "schedule": f'"@every {EVERY}s"',
            "lock_delay": f'"{LOCK_DELAY:g}s"',
        }
        for short in JOBS
    }
    spec_path = tmp / "locks.hcl"
    spec_path.write_text(spec_text(live_cluster, WORKERS, jobs))
    with minted_workers(live_cluster, spec_path, WORKERS, tmp, uid, kv) as made:
        yield Lab(
            tmp,
            made.configs,
            {short: f"{short}-{uid}" for short in JOBS},
            {short: f"{kv}{short}/.lock" for short in JOBS},
            live_cluster,
        )


def _run(lab: Lab, worker: str, short: str, command: str) -> subprocess.CompletedProcess[str]:
    argv = [*LOCKCTL, "run", "--config", str(lab.configs[worker]), "--job", lab.jobs[short]]
    return subprocess.run(
        [*argv, "--", "sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )


def _at_next_tick(lab: Lab, worker: str, short: str, command: str) -> tuple[datetime, Any]:
    """A run of the job on `worker` just after the next tick: the tick and the run's result."""
    tick = SCHEDULE.next_ticks(datetime.now(timezone.utc), 1)[0]
    time.sleep(max(0.0, tick.timestamp() + 0.05 - time.time()))
    return tick, _run(lab, worker, short, command)


def _named(result: subprocess.CompletedProcess[str], name: str) -> list[dict[str, Any]]:
    events = (json.loads(line) for line in result.stderr.splitlines() if line.startswith("{"))
    return [event for event in events if event["event"] == name]


def _holder_session(lab: Lab, short: str) -> str:
    """The session holding the job's lock, once one does (a consistent read)."""
    consul = lab.cluster.management()
    give_up = time.monotonic() + DEADLINE + EVERY
    while True:
        entry, _ = consul.kv.get(lab.keys[short], consistency="consistent")
        if entry is not None and entry.session:
            return entry.session
        assert time.monotonic() < give_up, "the holder never took the lock"
        time.sleep(0.1)


def test_a_run_refused_for_the_lock_delay_is_skipped_and_says_lock_delay(lab: Lab) -> None:
    ran = lab.tmp / "delayed.ran"
    holder: dict[str, subprocess.CompletedProcess[str]] = {}

    def hold() -> None:
        holder["run"] = _at_next_tick(lab, "worker-1", "delayed", "sleep 60")[1]

    thread = threading.Thread(target=hold)
    thread.start()
    session = _holder_session(lab, "delayed")
    consul = lab.cluster.management()
    destroyed = time.monotonic()
    consul.session.destroy(session)  # invalidated, not released: the job's lock-delay is on
    entry, _ = consul.kv.get(lab.keys["delayed"], consistency="consistent")
    assert entry is not None and entry.session is None  # free: nobody holds it
    tick, late = _at_next_tick(lab, "worker-2", "delayed", f"echo ran >> {ran}")
    assert time.monotonic() - destroyed < LOCK_DELAY, "asked after the lock-delay: proves nothing"
    assert late.returncode == 0, late.stderr
    skipped = _named(late, "skipped")
    assert len(skipped) == 1, late.stderr
    assert skipped[0]["tick"] == tick_name(tick)
    assert "lock-delay" in skipped[0]["reason"], skipped[0]
    assert not _named(late, "acquired") and not ran.exists()
    assert Ledger(consul, lab.keys["delayed"]).read(tick)[0] is None  # the claim wrote nothing
    thread.join(WAIT)
    lost = holder["run"]
    assert lost.returncode == 76 and _named(lost, "lost"), lost.stderr  # its job was stopped


def test_after_a_release_the_next_run_has_no_lock_delay(lab: Lab) -> None:
    ran = lab.tmp / "released.ran"
    first, done = _at_next_tick(lab, "worker-1", "released", "true")
    assert done.returncode == 0 and _named(done, "released"), done.stderr
    released = time.monotonic()
    tick, after = _at_next_tick(lab, "worker-2", "released", f"echo ran >> {ran}")
    assert time.monotonic() - released < LOCK_DELAY, "asked after a lock-delay: proves nothing"
    assert after.returncode == 0, after.stderr
    assert not _named(after, "skipped") and _named(after, "acquired"), after.stderr
    assert ran.read_text() == "ran\n"
    records = {r.tick: r for r in Ledger(lab.cluster.management(), lab.keys["released"]).records()}
    assert tick > first
    assert [records[t].outcome for t in (first, tick)] == [TickOutcome.SUCCEEDED] * 2
    assert records[tick].worker == "worker-2"
