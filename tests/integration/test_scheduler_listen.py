"""`lockctl schedule --listen` on the real cluster: two schedulers on two workers (two client
agents) run an `@every 3s` job while their `/metrics` are scraped: the ticks they count match
the ledger's records, the `running` gauges never sum above 1, the last success advances and
`/healthz` is 200; then one scheduler's config points at a closed port (SIGHUP): its `/healthz`
turns 503 and `lockctl_consul_up` 0 while the other keeps running the ticks, and both come back
when the config does."""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from scheduler_lab import HOST, ListeningScheduler, Samples, free_port
from workers_lab import minted_workers

from provision.ledger.records import TickOutcome
from provision.ledger.store import Ledger
from provision.schedule import parse_schedule
from tests.lockctl_process import eventually

if TYPE_CHECKING:
    from conftest import LiveCluster


WORKERS = ("worker-1", "worker-2")
EVERY = 3
SCHEDULE = parse_schedule(f"@every {EVERY}s")
SLEEP = "1"  # long enough for scrapes to see it running
WAIT = 30.0
# Timings short enough for a test of a few ticks, inside the fencing bound
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
    tmp: Path
    configs: dict[str, Path]
    job: str
    key: str
    cluster: LiveCluster


def _spec_text(cluster: LiveCluster, uid: str, log: Path) -> str:
    line = 'echo "$LOCKCTL_TICK $LOCKCTL_WORKER $(date +%s.%N)'
    command = json.dumps(["/bin/sh", "-c", f'{line} start" >> {log}; sleep {SLEEP}'])
    lines = list(QUICK_DEFAULTS)
    for worker in WORKERS:
        lines += [f'worker "{worker}" {{', f'  address = "{cluster.address(worker)}"', "}"]
    lines += [
        f'job "listen-{uid}" {{',
        f'  prefix   = "test/listen-{uid}/"',
        f"  workers  = {json.dumps(list(WORKERS))}",
        f'  schedule = "@every {EVERY}s"',
        f"  command  = {command}",
        "}",
    ]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("listen")
    uid = uuid.uuid4().hex[:8]
    spec_path = tmp / "locks.hcl"
    spec_path.write_text(_spec_text(live_cluster, uid, tmp / "runs.log"))
    kv = f"test/listen-{uid}/"
    with minted_workers(live_cluster, spec_path, WORKERS, tmp, uid, kv) as made:
        yield Lab(tmp, made.configs, f"listen-{uid}", f"{kv}.lock", live_cluster)


class Scheduler(ListeningScheduler):
    """One replica, on a config of its own (a SIGHUP re-reads it)."""

    def __init__(self, lab: Lab, worker: str) -> None:
        self.worker = worker
        config = lab.tmp / f"{worker}.json"
        config.write_text(lab.configs[worker].read_text())
        super().__init__(config)

    def reconfigure(self, address: str) -> None:
        raw = json.loads(self.config.read_text())
        raw["consul"]["address"] = address
        self.config.write_text(json.dumps(raw))
        self.process.send_signal(signal.SIGHUP)


def _value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`."""
    return sum(
        value
        for (sample, sample_labels), value in samples.items()
        if sample == name and set(labels.items()) <= set(sample_labels)
    )


def _after_next_tick(seconds: float) -> None:
    tick = SCHEDULE.next_ticks(datetime.now(timezone.utc), 1)[0]
    time.sleep(max(0.0, tick.timestamp() - time.time() + seconds))


@pytest.fixture
def schedulers(lab: Lab) -> Iterator[list[Scheduler]]:
    started = [Scheduler(lab, worker) for worker in WORKERS]
    yield started
    for scheduler in started:
        scheduler.kill()


def test_metrics_match_the_ledger_and_healthz_follows_consul(
    lab: Lab, schedulers: list[Scheduler]
) -> None:
    one, two = schedulers
    for scheduler in schedulers:
        assert eventually(lambda s=scheduler: s.events("listening")), scheduler.lines
        # the listener binds before the job loops start: 503 until they run, then 200
        assert eventually(lambda s=scheduler: s.get("/healthz") == (200, "ok\n")), scheduler.lines
        assert scheduler.get("/other")[0] == 404

    # a few ticks, scraped every 0.2 s: never two replicas running at once
    _after_next_tick(0.2)
    scrapes: list[tuple[Samples, Samples]] = []
    until = time.monotonic() + 4 * EVERY
    while time.monotonic() < until:
        scrapes.append((one.scrape(), two.scrape()))
        time.sleep(0.2)
    running = [sum(_value(s, "lockctl_job_running") for s in pair) for pair in scrapes]
    assert max(running) == 1.0 and min(running) == 0.0, running  # seen running, never twice
    successes = [
        max(_value(s, "lockctl_job_last_success_timestamp_seconds") for s in pair)
        for pair in scrapes
    ]
    # the last success advances over the window (the first may still be running when it opens)
    seen = [value for value in successes if value > 0]
    assert seen and seen[-1] > seen[0], successes

    # between two ticks, every run over: the counters against the ledger
    _after_next_tick(float(SLEEP) + 1.0)
    final = {s.worker: s.scrape() for s in schedulers}
    records = Ledger(lab.cluster.management(), lab.key).records()
    assert records and all(r.outcome is TickOutcome.SUCCEEDED for r in records), records
    for worker, samples in final.items():
        ran = _value(samples, "lockctl_ticks_total", outcome="ran")
        assert ran == sum(1 for r in records if r.worker == worker), (worker, samples, records)
        skipped = _value(samples, "lockctl_ticks_total", outcome="skipped")
        assert _value(samples, "lockctl_skips_total") == skipped
        assert _value(samples, "lockctl_run_duration_seconds_count") == ran
        assert _value(samples, "lockctl_start_lag_seconds_count") == ran
        assert _value(samples, "lockctl_consul_up") == 1.0
    total_ran = sum(_value(s, "lockctl_ticks_total", outcome="ran") for s in final.values())
    assert total_ran == len(records)
    assert sum(_value(s, "lockctl_skips_total", reason="taken") for s in final.values()) > 0
    print(f"\n/metrics of {one.worker}:\n" + one.get("/metrics")[1])  # for docs/scheduler.md

    # Consul out of reach for one scheduler: 503 and consul_up 0; the other goes on
    before = _value(final[two.worker], "lockctl_ticks_total")
    scheme = lab.cluster.address(two.worker).split("://")[0]  # https with the TLS files
    two.reconfigure(f"{scheme}://{HOST}:{free_port()}")  # nothing listens there
    assert eventually(lambda: two.get("/healthz")[0] == 503), two.lines
    status, text = two.get("/healthz")
    assert status == 503
    assert text.startswith(f"{lab.job}: Consul did not answer its last request"), text
    assert text.count("\n") == 1
    print(f"/healthz of {two.worker}: {status} {text}")  # for docs/scheduler.md
    samples = two.scrape()
    assert _value(samples, "lockctl_consul_up") == 0.0
    assert _value(samples, "lockctl_ticks_total") >= before  # a reload keeps the counters
    assert one.get("/healthz") == (200, "ok\n")

    # and back
    two.reconfigure(lab.cluster.address(two.worker))
    assert eventually(lambda: two.get("/healthz") == (200, "ok\n")), two.lines
    assert _value(two.scrape(), "lockctl_consul_up") == 1.0
    assert (
        two.scrape()[("lockctl_ticks_total", _labels(lab.job, two.worker, "consul-unavailable"))]
        >= 1
    )

    for scheduler in schedulers:
        assert scheduler.stop() == 0
        assert not any("Traceback" in line for line in scheduler.lines), scheduler.lines
        with pytest.raises(OSError):  # the listener is gone with the scheduler
            urllib.request.urlopen(f"http://{HOST}:{scheduler.port}/healthz", timeout=2)


def _labels(job: str, worker: str, outcome: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"job": job, "worker": worker, "outcome": outcome}.items()))
