"""One job that fails does not hide and does not stop the others (issue 25, item 2), on the real
cluster: one `lockctl schedule --listen` with two `@every 2s` jobs. The command of one is a
script that a deploy then removes: each of its ticks is `tick-failed`, counted as `error`,
`/healthz` turns 503 naming that job and why, `lockctl_job_failing` is 1 for it, and the other
job runs every tick meanwhile. The script back, the next tick goes through and it is all 200
again. The scheduler ends with 0 and no traceback."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from scheduler_lab import ListeningScheduler
from test_scheduler_listen import QUICK_DEFAULTS, _value
from workers_lab import minted_workers

from tests.lockctl_process import eventually

if TYPE_CHECKING:
    from conftest import LiveCluster


WORKER = "worker-1"
EVERY = 2
WAIT = 30.0


@dataclass(frozen=True)
class Lab:
    config: Path
    script: Path
    broken: str  # the job whose script goes away
    steady: str


def _spec_text(cluster: LiveCluster, uid: str, script: Path) -> str:
    lines = [
        *QUICK_DEFAULTS,
        f'worker "{WORKER}" {{',
        f'  address = "{cluster.address(WORKER)}"',
        "}",
    ]
    for name, command in (("broken", [str(script)]), ("steady", ["/bin/sh", "-c", "exit 0"])):
        lines += [
            f'job "{name}-{uid}" {{',
            f'  prefix   = "test/failing-{uid}/{name}/"',
            f'  workers  = ["{WORKER}"]',
            f'  schedule = "@every {EVERY}s"',
            f"  command  = {json.dumps(command)}",
            "}",
        ]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("failing")
    uid = uuid.uuid4().hex[:8]
    script = tmp / "job.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    spec_path = tmp / "locks.hcl"
    spec_path.write_text(_spec_text(live_cluster, uid, script))
    kv = f"test/failing-{uid}/"
    with minted_workers(live_cluster, spec_path, [WORKER], tmp, uid, kv) as made:
        yield Lab(made.configs[WORKER], script, f"broken-{uid}", f"steady-{uid}")


class Scheduler(ListeningScheduler):
    def healthz(self) -> tuple[int, str]:
        return self.get("/healthz")

    def ran(self, job: str) -> int:
        return sum(1 for e in self.events("released") if e.get("job") == job)


def test_a_failing_job_is_named_by_healthz_and_the_others_run_on(lab: Lab) -> None:
    scheduler = Scheduler(lab.config)
    try:
        assert eventually(lambda: scheduler.events("listening")), scheduler.lines
        assert eventually(lambda: scheduler.healthz() == (200, "ok\n")), scheduler.lines
        assert eventually(lambda: scheduler.ran(lab.broken) and scheduler.ran(lab.steady))

        gone = lab.script.with_suffix(".gone")
        lab.script.rename(gone)  # a deploy removed it
        assert eventually(lambda: scheduler.healthz()[0] == 503, WAIT), scheduler.lines
        status, text = scheduler.healthz()
        print(f"\n/healthz: {status} {text}")  # for docs/scheduler.md
        assert text.startswith(f"{lab.broken}: its last tick failed (cannot start "), text
        assert lab.steady not in text and text.count("\n") == 1
        failed = [e for e in scheduler.events("tick-failed") if e.get("job") == lab.broken]
        assert failed and "not found or not executable" in failed[-1]["error"], failed
        samples = scheduler.scrape()
        assert _value(samples, "lockctl_job_failing", job=lab.broken) == 1.0
        assert _value(samples, "lockctl_job_failing", job=lab.steady) == 0.0
        assert _value(samples, "lockctl_ticks_total", job=lab.broken, outcome="error") >= 1

        # the other job runs on meanwhile: two more of its ticks while the broken one fails
        steady_runs = scheduler.ran(lab.steady)
        assert eventually(lambda: scheduler.ran(lab.steady) >= steady_runs + 2, WAIT)
        assert scheduler.healthz()[0] == 503  # and the failing one still says so

        gone.rename(lab.script)  # back: its next tick goes through
        assert eventually(lambda: scheduler.healthz() == (200, "ok\n"), WAIT), scheduler.lines
        assert _value(scheduler.scrape(), "lockctl_job_failing", job=lab.broken) == 0.0
        assert scheduler.stop() == 0
        assert not any("Traceback" in line for line in scheduler.lines), scheduler.lines
    finally:
        scheduler.kill()
