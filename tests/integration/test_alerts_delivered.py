"""The alerting rules end to end, with the ecosystem's own parts: a real Prometheus scrapes three
`lockctl schedule --listen` replicas of two jobs on the real cluster and evaluates
alerts/lockctl.rules.yml; a real Alertmanager delivers to a webhook in this test. The job that
fails every run reaches the webhook as LockctlRunFailed and LockctlNoSuccess within a bounded
wait; the job that succeeds never as LockctlRunFailed. Prometheus and Alertmanager are Debian's
(scripts/install-test-packages), started here on ports of the test's subnet, each with its own
data folder, and stopped by PID. And the ticks nobody ran while every replica was stopped are
counted (lockctl_missed_ticks_recorded_total, for LockctlTickMissed) once one is back."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from scheduler_lab import ListeningScheduler, Samples
from workers_lab import minted_workers, spec_text

from provision.ledger.records import TickOutcome
from provision.ledger.store import Ledger
from provision.schedule import parse_schedule
from tests.lockctl_process import eventually
from tests.subnets import TEST_SUBNET as SUBNET

if TYPE_CHECKING:
    from conftest import LiveCluster

pytestmark = pytest.mark.cluster

RULES = Path(__file__).resolve().parents[2] / "alerts" / "lockctl.rules.yml"
WORKERS = ("worker-1", "worker-2", "worker-3")

PROMETHEUS_HOST, ALERTMANAGER_HOST = f"{SUBNET}.90", f"{SUBNET}.91"
DELIVERY_WAIT = 180.0  # seconds: scrapes and evaluations every second, group_wait 1 s
READY_WAIT = 60.0
HOUSEKEEPING_WAIT = 60.0  # a restarted scheduler housekeeps once its first tick's window closes


class Webhook:
    """Alertmanager's webhook receiver: every notification's JSON body, kept in order."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        received = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                received.append(json.loads(self.rfile.read(length)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: pytest shows what the test prints, not every request."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def alerts(self) -> list[dict[str, Any]]:
        return [alert for body in list(self.bodies) for alert in body["alerts"]]

    def firing(self, alertname: str, job: str) -> list[dict[str, Any]]:
        return [
            a
            for a in self.alerts()
            if a["status"] == "firing"
            and a["labels"].get("alertname") == alertname
            and a["labels"].get("job") == job
        ]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Daemon:
    """A Prometheus or an Alertmanager of the test's own: its log and data in `folder`."""

    def __init__(self, argv: list[str], folder: Path, address: str) -> None:
        self.address, self.log = address, folder / "log"
        with self.log.open("w") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://{self.address}{path}", timeout=5) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()
        except OSError as error:  # not listening yet
            return 0, str(error)

    def ready(self) -> bool:
        assert self.process.poll() is None, self.log.read_text()
        return self.get("/-/ready")[0] == 200

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)


def _address(host: str) -> str:
    """`host:port` with a port free on `host` now."""
    import socket

    with socket.socket() as probe:
        probe.bind((host, 0))
        return f"{host}:{probe.getsockname()[1]}"


def _binary(name: str) -> str:
    found = shutil.which(name)
    assert found, f"{name} not found: scripts/install-test-packages installs it (root)"
    return found


def start_alertmanager(folder: Path, webhook: Webhook) -> Daemon:
    folder.mkdir()
    config = {
        "route": {
            "receiver": "webhook",
            "group_by": ["alertname", "job"],
            "group_wait": "1s",
            "group_interval": "1s",
            "repeat_interval": "1h",
        },
        "receivers": [{"name": "webhook", "webhook_configs": [{"url": webhook.url}]}],
    }
    (folder / "alertmanager.yml").write_text(json.dumps(config))  # JSON is YAML
    address = _address(ALERTMANAGER_HOST)
    argv = [
        _binary("prometheus-alertmanager"),
        f"--config.file={folder / 'alertmanager.yml'}",
        f"--storage.path={folder / 'data'}",
        f"--web.listen-address={address}",
        "--cluster.listen-address=",  # no gossip with other Alertmanagers
    ]
    return Daemon(argv, folder, address)


def start_prometheus(folder: Path, targets: list[str], alertmanager: Daemon) -> Daemon:
    folder.mkdir()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager.address]}]}]},
        "scrape_configs": [
            {
                "job_name": "lockctl",
                "honor_labels": True,  # the series' own `job` label is the lockctl job's
                "static_configs": [{"targets": targets}],
            }
        ],
    }
    (folder / "prometheus.yml").write_text(json.dumps(config))
    address = _address(PROMETHEUS_HOST)
    argv = [
        _binary("prometheus"),
        f"--config.file={folder / 'prometheus.yml'}",
        f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address={address}",
        f"--web.external-url=http://{address}/",  # the alerts' links: not the machine's name
    ]
    return Daemon(argv, folder, address)


@pytest.fixture
def replicas(live_cluster: LiveCluster, tmp_path: Path) -> Iterator[tuple[str, str, list[str]]]:
    """Three schedulers of two `@every 2s` jobs: `failing-UID` exits 3, `ok-UID` exits 0.
    Yields both job names and the schedulers' `host:port`s."""
    uid = uuid.uuid4().hex[:8]
    kv = f"test/alerts-{uid}/"
    jobs = {
        f"failing-{uid}": {"prefix": f'"{kv}failing/"', "command": '["/bin/sh", "-c", "exit 3"]'},
        f"ok-{uid}": {"prefix": f'"{kv}ok/"', "command": '["/bin/sh", "-c", "true"]'},
    }
    for attributes in jobs.values():
        attributes["schedule"] = '"@every 2s"'
    spec_path = tmp_path / "locks.hcl"
    spec_path.write_text(spec_text(live_cluster, WORKERS, jobs))
    with minted_workers(live_cluster, spec_path, WORKERS, tmp_path, uid, kv) as made:
        started = [ListeningScheduler(made.configs[worker]) for worker in WORKERS]
        try:
            for scheduler in started:
                assert eventually(lambda s=scheduler: s.events("listening")), scheduler.lines
            yield f"failing-{uid}", f"ok-{uid}", [f"127.0.0.1:{s.port}" for s in started]
        finally:
            for scheduler in started:
                scheduler.kill()


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    receiver = Webhook()
    yield receiver
    receiver.close()


def test_a_failing_job_reaches_the_webhook(
    replicas: tuple[str, str, list[str]], webhook: Webhook, tmp_path: Path
) -> None:
    failing, ok, targets = replicas
    alertmanager = start_alertmanager(tmp_path / "alertmanager", webhook)
    prometheus = None
    try:
        assert eventually(alertmanager.ready, READY_WAIT), alertmanager.log.read_text()
        prometheus = start_prometheus(tmp_path / "prometheus", targets, alertmanager)
        assert eventually(prometheus.ready, READY_WAIT), prometheus.log.read_text()
        started = time.monotonic()

        assert eventually(lambda: _targets_up(prometheus) == len(targets)), prometheus.get(
            "/api/v1/targets"
        )
        delivered = eventually(lambda: webhook.firing("LockctlRunFailed", failing), DELIVERY_WAIT)
        assert delivered, (webhook.alerts(), prometheus.get("/api/v1/alerts"))
        took = time.monotonic() - started
        assert eventually(lambda: webhook.firing("LockctlNoSuccess", failing), DELIVERY_WAIT), (
            webhook.alerts(),
            prometheus.get("/api/v1/alerts"),
        )
        alert = delivered[0]
        assert alert["labels"]["severity"] == "warning"
        assert alert["labels"]["worker"] in WORKERS
        assert alert["annotations"]["summary"].startswith(f"lockctl job {failing}: a run failed")
        assert not webhook.firing("LockctlRunFailed", ok), webhook.alerts()
        shown = _series(targets[0], ("lockctl_run_failures_total", "lockctl_ticks_since_success"))
        assert any(failing in line for line in shown), shown
        print("\n".join(shown))  # for docs/alerts.md
        print(f"\nLockctlRunFailed delivered {took:.1f} s after Prometheus was ready:")
        print(json.dumps(alert, indent=2, sort_keys=True))  # for docs/alerts.md
    finally:
        if prometheus is not None:
            prometheus.stop()
        alertmanager.stop()


def _targets_up(prometheus: Daemon) -> int:
    status, text = prometheus.get("/api/v1/targets")
    if status != 200:
        return 0
    active = json.loads(text)["data"]["activeTargets"]
    return sum(1 for target in active if target["health"] == "up")


def _series(target: str, names: tuple[str, ...]) -> list[str]:
    """The lines of a scheduler's /metrics for these names (samples only)."""
    with urllib.request.urlopen(f"http://{target}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return [line for line in text.splitlines() if line.startswith(names)]


def test_ticks_nobody_ran_are_counted_when_recorded_missed(
    live_cluster: LiveCluster, tmp_path: Path
) -> None:
    uid = uuid.uuid4().hex[:8]
    kv = f"test/outage-{uid}/"
    job = {
        "prefix": f'"{kv}"',
        "schedule": '"@every 2s"',
        "start_deadline": '"1s"',
        "command": '["/bin/sh", "-c", "true"]',
    }
    spec_path = tmp_path / "locks.hcl"
    spec_path.write_text(spec_text(live_cluster, WORKERS[:1], {f"outage-{uid}": job}))
    with minted_workers(live_cluster, spec_path, WORKERS[:1], tmp_path, uid, kv) as made:
        config = made.configs[WORKERS[0]]
        first = ListeningScheduler(config)
        try:
            assert eventually(lambda: first.events("listening")), first.lines
            assert eventually(lambda: _sum(first, "lockctl_ticks_total", "ran") >= 1), first.lines
        finally:
            assert first.stop() == 0, first.lines
        # the outage: every replica stopped while three ticks pass their start deadline
        ticks = parse_schedule("@every 2s").next_ticks(datetime.now(timezone.utc), 3)
        time.sleep(max(0.0, ticks[-1].timestamp() + 1.5 - time.time()))
        back = ListeningScheduler(config)
        try:
            assert eventually(lambda: back.events("listening")), back.lines

            # The ticks of the outage, counted either way: recorded missed by housekeeping, or
            # (the last, when the start took longer than what was left of its deadline) found
            # too late by the loop itself (LockctlTickMissed alerts on both).
            def counted() -> float:
                found = _sum(back, "lockctl_missed_ticks_recorded_total")
                return found + _sum(back, "lockctl_ticks_total", "missed")

            assert eventually(lambda: counted() >= 3, HOUSEKEEPING_WAIT), back.lines
            # every record the counter says this scheduler wrote is in the ledger (a tick found
            # too late and then recorded missed by the same replica is in both views: the
            # ledger is held to the records alone)
            written = _sum(back, "lockctl_missed_ticks_recorded_total")
            missed = [
                r
                for r in Ledger(live_cluster.management(), f"{kv}.lock").records()
                if r.outcome is TickOutcome.MISSED
            ]
            assert len(missed) >= written >= 3, (missed, back.lines)
        finally:
            assert back.stop() == 0, back.lines


def _sum(scheduler: ListeningScheduler, name: str, outcome: str | None = None) -> float:
    samples: Samples = scheduler.scrape()
    return sum(
        value
        for (sample, labels), value in samples.items()
        if sample == name and (outcome is None or ("outcome", outcome) in labels)
    )
