"""dashboards/lockctl.json against a real Prometheus: Prometheus (Debian's, as in
test_alerts_delivered.py, whose harness this reuses) scrapes three `lockctl schedule --listen`
replicas of two jobs on the real cluster every second, and every panel's every query, read from
the committed dashboard with the test's values for `$job` and `$__rate_interval`, answers series
with the labels named here for that panel. Then the test makes what the panels are for happen
and sees each panel that shows it change: a job that fails (run failures, the ticks and the age
since its last success), Consul out of every replica's reach (reachability, renew failures, the
ticks nobody ran: missed), and a pause (paused, skips by reason). Each replica reaches its agent
through a TCP relay of this test's, so the test can cut Consul off and mend it."""

from __future__ import annotations

import contextlib
import json
import math
import socket
import struct
import threading
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from scheduler_lab import ListeningScheduler
from test_alerts_delivered import Daemon, _address, _binary, _targets_up
from workers_lab import minted_workers, operator_command, spec_text

from provision.schedule import parse_schedule
from provision.system.control_keys import control_prefix
from tests.lockctl_process import eventually
from tests.subnets import TEST_SUBNET as SUBNET

if TYPE_CHECKING:
    from conftest import LiveCluster

pytestmark = pytest.mark.cluster

DASHBOARD = Path(__file__).resolve().parents[2] / "dashboards" / "lockctl.json"
WORKERS = ("worker-1", "worker-2", "worker-3")

PROMETHEUS_HOST = f"{SUBNET}.92"  # test_alerts_delivered's are .90 and .91
WINDOW = "20s"  # $__rate_interval: Grafana's is at least four scrape intervals (1 s here)
READY_WAIT = 60.0
WAIT = 60.0  # for a state the panels should reach within a few ticks and scrapes
EVERY = {"flaky": 2, "steady": 3}  # seconds: the jobs' `@every`
DEADLINE = 2  # seconds: their start_deadline (two claim turns: a slow first replica is no miss)
# Each panel's series, by its labels: the aggregation its queries end with.
LABELS = {
    "Age of the last success": {"job"},
    "Ticks since the last success": {"job"},
    "Ticks by outcome": {"job", "outcome"},
    "Skips by reason": {"job", "reason"},
    "Start lag": {"job"},
    "Run duration": {"job"},
    "Jobs running (at most one per job)": {"job"},
    "Run failures": {"job", "worker"},
    "Missed ticks": {"job"},
    "Renew failures": {"job", "worker"},
    "Consul reachability": {"worker"},
    "Schedules": {"job", "schedule", "timezone"},
    "Time to the next tick": {"job"},
    "Paused": {"job"},
    "Notifications not delivered": {"job", "notify", "result"},
}

Series = list[tuple[dict[str, str], float]]  # each series' labels and value


class Relay:
    """A TCP relay in front of one Consul agent, listening on the agent's own IP (which its TLS
    certificate names): `cut()` ends every connection and each new one at once, as a host cut
    off from its agent sees it; `mend()` relays again."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.server = socket.create_server((host, 0))
        self.server.settimeout(0.2)
        self.port = self.server.getsockname()[1]
        self.cut_off = threading.Event()
        self._closed = threading.Event()
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self.server.accept()
                upstream = None if self.cut_off.is_set() else self._connect()
            except OSError:
                continue  # the accept's timeout, to look at _closed again
            with self._lock:  # under the lock: a cut meanwhile ends this one too
                if upstream is None or self.cut_off.is_set():
                    _end(client, upstream)
                    continue
                self._open += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()

    def _connect(self) -> socket.socket | None:
        try:
            return socket.create_connection(self.upstream, timeout=5)
        except OSError:
            return None

    def cut(self) -> None:
        with self._lock:
            self.cut_off.set()
            ended, self._open = self._open, []
        _end(*ended)

    def mend(self) -> None:
        self.cut_off.clear()

    def close(self) -> None:
        self._closed.set()
        self._thread.join(5)
        self.server.close()
        self.cut()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        source.settimeout(None)
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)  # the end of one side's stream, passed on
    except OSError:
        _end(source, sink)  # cut, or one side went: both go


def _end(*connections: socket.socket | None) -> None:
    """End connections at once: shutdown wakes a pump blocked in recv (a bare close from
    another thread would not, and the connection would live on), the close resets."""
    for connection in connections:
        if connection is None:
            continue
        with contextlib.suppress(OSError):
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            connection.shutdown(socket.SHUT_RDWR)
        connection.close()


@dataclass
class Lab:
    cluster: LiveCluster
    spec_path: Path
    jobs: dict[str, str]  # "flaky", "steady" -> the job's name
    flag: Path  # while it exists, the flaky job's runs exit 1
    relays: list[Relay]
    schedulers: list[ListeningScheduler]
    prometheus: Daemon
    secrets: list[str] = field(default_factory=list, repr=False)  # never printed


def _start_prometheus(folder: Path, targets: list[str]) -> Daemon:
    """Prometheus scraping the schedulers every second, as docs/alerts.md says to (honor_labels)."""
    folder.mkdir()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "lockctl", "honor_labels": True, "static_configs": [{"targets": targets}]}
        ],
    }
    (folder / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    address = _address(PROMETHEUS_HOST)
    argv = [
        _binary("prometheus"),
        f"--config.file={folder / 'prometheus.yml'}",
        f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address={address}",
    ]
    return Daemon(argv, folder, address)


def _through_relay(config: Path, relay: Relay) -> None:
    """Point a worker config at the relay instead of its agent (same scheme and IP)."""
    raw = json.loads(config.read_text())
    address = urllib.parse.urlsplit(raw["consul"]["address"])
    raw["consul"]["address"] = f"{address.scheme}://{relay.upstream[0]}:{relay.port}"
    config.write_text(json.dumps(raw))


@pytest.fixture
def lab(live_cluster: LiveCluster, tmp_path: Path) -> Iterator[Lab]:
    uid = uuid.uuid4().hex[:8]
    kv = f"test/dashboard-{uid}/"
    flag = tmp_path / "fail"
    scripts = {"flaky": f"sleep 1; test ! -e {flag}", "steady": "true"}
    jobs = {kind: f"dash-{kind}-{uid}" for kind in EVERY}
    with socket.socket() as probe:  # a port nothing listens on: every ping fails to connect
        probe.bind((PROMETHEUS_HOST, 0))
        closed = probe.getsockname()[1]
    ping = tmp_path / "ping.url"
    ping.write_text(f"http://{PROMETHEUS_HOST}:{closed}/ping/{uuid.uuid4().hex}\n")
    ping.chmod(0o600)
    attributes = {
        jobs[kind]: {
            "prefix": f'"{kv}{kind}/"',
            "schedule": f'"@every {EVERY[kind]}s"',
            "start_deadline": f'"{DEADLINE}s"',
            "command": json.dumps(["/bin/sh", "-c", scripts[kind]]),
            "ping_url_file": f'"{ping}"',
        }
        for kind in EVERY
    }
    spec_path = tmp_path / "locks.hcl"
    spec_path.write_text(spec_text(live_cluster, WORKERS, attributes))
    relays: list[Relay] = []
    schedulers: list[ListeningScheduler] = []
    prometheus = None
    with minted_workers(live_cluster, spec_path, WORKERS, tmp_path, uid, kv) as made:
        try:
            for worker in WORKERS:
                agent = urllib.parse.urlsplit(live_cluster.address(worker))
                assert agent.hostname is not None and agent.port is not None
                relays.append(Relay(agent.hostname, agent.port))
                _through_relay(made.configs[worker], relays[-1])
                schedulers.append(ListeningScheduler(made.configs[worker]))
            for scheduler in schedulers:
                assert eventually(lambda s=scheduler: s.events("listening")), scheduler.lines
            targets = [f"127.0.0.1:{s.port}" for s in schedulers]
            prometheus = _start_prometheus(tmp_path / "prometheus", targets)
            assert eventually(prometheus.ready, READY_WAIT), prometheus.log.read_text()
            assert eventually(lambda: _targets_up(prometheus) == 3, READY_WAIT), prometheus.get(
                "/api/v1/targets"
            )
            yield Lab(
                live_cluster, spec_path, jobs, flag, relays, schedulers, prometheus, made.secrets
            )
        finally:
            if prometheus is not None:
                prometheus.stop()
            for scheduler in schedulers:
                scheduler.kill()
            for relay in relays:
                relay.close()
            for name in jobs.values():
                live_cluster.management().kv.delete(control_prefix(name), recurse=True)


class Panels:
    """The committed dashboard's panels, each query run through Prometheus's HTTP API with the
    test's values for the Grafana variables."""

    def __init__(self, prometheus: Daemon, jobs: list[str]) -> None:
        board = json.loads(DASHBOARD.read_text())
        self.panels = {p["title"]: p for p in board["panels"] if p["type"] != "row"}
        self.prometheus, self.jobs = prometheus, jobs

    def expr(self, target: dict[str, Any]) -> str:
        expr = str(target["expr"]).replace("$job", "|".join(self.jobs))
        expr = expr.replace("$__rate_interval", WINDOW)
        assert "$" not in expr, expr  # a variable the test does not know
        return expr

    def query(self, expr: str) -> list[dict[str, Any]]:
        status, text = self.prometheus.get(
            "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        )
        assert status == 200, (expr, text)
        answer = json.loads(text)
        assert answer["status"] == "success" and answer["data"]["resultType"] == "vector", answer
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def series(self, title: str) -> list[Series]:
        """Each of the panel's queries' series: (labels, value), NaN included."""
        return [
            [(s["metric"], float(s["value"][1])) for s in self.query(self.expr(target))]
            for target in self.panels[title]["targets"]
        ]

    def value(self, title: str, **labels: str) -> float:
        """The sum of the panel's values (every query, NaN left out) on series with `labels`."""
        return sum(
            value
            for found in self.series(title)
            for metric, value in found
            if not math.isnan(value) and labels.items() <= metric.items()
        )

    def problems(self, title: str) -> list[str]:
        """Why the panel does not show what it should yet: no series, or other labels."""
        wanted, problems = LABELS[title], []
        for target, found in zip(self.panels[title]["targets"], self.series(title), strict=True):
            where = f"{title} {target['refId']}"
            problems += [f"{where}: no series"] if not found else []
            problems += [f"{where}: labels {sorted(m)}" for m, _ in found if set(m) != wanted]
            if "job" in wanted and {m.get("job") for m, _ in found} != set(self.jobs):
                problems.append(f"{where}: jobs {sorted({m.get('job', '') for m, _ in found})}")
            if wanted == {"worker"} and {m["worker"] for m, _ in found} != set(WORKERS):
                problems.append(f"{where}: workers {sorted(m['worker'] for m, _ in found)}")
        return problems


def _until(check: Callable[[], bool], panels: Panels, title: str) -> None:
    """`check()` becomes true within WAIT; else the panel's series say what it showed."""
    assert eventually(check, WAIT, pause=0.5), (title, panels.series(title))


def test_every_panel_shows_the_replicas_and_changes_with_what_it_shows(lab: Lab) -> None:
    flaky, steady = lab.jobs["flaky"], lab.jobs["steady"]
    panels = Panels(lab.prometheus, [flaky, steady])
    assert set(panels.panels) == set(LABELS), "a panel without its labels named here"
    value = panels.value

    # 1. every query answers series with its panel's labels, for both jobs and three replicas
    shown = eventually(lambda: not [p for t in LABELS for p in panels.problems(t)], WAIT, 0.5)
    assert shown, [p for t in LABELS for p in panels.problems(t)]
    schedules = panels.series("Schedules")[0]
    assert sorted((m["job"], m["schedule"], m["timezone"], v) for m, v in schedules) == [
        (flaky, "@every 2s", "UTC", 1.0),
        (steady, "@every 3s", "UTC", 1.0),
    ]
    _show(panels, "Schedules")
    _next_ticks_are_ticks_and_move_on(panels, flaky)
    running = "Jobs running (at most one per job)"
    _until(lambda: value(running, job=flaky) == 1, panels, running)
    assert value("Paused") == 0
    undelivered = "Notifications not delivered"  # the pings' URL refuses: none gets through
    _until(
        lambda: value(undelivered, job=flaky, notify="ping", result="failed") > 0,
        panels,
        undelivered,
    )
    _show(panels, undelivered)

    # 2. a job failure: run failures, and the last success ages, for the flaky job only
    since = "Ticks since the last success"
    _until(lambda: value(since, job=flaky) == 0, panels, since)
    lab.flag.touch()
    _until(lambda: value("Run failures", job=flaky) > 0, panels, "Run failures")
    _until(lambda: value(since, job=flaky) >= 2, panels, since)
    age = "Age of the last success"
    _until(lambda: value(age, job=flaky) > 2 * EVERY["flaky"], panels, age)
    assert value("Run failures", job=steady) == 0
    _show(panels, "Run failures")
    _show(panels, since)
    lab.flag.unlink()
    _until(lambda: value(since, job=flaky) == 0, panels, since)

    # 3. Consul out of every replica's reach for longer than a tick of each job and its start
    # deadline: reachability drops, renewals fail, those ticks are counted missed once it is back
    reach = "Consul reachability"
    _until(lambda: value("Renew failures") == 0, panels, "Renew failures")
    _until(lambda: value("Missed ticks") == 0, panels, "Missed ticks")
    cut_at = datetime.now(timezone.utc)
    for relay in lab.relays:
        relay.cut()
    try:
        _until(lambda: all(_reachability(panels, w) == 0 for w in WORKERS), panels, reach)
        _until(lambda: value("Renew failures") > 0, panels, "Renew failures")
        assert eventually(lambda: _unrunnable_ticks_passed(cut_at), WAIT, 0.2)
        _show(panels, reach)
    finally:
        for relay in lab.relays:
            relay.mend()
    _until(lambda: all(_reachability(panels, w) == 1 for w in WORKERS), panels, reach)
    for job in (flaky, steady):
        _until(lambda j=job: value("Missed ticks", job=j) > 0, panels, "Missed ticks")
    _show(panels, "Renew failures")
    _show(panels, "Missed ticks")

    # 4. a pause: paused 1 and ticks skipped as paused, for that job only; resumed, 0
    paused = operator_command(lab.cluster, lab.spec_path, lab.secrets, "pause", flaky)
    assert paused.returncode == 0, paused.stderr
    _until(lambda: value("Paused", job=flaky) == 1, panels, "Paused")
    skips = "Skips by reason"
    _until(lambda: value(skips, job=flaky, reason="paused") > 0, panels, skips)
    assert value("Paused", job=steady) == 0
    assert value(skips, job=steady, reason="paused") == 0
    _show(panels, "Paused")
    resumed = operator_command(lab.cluster, lab.spec_path, lab.secrets, "resume", flaky)
    assert resumed.returncode == 0, resumed.stderr
    _until(lambda: value("Paused", job=flaky) == 0, panels, "Paused")

    for scheduler in lab.schedulers:
        assert scheduler.stop() == 0, scheduler.lines
        assert not any("Traceback" in line for line in scheduler.lines), scheduler.lines


def _reachability(panels: Panels, worker: str) -> float | None:
    found = [v for m, v in panels.series("Consul reachability")[0] if m["worker"] == worker]
    return found[0] if found else None


def _unrunnable_ticks_passed(cut_at: datetime) -> bool:
    """Whether, for each job, a tick that came a second or more after the cut has passed its
    start deadline: nobody could claim it, so it is missed (this host's clock is the agents')."""
    now = datetime.now(timezone.utc).timestamp()
    for every in EVERY.values():
        ticks = parse_schedule(f"@every {every}s").next_ticks(cut_at, 2)
        unrunnable = ticks[0] if ticks[0].timestamp() >= cut_at.timestamp() + 1 else ticks[1]
        if now < unrunnable.timestamp() + DEADLINE + 0.5:
            return False
    return True


def _next_ticks_are_ticks_and_move_on(panels: Panels, job: str) -> None:
    """The next tick of the flaky job is one of its schedule's (@every 2s: an even second) and
    moves on with time; the panel's query shows it less than an interval ahead at times."""
    raw = f'max by (job) (lockctl_job_next_tick_timestamp_seconds{{job="{job}"}})'
    first = [float(s["value"][1]) for s in panels.query(raw)]
    assert len(first) == 1 and first[0] % EVERY["flaky"] == 0, first
    assert eventually(lambda: float(panels.query(raw)[0]["value"][1]) > first[0], WAIT, 0.5)
    title = "Time to the next tick"
    _until(lambda: 0 <= panels.value(title, job=job) <= EVERY["flaky"], panels, title)


def _show(panels: Panels, title: str) -> None:
    """A panel's queries and what Prometheus answered, a series a line (docs/dashboard.md)."""
    for target in panels.panels[title]["targets"]:
        expr = panels.expr(target)
        print(f"\n{title} ({target['refId']}): {expr}")
        for series in sorted(panels.query(expr), key=lambda s: sorted(s["metric"].items())):
            labels = ", ".join(f'{k}="{v}"' for k, v in sorted(series["metric"].items()))
            print(f"  {{{labels}}}  {series['value'][1]}")
