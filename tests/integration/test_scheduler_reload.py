"""Reload and rotate are safe to do any time (issue 25, item 5), on the real TLS cluster, with
one `lockctl schedule` on worker-1 (and one `lockctl run`):

- a token Consul refuses (403) is `tick-failed` with Consul's reason, not `consul-unavailable`;
- SIGHUP with a config whose token file or CA file is missing or empty is `reload-refused`
  naming it, and the old loops go on untouched (it used to say `reloaded`, then exit 2);
- SIGHUP replaces only the loops that changed: a short job keeps ticking while a long one runs
  through the reload, a job added starts at its next tick, a removed one ends with its run;
- a rotated token (the new one written, the old one deleted, as `lockctl rotate` does) is picked
  up by a running scheduler and a running `lockctl run`, and fences neither's job.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from scheduler_lab import SchedulerProcess
from workers_lab import MintedWorkers, minted_workers, spec_text

if TYPE_CHECKING:
    from conftest import LiveCluster

pytestmark = pytest.mark.cluster

WORKER = "worker-1"
EVERY = 2
LONG = 12  # seconds of the long job: several of the short job's ticks
WAIT = 30.0
LOCKCTL = [sys.executable, "-m", "provision"]


@dataclass(frozen=True)
class Lab:
    tmp: Path
    made: MintedWorkers
    uid: str
    cluster: LiveCluster

    @property
    def config(self) -> dict[str, Any]:
        return dict(json.loads(self.made.configs[WORKER].read_text()))

    def job(self, short: str) -> str:
        return f"{short}-{self.uid}"

    def log(self, short: str) -> Path:
        return self.tmp / f"{short}.log"

    def write_config(self, name: str, jobs: list[str], **consul: str) -> Path:
        """A copy of worker-1's config with only these jobs (short names), `consul` changed."""
        raw = self.config
        raw["jobs"] = {self.job(s): raw["jobs"][self.job(s)] for s in jobs}
        raw["consul"].update(consul)
        path = self.tmp / f"{name}.json"
        path.write_text(json.dumps(raw))
        return path


def _command(log: Path, body: str) -> str:
    line = 'echo "$LOCKCTL_TICK $(date +%s.%N)'
    return json.dumps(["/bin/sh", "-c", f'{line} start" >> {log}; {body}; {line} end" >> {log}'])


def _jobs(tmp: Path, uid: str) -> dict[str, dict[str, str]]:
    marker = tmp / "long.go"  # the long job ends early once the test creates it
    bodies = {
        "quick": "sleep 0.1",
        "added": "sleep 0.1",
        "long": f"for i in $(seq {LONG * 10}); do [ -e {marker} ] && break; sleep 0.1; done",
        "rotated": f"for i in $(seq 600); do [ -e {marker}.run ] && break; sleep 0.1; done",
    }
    return {
        f"{short}-{uid}": {
            "prefix": f'"test/reload-{uid}/{short}/"',
            "schedule": f'"@every {EVERY}s"',
            "command": _command(tmp / f"{short}.log", body),
        }
        for short, body in bodies.items()
    }


@pytest.fixture(scope="module")
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("reload")
    uid = uuid.uuid4().hex[:8]
    spec_path = tmp / "locks.hcl"
    spec_path.write_text(spec_text(live_cluster, [WORKER], _jobs(tmp, uid)))
    with minted_workers(live_cluster, spec_path, [WORKER], tmp, uid, f"test/reload-{uid}/") as made:
        yield Lab(tmp, made, uid, live_cluster)


@pytest.fixture
def started() -> Iterator[list[SchedulerProcess]]:
    running: list[SchedulerProcess] = []
    yield running
    for scheduler in running:
        scheduler.kill()


def _eventually(check: Callable[[], Any], timeout: float = WAIT) -> Any:
    give_up_at = time.monotonic() + timeout
    while True:
        result = check()
        if result or time.monotonic() > give_up_at:
            return result
        time.sleep(0.1)


def _ran(scheduler: SchedulerProcess, job: str) -> list[dict[str, Any]]:
    return [e for e in scheduler.events("released") if e.get("job") == job]


def _no_traceback(scheduler: SchedulerProcess) -> None:
    assert not any("Traceback" in line for line in scheduler.lines), scheduler.lines


def test_a_token_consul_refuses_is_tick_failed_not_consul_unavailable(
    lab: Lab, started: list[SchedulerProcess]
) -> None:
    unknown = lab.tmp / "unknown.token"
    unknown.write_text(f"{uuid.uuid4()}\n")  # shaped like a secret; Consul knows no such token
    unknown.chmod(0o600)
    config = lab.write_config("refused", ["quick"], token_file=str(unknown))
    scheduler = SchedulerProcess(config)
    started.append(scheduler)
    failed = _eventually(lambda: scheduler.events("tick-failed"))
    assert failed, scheduler.lines
    assert failed[0]["error"].startswith("Consul refused the token: consul: "), failed
    assert "403" in failed[0]["error"], failed
    assert not scheduler.events("consul-unavailable"), scheduler.lines
    assert unknown.read_text().strip() not in "\n".join(scheduler.lines)
    assert scheduler.stop() == 0
    _no_traceback(scheduler)


@pytest.mark.parametrize("broken", ["token-missing", "token-empty", "ca-missing"])
def test_sighup_with_a_config_whose_files_cannot_work_is_refused_and_the_old_loops_go_on(
    lab: Lab, started: list[SchedulerProcess], broken: str
) -> None:
    config = lab.write_config(f"files-{broken}", ["quick"])
    good = config.read_text()
    scheduler = SchedulerProcess(config)
    started.append(scheduler)
    assert _eventually(lambda: _ran(scheduler, lab.job("quick"))), scheduler.lines
    bad_file = lab.tmp / f"{broken}.file"
    bad_file.unlink(missing_ok=True)
    if broken == "token-empty":
        bad_file.write_text("")
    key = "ca_file" if broken.startswith("ca") else "token_file"
    raw = json.loads(good)
    raw["consul"][key] = str(bad_file)
    config.write_text(json.dumps(raw))
    scheduler.process.send_signal(signal.SIGHUP)
    refused = _eventually(lambda: scheduler.events("reload-refused"))
    assert refused and str(bad_file) in refused[0]["error"], scheduler.lines
    if key == "ca_file":
        assert "consul.ca_file" in refused[0]["error"], refused
    ran_before = len(_ran(scheduler, lab.job("quick")))
    # the old loop goes on: two more ticks, its session kept, nothing reloaded, no exit
    assert _eventually(lambda: len(_ran(scheduler, lab.job("quick"))) >= ran_before + 2)
    assert scheduler.process.poll() is None, scheduler.lines
    assert not scheduler.events("reloaded") and not scheduler.events("session-destroyed")
    assert len(scheduler.events("session-created")) == 1, scheduler.lines
    assert scheduler.stop() == 0
    _no_traceback(scheduler)


def _starts(log: Path, after: float) -> list[float]:
    """When each run of the job's own log started, from `after` on (Unix time)."""
    lines = log.read_text().splitlines() if log.exists() else []
    times = [float(ln.split()[1]) for ln in lines if ln.endswith(" start")]
    return [t for t in times if t >= after]


def _run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LOCKCTL, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
