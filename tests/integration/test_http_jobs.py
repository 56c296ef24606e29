"""HTTP jobs on the real cluster (issue 22, items 3 and 4): three `lockctl schedule` replicas,
each calling its own local app (an http.server in this process on its own loopback address),
send exactly one request per tick over all the apps, with the tick, an increasing fencing token
and the deadline in the headers; a 500 and an app that is down give `failed` with the reason in
the record and in `history`; a request that hangs past its timeout is aborted as `timed-out`;
a lost lock aborts the request and the record says `lost`; `lockctl run` calls the app too.

HTTP attempts never overlap (the HTTP-jobs issue, item A): retry_on_timeout on an HTTP job is
refused by the spec and by `lockctl schedule` loading a worker config; a 4 s handler with a 2 s
timeout gets one request per tick; a handler answering 503 is retried, each attempt after the
previous handler finished, with X-Lockctl-Attempt 1, 2, 3 and one Idempotency-Key per run, a new
one per tick and per trigger; a lost lock sends no further attempt."""

from __future__ import annotations

import itertools
import json
import re
import socket
import subprocess
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from http_apps import App, Request, start_app
from scheduler_lab import SchedulerProcess
from workers_lab import minted_workers, operator_command, spec_text

from provision.ledger.records import TickOutcome, TickRecord, parse_tick_name, tick_name
from provision.ledger.store import Ledger
from provision.system.control_keys import control_prefix
from tests.lockctl_process import eventually, run_lockctl
from tests.subnets import TEST_SUBNET

if TYPE_CHECKING:
    from conftest import LiveCluster

WORKERS = ("worker-1", "worker-2", "worker-3")


def _twelve_hours_away() -> str:
    """A daily cron schedule (UTC) whose tick is 12 h from now: only a trigger runs it."""
    now = datetime.now(timezone.utc)
    return f"{now.minute} {(now.hour + 12) % 24} * * *"


APP_HOSTS = {worker: f"{TEST_SUBNET}.{201 + n}" for n, worker in enumerate(WORKERS)}
# short name -> (schedule, the app's path, http.timeout)
JOBS = {
    "each": ("@every 2s", "/ok", "1s"),
    "fail": ("@every 2s", "/fail", "1s"),
    "down": ("@every 2s", "/ok", "1s"),  # its URL names a port nobody listens on
    "hang": ("@every 5s", "/hang", "2s"),
    "lost": ("@every 30s", "/hang", "20s"),
    "manual": (None, "/ok", "5s"),  # for `lockctl run`
    "slow": ("@every 10s", "/slow", "2s"),  # a 4 s handler
    "busy": ("@every 10s", "/busy", "3s"),  # 503 after 1 s
    "trig": (_twelve_hours_away(), "/ok", "5s"),  # run by `lockctl trigger` only
}
# the jobs' other attributes (HCL source): retries, and never retry_on_timeout (refused)
RETRIES = {
    "lost": {"retries": "2"},
    "slow": {"retries": "2", "retry_delay": '"0s"'},
    "busy": {"retries": "2", "retry_delay": '"0s"'},
}
TICKS = 6  # ticks of `each` watched
WAIT = 60.0
HEADERS = (
    "X-Lockctl-Tick",
    "X-Lockctl-Lock-Index",
    "X-Lockctl-Deadline",
    "X-Lockctl-Job",
    "X-Lockctl-Attempt",
    "Idempotency-Key",
)


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
        attributes = {"prefix": f'"test/http-{uid}/{short}/"', **RETRIES.get(short, {})}
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
        live_cluster.management().kv.delete(control_prefix(f"trig-{uid}"), recurse=True)
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

        def settled() -> bool:
            """TICKS ticks called and each one's record finished: no call is in flight now,
            so the stop below (the next tick is 2 s away) cuts no answer off."""
            called = {h["X-Lockctl-Tick"] for _, h in requests() if h.get("X-Lockctl-Job") == job}
            finished = {tick_name(tick) for tick in _records(lab, "each")}
            return len(called) >= TICKS and called <= finished

        assert eventually(settled, WAIT), [r.lines for r in replicas]
        for replica in replicas:
            assert replica.stop() == 0
    finally:
        for replica in replicas:
            replica.kill()
    ours = [(w, h) for w, h in requests() if h.get("X-Lockctl-Job") == job]
    newest = max(h["X-Lockctl-Tick"] for _, h in ours)
    per_tick = Counter(h["X-Lockctl-Tick"] for _, h in ours)
    assert set(per_tick.values()) == {1}, per_tick  # exactly one request each tick, over all
    for worker, headers in ours:
        assert all(name in headers for name in HEADERS), headers
        assert headers["X-Lockctl-Worker"] == worker  # each replica called its own app
        assert headers["X-Lockctl-Attempt"] == "1"
        assert headers["Idempotency-Key"] == f'"lockctl:{job}:{headers["X-Lockctl-Tick"]}"'
        tick = _tick(headers["X-Lockctl-Tick"])
        deadline = datetime.fromisoformat(headers["X-Lockctl-Deadline"].replace("Z", "+00:00"))
        assert 0 < (deadline - tick).total_seconds() < 60
    in_order = sorted(ours, key=lambda item: item[1]["X-Lockctl-Tick"])
    tokens = [int(h["X-Lockctl-Lock-Index"]) for _, h in in_order]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), tokens  # increasing
    records = _records(lab, "each")
    for _, headers in ours:
        record = records[_tick(headers["X-Lockctl-Tick"])]
        if record.outcome is TickOutcome.INTERRUPTED and headers["X-Lockctl-Tick"] == newest:
            # a loaded machine's stop came after the next tick's call began: cut off, said so
            assert record.stderr == "aborted: the request was cut off by lockctl", record
            continue
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
    # retries = 2, yet a lost lock sends no further attempt (the record is complete: the run
    # is over, so none can come later either)
    sent = [r for r in _hung(app, job) if r.headers["X-Lockctl-Tick"] == acquired["tick"]]
    assert [r.headers["X-Lockctl-Attempt"] for r in sent] == ["1"], sent
    assert record.attempts is None and not replica.events("retrying"), record


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
    # no tick: the run is named by the lock's ModifyIndex when acquired
    assert re.fullmatch(f'"lockctl:{job}:lock:[0-9]+"', got[0].headers["Idempotency-Key"])
    assert got[0].headers["X-Lockctl-Attempt"] == "1"
    # a command for an HTTP job is refused, before any lock
    refused = run_lockctl(
        "run", "--config", str(config), "--job", job, "--", "/bin/true", drop=("CONSUL_",)
    )
    assert refused.returncode == 2 and "is an HTTP job" in refused.stderr, refused.stderr
    assert "Traceback" not in result.stderr + refused.stderr


# --- HTTP attempts never overlap -----------------------------------------------------------------

REFUSED_SPEC = """worker "worker-1" {}
job "slow" {
  prefix           = "test/refused/"
  workers          = ["worker-1"]
  schedule         = "@every 1m"
  retries          = 2
  retry_on_timeout = true
  http {
    url     = "http://127.0.0.1:8080/jobs/slow"
    timeout = "2s"
  }
}
"""


def test_retry_on_timeout_is_refused_by_the_spec_and_the_worker_config(lab: Lab) -> None:
    spec = lab.tmp / "refused.hcl"
    spec.write_text(REFUSED_SPEC)
    refused = run_lockctl("render", "--spec", str(spec), "--out", str(lab.tmp / "refused-out"))
    print(f"\n$ lockctl render --spec refused.hcl\n{refused.stderr}")  # for the docs
    assert refused.returncode == 2 and "1 problem" in refused.stderr, refused.stderr
    assert (
        f'{spec}:7: job "slow".retry_on_timeout: true is refused for an HTTP job: an HTTP '
        "handler cannot be stopped" in refused.stderr
    )
    assert not (lab.tmp / "refused-out").exists() and "Traceback" not in refused.stderr

    # a worker config that carries it (hand-edited, or written before the rule): refused at
    # load, before any session or request
    config = _config(lab, "worker-3", "slow")
    raw = json.loads(config.read_text())
    raw["jobs"][lab.jobs["slow"]]["retry_on_timeout"] = True
    config.write_text(json.dumps(raw))
    app, before = lab.apps["worker-3"], len(lab.apps["worker-3"].got("/slow"))
    for command in (["schedule"], ["run", "--job", lab.jobs["slow"]]):
        result = run_lockctl(*command, "--config", str(config), drop=("CONSUL_",))
        print(f"\n$ lockctl {' '.join(command)} --config {config.name}\n{result.stderr}")
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
        assert (
            f"{config}: jobs.{lab.jobs['slow']}.retry_on_timeout: true is refused for a job with "
            "http: an HTTP handler cannot be stopped" in result.stderr
        ), result.stderr
    assert len(app.got("/slow")) == before  # nothing was sent


def _sent(app: App, path: str, job: str) -> list[Request]:
    return sorted(
        (r for r in app.got(path) if r.headers.get("X-Lockctl-Job") == job), key=lambda r: r.at
    )


def _never_overlap(requests: list[Request]) -> None:
    """Each request arrived after the previous one's handler finished (both on this process's
    monotonic clock; a retry is caused by the answer, sent after `finished_at` was taken)."""
    for earlier, later in itertools.pairwise(requests):
        assert earlier.finished_at is not None and earlier.finished_at <= later.at, [
            (r.at, r.finished_at, r.headers) for r in requests
        ]


def test_a_handler_past_its_timeout_gets_one_request_per_tick(lab: Lab) -> None:
    replica = SchedulerProcess(_config(lab, "worker-3", "slow"))
    app, job = lab.apps["worker-3"], lab.jobs["slow"]
    try:
        assert eventually(lambda: _records(lab, "slow"), WAIT), replica.lines
        assert replica.stop() == 0
    finally:
        replica.kill()
    sent = _sent(app, "/slow", job)
    # the handler cannot be stopped: it works on past lockctl's abort, to its own end. (So a
    # tick whose run started late can see the next tick's request arrive while that handler
    # still works: seen here once, and said in docs/http-jobs.md. Not a retry: each tick is
    # checked on its own.)
    assert eventually(lambda: all(r.finished_at is not None for r in sent), WAIT), sent
    records = _records(lab, "slow")
    for tick, record in records.items():
        if tick == max(records) and record.outcome is TickOutcome.INTERRUPTED:
            # the stop came while the next tick's call ran (it starts the moment a late run
            # ends, its window still open): cut off by the stop, and said so
            assert record.stderr == "aborted: the request was cut off by lockctl", record
        else:
            assert record.outcome is TickOutcome.TIMED_OUT, record
        assert record.attempts is None, record
        ours = [r for r in sent if r.headers["X-Lockctl-Tick"] == tick_name(tick)]
        assert [r.headers["X-Lockctl-Attempt"] for r in ours] == ["1"], ours  # retries = 2
    assert not replica.events("retrying")
    assert [e for e in replica.events("timed-out") if e.get("job") == job]


def test_a_503_is_retried_without_overlap_with_one_key_per_run(lab: Lab) -> None:
    replica = SchedulerProcess(_config(lab, "worker-2", "busy"))
    app, job = lab.apps["worker-2"], lab.jobs["busy"]

    def retried() -> list[TickRecord]:
        return [r for r in _records(lab, "busy").values() if r.attempts == (1, 1, 1)]

    try:
        assert eventually(lambda: len(retried()) >= 2, WAIT * 2), replica.lines
        assert replica.stop() == 0
    finally:
        replica.kill()
    sent = _sent(app, "/busy", job)
    assert eventually(lambda: all(r.finished_at is not None for r in sent), WAIT), sent
    _never_overlap(sent)
    keys = set()
    for tick, record in _records(lab, "busy").items():
        name = tick_name(tick)
        ours = [r for r in sent if r.headers["X-Lockctl-Tick"] == name]
        count = len(record.attempts or (record.exit_status,))
        assert (
            record.outcome is TickOutcome.FAILED and record.stderr == "HTTP 503 Service Unavailable"
        ), record
        assert [r.headers["X-Lockctl-Attempt"] for r in ours] == [
            str(n) for n in range(1, count + 1)
        ], ours
        assert {r.headers["Idempotency-Key"] for r in ours} == {f'"lockctl:{job}:{name}"'}
        keys.add(ours[0].headers["Idempotency-Key"])
        assert len({r.headers["X-Lockctl-Lock-Index"] for r in ours}) == 1  # one lock held
    assert len(keys) == len(_records(lab, "busy")) >= 2  # a key of its own for each tick
    for done in retried()[:1]:
        print(f"\n{lab.jobs['busy']} tick {tick_name(done.tick)}:")  # for the docs
        for r in sent:
            if r.headers["X-Lockctl-Tick"] == tick_name(done.tick):
                shown = {k: r.headers[k] for k in HEADERS if k != "X-Lockctl-Deadline"}
                print(f"  {r.method} {r.path} {shown}")
    assert replica.events("retrying") and replica.events("retry-started")


def test_a_triggered_run_has_a_key_of_its_own(lab: Lab) -> None:
    replica = SchedulerProcess(_config(lab, "worker-1", "trig"))
    app, job = lab.apps["worker-1"], lab.jobs["trig"]
    try:
        assert eventually(lambda: replica.events("started"), WAIT), replica.lines
        ids = []
        for _ in range(2):
            asked = _trigger(lab, job)
            ids.append(asked)
            assert eventually(lambda: len(_sent(app, "/ok", job)) == len(ids), WAIT), [
                replica.lines
            ]
        assert replica.stop() == 0
    finally:
        replica.kill()
    sent = _sent(app, "/ok", job)
    print(f"\ntriggered {job}: {[r.headers['Idempotency-Key'] for r in sent]}")  # for the docs
    for request, trigger in zip(sent, ids, strict=True):
        tick = request.headers["X-Lockctl-Tick"]  # the trigger's own instant
        expected = f'"lockctl:{job}:{tick}:trigger:{trigger}"'
        assert request.headers["Idempotency-Key"] == expected, request.headers
        assert request.headers["X-Lockctl-Attempt"] == "1"
    assert sent[0].headers["Idempotency-Key"] != sent[1].headers["Idempotency-Key"]


def _trigger(lab: Lab, job: str) -> str:
    """`lockctl trigger JOB` as an operator; the trigger's id it printed."""
    result: subprocess.CompletedProcess[str] = operator_command(
        lab.cluster, lab.tmp / "locks.hcl", lab.secrets, "trigger", job
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split("(trigger ", 1)[1].split(")", 1)[0]
