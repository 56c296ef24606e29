"""HTTP jobs on the real cluster (issue 22, items 3 and 4): three `lockctl schedule` replicas,
each calling its own local app (an http.server in this process on its own loopback address),
send exactly one request per tick over all the apps, with the tick, an increasing fencing token
and the deadline in the headers; a 500 and an app that is down give `failed` with the reason in
the record and in `history`; a request that hangs past its timeout is aborted as `timed-out`;
a lost lock aborts the request and the record says `lost`; `lockctl run` calls the app too."""

from __future__ import annotations

import json
import socket
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from http_apps import App, Request, start_app
from scheduler_lab import SchedulerProcess
from workers_lab import minted_workers, spec_text

from provision.ledger.records import TickOutcome, TickRecord, parse_tick_name, tick_name
from provision.ledger.store import Ledger
from tests.conftest import TEST_SUBNET
from tests.lockctl_process import eventually, run_lockctl

if TYPE_CHECKING:
    from conftest import LiveCluster

WORKERS = ("worker-1", "worker-2", "worker-3")
APP_HOSTS = {worker: f"{TEST_SUBNET}.{201 + n}" for n, worker in enumerate(WORKERS)}
# short name -> (schedule, the app's path, http.timeout)
JOBS = {
    "each": ("@every 2s", "/ok", "1s"),
    "fail": ("@every 2s", "/fail", "1s"),
    "down": ("@every 2s", "/ok", "1s"),  # its URL names a port nobody listens on
    "hang": ("@every 5s", "/hang", "2s"),
    "lost": ("@every 30s", "/hang", "20s"),
    "manual": (None, "/ok", "5s"),  # for `lockctl run`
}
TICKS = 6  # ticks of `each` watched
WAIT = 60.0
HEADERS = ("X-Lockctl-Tick", "X-Lockctl-Lock-Index", "X-Lockctl-Deadline", "X-Lockctl-Job")


@dataclass(frozen=True)
class Lab:
    tmp: Path
    configs: dict[str, Path]
    jobs: dict[str, str]
    keys: dict[str, str]
    apps: dict[str, App]
    cluster: LiveCluster
    secrets: list[str]


def _spec(cluster: LiveCluster, uid: str) -> str:
    jobs = {}
    for short, (schedule, path, timeout) in JOBS.items():
        # the spec's URL is the app's on worker-1; each worker's config is pointed at its own
        url = f"http://{APP_HOSTS['worker-1']}:1{path}"
        attributes = {"prefix": f'"test/http-{uid}/{short}/"'}
        if schedule:
            attributes["schedule"] = json.dumps(schedule)
        attributes["http"] = (
            f"{{\n    url = {json.dumps(url)}\n    timeout = {json.dumps(timeout)}\n  }}"
        )
        jobs[f"{short}-{uid}"] = attributes
    return spec_text(cluster, WORKERS, jobs).replace("  http = {", "  http {")


@pytest.fixture(scope="module")
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("http")
    uid = uuid.uuid4().hex[:8]
    spec_path = tmp / "locks.hcl"
    spec_path.write_text(_spec(live_cluster, uid))
    kv = f"test/http-{uid}/"
    apps = {worker: start_app(host) for worker, host in APP_HOSTS.items()}
    try:
        with minted_workers(live_cluster, spec_path, WORKERS, tmp, uid, kv) as made:
            yield Lab(
                tmp,
                made.configs,
                {short: f"{short}-{uid}" for short in JOBS},
                {short: f"{kv}{short}/.lock" for short in JOBS},
                apps,
                live_cluster,
                made.secrets,
            )
    finally:
        for app in apps.values():
            app.stop()


def _config(lab: Lab, worker: str, *shorts: str, down: bool = False) -> Path:
    """The worker's config with only these jobs, each calling this worker's own app (`down`:
    a port of the app's address that nobody listens on)."""
    raw = json.loads(lab.configs[worker].read_text())
    app, jobs = lab.apps[worker], {}
    for short in shorts:
        job = raw["jobs"][lab.jobs[short]]
        path = JOBS[short][1]
        port = free_port_on(app.host) if down else app.port
        job["http"]["url"] = f"http://{app.host}:{port}{path}"
        jobs[lab.jobs[short]] = job
    raw["jobs"] = jobs
    path = lab.tmp / f"{worker}-{'-'.join(shorts)}.json"
    path.write_text(json.dumps(raw))
    return path


def free_port_on(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _tick(name: str) -> datetime:
    tick = parse_tick_name(name)
    assert tick is not None, name
    return tick


def _records(lab: Lab, short: str) -> dict[datetime, TickRecord]:
    ledger = Ledger(lab.cluster.management(), lab.keys[short])
    return {r.tick: r for r in ledger.records() if r.finished}


def _history(lab: Lab, short: str, *tick: str) -> str:
    connection = ["--address", lab.cluster.address("server-1")]
    connection += ["--token-file", str(lab.cluster.layout.management_token_file)]
    flags = ["--spec", str(lab.tmp / "locks.hcl"), *connection, *lab.cluster.tls_flags()]
    asked = ["history", "--job", lab.jobs[short], *(["--tick", *tick] if tick else [])]
    result = run_lockctl(*asked, *flags, drop=("CONSUL_",))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    print(f"\nlockctl {' '.join(asked)}\n{result.stdout[:2000]}")  # for the docs
    return result.stdout


def _no_secret_sent(lab: Lab) -> None:
    for app in lab.apps.values():
        for request in app.requests:
            assert (
                "Authorization" not in request.headers and "X-Consul-Token" not in request.headers
            )
            for secret in lab.secrets:
                assert secret not in json.dumps(request.headers)


def test_three_replicas_send_one_request_per_tick_over_all_apps(lab: Lab) -> None:
    replicas = [SchedulerProcess(_config(lab, worker, "each")) for worker in WORKERS]
    try:
        job = lab.jobs["each"]

        def requests() -> list[tuple[str, dict[str, str]]]:
            return [(w, r.headers) for w, app in lab.apps.items() for r in app.got("/ok")]

        def ticks_done() -> int:
            return len(
                {h["X-Lockctl-Tick"] for _, h in requests() if h.get("X-Lockctl-Job") == job}
            )

        assert eventually(lambda: ticks_done() >= TICKS, WAIT), [r.lines for r in replicas]
        for replica in replicas:
            assert replica.stop() == 0
    finally:
        for replica in replicas:
            replica.kill()
    ours = [(w, h) for w, h in requests() if h.get("X-Lockctl-Job") == job]
    per_tick = Counter(h["X-Lockctl-Tick"] for _, h in ours)
    assert set(per_tick.values()) == {1}, per_tick  # exactly one request each tick, over all
    for worker, headers in ours:
        assert all(name in headers for name in HEADERS), headers
        assert headers["X-Lockctl-Worker"] == worker  # each replica called its own app
        tick = _tick(headers["X-Lockctl-Tick"])
        deadline = datetime.fromisoformat(headers["X-Lockctl-Deadline"].replace("Z", "+00:00"))
        assert 0 < (deadline - tick).total_seconds() < 60
    in_order = sorted(ours, key=lambda item: item[1]["X-Lockctl-Tick"])
    tokens = [int(h["X-Lockctl-Lock-Index"]) for _, h in in_order]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), tokens  # increasing
    records = _records(lab, "each")
    for _, headers in ours:
        record = records[_tick(headers["X-Lockctl-Tick"])]
        assert record.outcome is TickOutcome.SUCCEEDED, record
        assert record.lock_index == int(headers["X-Lockctl-Lock-Index"])
        assert record.stdout == "refreshed\n" and record.stderr == "HTTP 200 OK"
    _no_secret_sent(lab)


def test_a_500_and_an_app_that_is_down_fail_with_the_reason(lab: Lab) -> None:
    replicas = [
        SchedulerProcess(_config(lab, "worker-1", "fail")),
        SchedulerProcess(_config(lab, "worker-2", "down", down=True)),
    ]
    try:
        assert eventually(lambda: _records(lab, "fail") and _records(lab, "down"), WAIT), [
            r.lines for r in replicas
        ]
        for replica in replicas:
            assert replica.stop() == 0
    finally:
        for replica in replicas:
            replica.kill()
    failed = next(iter(_records(lab, "fail").values()))
    assert failed.outcome is TickOutcome.FAILED and failed.exit_status == 1, failed
    assert failed.stderr == "HTTP 500 Internal Server Error" and failed.stdout == "db is down\n"
    down = next(iter(_records(lab, "down").values()))
    assert down.outcome is TickOutcome.FAILED and down.exit_status == 1, down
    assert down.stderr is not None and "Connection refused" in down.stderr, down
    assert "failed" in _history(lab, "fail")
    assert "HTTP 500 Internal Server Error" in _history(lab, "fail", tick_name(failed.tick))
    assert "Connection refused" in _history(lab, "down", tick_name(down.tick))
    events = [e for r in replicas for e in r.events()]
    assert not any("Traceback" in line for r in replicas for line in r.lines)
    assert any(e["event"] == "released" and e.get("child_status") == 1 for e in events)


def test_a_request_past_its_timeout_is_aborted_as_timed_out(lab: Lab) -> None:
    replica = SchedulerProcess(_config(lab, "worker-3", "hang"))
    app = lab.apps["worker-3"]
    job = lab.jobs["hang"]
    try:
        assert eventually(lambda: _records(lab, "hang"), WAIT), replica.lines
        assert replica.stop() == 0
    finally:
        replica.kill()
    record = next(iter(_records(lab, "hang").values()))
    assert record.outcome is TickOutcome.TIMED_OUT and record.exit_status == 143, record
    assert record.stderr == "aborted: the request was cut off by lockctl"
    hung = [r for r in app.got("/hang") if r.headers.get("X-Lockctl-Job") == job]
    assert eventually(lambda: hung[0].aborted_after is not None, 10)
    aborted_after = hung[0].aborted_after
    # aborted at the 2s timeout by the supervisor, not by the socket's own (2s + 5s slack)
    assert aborted_after is not None and 1.5 <= aborted_after < 7, aborted_after
    assert [e for e in replica.events("timed-out") if e.get("job") == job]


def test_a_lost_lock_aborts_the_request_and_the_record_says_lost(lab: Lab) -> None:
    replica = SchedulerProcess(_config(lab, "worker-1", "lost"))
    app = lab.apps["worker-1"]
    job = lab.jobs["lost"]
    try:
        assert eventually(lambda: replica.events("acquired"), WAIT), replica.lines
        acquired = replica.events("acquired")[0]
        assert eventually(lambda: app.got("/hang") and _hung(app, job), WAIT)
        lab.cluster.management().session.destroy(acquired["session"])
        assert eventually(lambda: _hung(app, job)[0].aborted_after is not None, WAIT)
        assert eventually(lambda: _records(lab, "lost"), WAIT), replica.lines
        assert replica.stop() == 0
    finally:
        replica.kill()
    aborted_after = _hung(app, job)[0].aborted_after
    assert aborted_after is not None and aborted_after < 15  # well before its 20s timeout
    record = _records(lab, "lost")[_tick(acquired["tick"])]
    assert record.outcome is TickOutcome.LOST and record.exit_status == 143, record
    assert replica.events("fenced") and replica.events("lost")


def _hung(app: App, job: str) -> list[Request]:
    return [r for r in app.got("/hang") if r.headers.get("X-Lockctl-Job") == job]


def test_lockctl_run_calls_the_app_of_an_http_job(lab: Lab) -> None:
    config = _config(lab, "worker-2", "manual")
    job = lab.jobs["manual"]
    app = lab.apps["worker-2"]
    before = len(app.got("/ok"))
    result = run_lockctl("run", "--config", str(config), "--job", job, drop=("CONSUL_",))
    print(f"\nlockctl run --job {job}: exit {result.returncode}\n{result.stderr[-3000:]}")
    assert result.returncode == 0, result.stderr
    got = [r for r in app.got("/ok")[before:] if r.headers.get("X-Lockctl-Job") == job]
    assert len(got) == 1 and got[0].method == "POST", got
    assert "X-Lockctl-Tick" not in got[0].headers  # a job without a schedule has no tick
    assert int(got[0].headers["X-Lockctl-Lock-Index"]) > 0
    # a command for an HTTP job is refused, before any lock
    refused = run_lockctl(
        "run", "--config", str(config), "--job", job, "--", "/bin/true", drop=("CONSUL_",)
    )
    assert refused.returncode == 2 and "is an HTTP job" in refused.stderr, refused.stderr
    assert "Traceback" not in result.stderr + refused.stderr
