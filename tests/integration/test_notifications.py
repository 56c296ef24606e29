"""Notifications on the real cluster (docs/notifications.md): one `lockctl schedule` with `@every
2s` jobs and a real HTTP receiver of the test's own, on the test's loopback subnet.

- A job that fails posts its `failed` body to its notify block's URL and GETs its ping's
  `/fail`; once it succeeds again, the first success posts `recovered` and GETs the ping.
- A receiver that accepts and never answers delays no tick: while it still holds the first
  request, the tick it was about completes and the next tick is claimed (asserted by the order
  of what happened, not by durations).
- A URL file others may read refuses the start, in one line naming the file.
- The URLs' secret parts appear nowhere in the scheduler's output.
"""

from __future__ import annotations

import http.server
import io
import json
import signal
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from scheduler_lab import ListeningScheduler
from test_scheduler_listen import QUICK_DEFAULTS, _value
from workers_lab import minted_workers

from provision.embed import Locker, Run, RunOutcome
from provision.ledger.records import tick_name
from tests.lockctl_process import LOCKCTL, eventually
from tests.subnets import TEST_SUBNET

if TYPE_CHECKING:
    from conftest import LiveCluster

WORKER = "worker-1"
WAIT = 40.0
RECEIVER_HOST = f"{TEST_SUBNET}.250"  # on this run's own loopback subnet


@dataclass
class Request:
    method: str
    path: str = field(repr=False)  # its secret part: never in a report
    body: dict[str, Any] | None


@dataclass
class Receiver:
    """A tiny webhook receiver: every request kept, in order of arrival; a path under /hang/
    is accepted and never answered until `release` is set."""

    requests: list[Request] = field(default_factory=list, repr=False)
    hanging: list[Request] = field(default_factory=list, repr=False)  # not answered yet
    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, server: http.server.ThreadingHTTPServer, path: str) -> str:
        return f"http://{RECEIVER_HOST}:{server.server_address[1]}{path}"

    def seen(self, method: str, part: str) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if r.method == method and part in r.path]


def _handler(receiver: Receiver) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def _take(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            request = Request(self.command, self.path, json.loads(raw) if raw else None)
            with receiver.lock:
                receiver.requests.append(request)
                if "/hang/" in self.path:
                    receiver.hanging.append(request)
            if "/hang/" in self.path:
                receiver.release.wait()
                with receiver.lock:
                    receiver.hanging.remove(request)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = _take

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

    return Handler


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[Receiver, http.server.ThreadingHTTPServer]]:
    made = Receiver()
    server = http.server.ThreadingHTTPServer((RECEIVER_HOST, 0), _handler(made))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield made, server
    finally:
        made.release.set()
        server.shutdown()
        server.server_close()


@dataclass(frozen=True)
class Lab:
    config: Path
    flag: Path  # the flaky job succeeds while it exists
    flaky: str
    hangs: str
    nowhere: str  # its notify block's URL names a port nothing listens on
    timer: str  # no command: a per-tick timer's `lockctl run` gives it one
    hook_file: Path
    secrets: tuple[str, ...] = field(repr=False)  # the URLs' secret parts: never in a report


def _url_file(folder: Path, name: str, url: str) -> Path:
    path = folder / name
    path.write_text(url + "\n")
    path.chmod(0o600)
    return path


def _spec_text(cluster: LiveCluster, uid: str, files: dict[str, Path], flag: Path) -> str:
    flaky = ["/bin/sh", "-c", f"echo checking; echo cannot reach the warehouse >&2; test -e {flag}"]
    return "\n".join(
        [
            *QUICK_DEFAULTS,
            f'worker "{WORKER}" {{',
            f'  address = "{cluster.address(WORKER)}"',
            "}",
            f'job "flaky-{uid}" {{',
            f'  prefix        = "test/notify-{uid}/flaky/"',
            f'  workers       = ["{WORKER}"]',
            '  schedule      = "@every 2s"',
            f"  command       = {json.dumps(flaky)}",
            f'  ping_url_file = "{files["ping"]}"',
            '  notify "chat" {',  # every failure told: a reload's new URL is used at once
            f'    url_file     = "{files["hook"]}"',
            '    on           = ["failed", "recovered"]',
            '    repeat_after = "2s"',
            "  }",
            "}",
            # @every 10s: a `lockctl run` started late on a loaded machine is still within its
            # tick's window (a 2 s job's window is 2 s, less than a loaded start may take)
            f'job "timer-{uid}" {{',
            f'  prefix        = "test/notify-{uid}/timer/"',
            f'  workers       = ["{WORKER}"]',
            '  schedule      = "@every 10s"',
            f'  ping_url_file = "{files["ping"]}"',
            '  notify "chat" {',
            f'    url_file     = "{files["hook"]}"',
            '    on           = ["failed", "recovered"]',
            "  }",
            "}",
            f'job "nowhere-{uid}" {{',
            f'  prefix   = "test/notify-{uid}/nowhere/"',
            f'  workers  = ["{WORKER}"]',
            '  schedule = "@every 2s"',
            '  command  = ["/bin/sh", "-c", "exit 2"]',
            '  notify "pager" {',
            f'    url_file = "{files["nowhere"]}"',
            '    on       = ["failed"]',
            "  }",
            "}",
            f'job "hangs-{uid}" {{',
            f'  prefix   = "test/notify-{uid}/hangs/"',
            f'  workers  = ["{WORKER}"]',
            '  schedule = "@every 2s"',
            '  command  = ["/bin/sh", "-c", "exit 1"]',
            '  notify "slow" {',  # every failure told, whatever the last test's ticks were
            f'    url_file     = "{files["hang"]}"',
            '    repeat_after = "2s"',
            "  }",
            "}",
        ]
    )


@pytest.fixture(scope="module")
def lab(
    live_cluster: LiveCluster,
    tmp_path_factory: pytest.TempPathFactory,
    receiver: tuple[Receiver, http.server.ThreadingHTTPServer],
) -> Iterator[Lab]:
    made, server = receiver
    tmp = tmp_path_factory.mktemp("notify")
    uid = uuid.uuid4().hex[:8]
    kinds = ("hook", "ping", "hang", "nowhere")
    secrets = tuple(f"s3cr3t-{kind}-{uuid.uuid4().hex}" for kind in kinds)
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind((RECEIVER_HOST, 0))
        closed = probe.getsockname()[1]
    urls = {
        "hook": made.url(server, f"/hook/{secrets[0]}"),
        "ping": made.url(server, f"/ping/{secrets[1]}"),
        "hang": made.url(server, f"/hang/{secrets[2]}"),
        "nowhere": f"http://{RECEIVER_HOST}:{closed}/pager/{secrets[3]}",
    }
    files = {kind: _url_file(tmp, f"{kind}.url", url) for kind, url in urls.items()}
    flag = tmp / "healthy"
    spec_path = tmp / "locks.hcl"
    spec_path.write_text(_spec_text(live_cluster, uid, files, flag))
    kv = f"test/notify-{uid}/"
    with minted_workers(live_cluster, spec_path, [WORKER], tmp, uid, kv) as minted:
        config = minted.configs[WORKER]
        yield Lab(
            config,
            flag,
            f"flaky-{uid}",
            f"hangs-{uid}",
            f"nowhere-{uid}",
            f"timer-{uid}",
            files["hook"],
            secrets,
        )


class Scheduler(ListeningScheduler):
    def of(self, event: str, job: str) -> list[dict[str, Any]]:
        return [e for e in self.events(event) if e.get("job") == job]


def _metrics(scheduler: Scheduler) -> list[str]:
    return [line for line in scheduler.get("/metrics")[1].splitlines() if "notifications" in line]


def _bodies(got: Receiver, event: str) -> list[dict[str, Any]]:
    return [r.body for r in got.seen("POST", "/hook/") if r.body and r.body["event"] == event]


def _no_secret(lines: list[str], secrets: tuple[str, ...]) -> None:
    leaked = [line for line in lines if any(secret in line for secret in secrets)]
    assert not leaked, leaked


def _only_a_streak_s_first_failure_told(scheduler: Scheduler, job: str) -> None:
    """A job that fails every tick, with no repeat_after: its block is told of a failure only
    when the tick before did not fail (the ledger's record, read by the replica that ran)."""
    failed = {e["tick"] for e in scheduler.of("released", job) if e.get("outcome") == "failed"}
    told = {e["tick"] for e in scheduler.of("notify-failed", job)}
    every = 2  # the job's `@every 2s`
    firsts = {tick for tick in failed if _tick_before(tick, every) not in failed}
    assert told and told <= firsts, (told, firsts)
    assert failed - firsts, failed  # a streak: repeats there were, told to nobody


def _tick_before(tick: str, seconds: int) -> str:
    moment = datetime.strptime(tick, "%Y-%m-%dT%H:%M:%SZ") - timedelta(seconds=seconds)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_failed_tick_notifies_pings_fail_and_the_first_success_after_it_recovers(
    lab: Lab, receiver: tuple[Receiver, http.server.ThreadingHTTPServer]
) -> None:
    got, _ = receiver
    config = json.loads(lab.config.read_text())
    assert config["jobs"][lab.flaky]["notify"] == {
        "chat": {
            "url_file": str(lab.hook_file),
            "on": ["failed", "recovered"],
            "repeat_after": "2s",
        }
    }
    assert not any(secret in lab.config.read_text() for secret in lab.secrets)
    scheduler = Scheduler(lab.config)
    try:
        assert eventually(lambda: got.seen("POST", "/hook/"), WAIT), scheduler.lines
        failed = got.seen("POST", "/hook/")[0].body
        assert failed is not None
        print("\nthe receiver got:", json.dumps(failed, indent=2))  # for docs/notifications.md
        assert (failed["job"], failed["event"], failed["outcome"]) == (
            lab.flaky,
            "failed",
            "failed",
        )
        assert (failed["worker"], failed["exit_status"], failed["notify"]) == (WORKER, 1, "chat")
        assert failed["output"] == {
            "stdout": ["checking"],
            "stderr": ["cannot reach the warehouse"],
        }
        assert failed["text"] == (
            f"lockctl: {lab.flaky} failed on {WORKER}: tick {failed['tick']}, exit status 1: "
            "cannot reach the warehouse"
        )
        assert eventually(lambda: got.seen("GET", "/fail"), WAIT)
        assert all(r.path.endswith("/fail") for r in got.seen("GET", "/ping/"))  # no success

        lab.flag.touch()  # the job succeeds from its next tick on
        assert eventually(lambda: _bodies(got, "recovered"), WAIT), scheduler.lines
        recovered = _bodies(got, "recovered")[0]
        print("the receiver got:", json.dumps(recovered, indent=2))
        assert (recovered["outcome"], recovered["exit_status"]) == ("succeeded", 0)
        assert recovered["tick"] > failed["tick"]
        success = f"/ping/{lab.secrets[1]}"
        assert eventually(lambda: [r for r in got.seen("GET", "/ping/") if r.path == success])
        # recovered once: the successes after it have a success before them
        assert eventually(lambda: len(scheduler.of("released", lab.flaky)) >= 8, WAIT)
        assert len(_bodies(got, "recovered")) == 1, _bodies(got, "recovered")
        notified = scheduler.of("notified", lab.flaky)
        assert {e["notify"] for e in notified} == {"chat", "ping"}
        # a receiver nobody runs: its failure is an event and a count, never a URL
        assert eventually(lambda: scheduler.of("notify-failed", lab.nowhere), WAIT)
        failed_to = scheduler.of("notify-failed", lab.nowhere)[0]
        assert (failed_to["notify"], failed_to["outcome"]) == ("pager", "failed")
        assert failed_to["error"] == "cannot connect (3 of 3 tries)"
        samples = scheduler.scrape()
        sent = _value(samples, "lockctl_notifications_total", job=lab.flaky, result="sent")
        assert sent >= len(notified)  # counted before said
        print("\n".join(line for line in _metrics(scheduler) if lab.nowhere in line))
        assert (
            _value(
                samples,
                "lockctl_notifications_total",
                job=lab.nowhere,
                notify="pager",
                result="failed",
            )
            >= 1
        )
        assert _value(samples, "lockctl_notifications_total", job=lab.flaky, result="dropped") == 0
        assert scheduler.stop() == 0
        _only_a_streak_s_first_failure_told(scheduler, lab.nowhere)
        _no_secret(scheduler.lines, lab.secrets)
        shown = [line for line in scheduler.lines if '"event":"notif' in line]
        print("\n".join(shown[:8]))  # for docs/notifications.md
    finally:
        scheduler.kill()
        lab.flag.unlink(missing_ok=True)


def test_a_receiver_that_hangs_delays_no_tick(
    lab: Lab, receiver: tuple[Receiver, http.server.ThreadingHTTPServer]
) -> None:
    got, _ = receiver
    got.release.set()  # let go of what an earlier test's scheduler left hanging
    assert eventually(lambda: not got.hanging, WAIT)
    got.release.clear()
    scheduler = Scheduler(lab.config)
    try:
        assert eventually(lambda: got.hanging, WAIT), scheduler.lines
        with got.lock:
            first = got.hanging[0]
        assert first.body is not None and first.body["job"] == lab.hangs
        tick = first.body["tick"]

        def next_claimed() -> bool:
            done = [e for e in scheduler.of("released", lab.hangs) if e["tick"] == tick]
            later = [e for e in scheduler.of("acquired", lab.hangs) if e["tick"] > tick]
            return bool(done and later)

        # the tick the hanging request is about completed, and a later tick was claimed, ...
        assert eventually(next_claimed, WAIT), scheduler.lines
        with got.lock:
            still = first in got.hanging  # ... while the receiver still holds that request
        assert still and not got.release.is_set()
        ticks = [e["tick"] for e in scheduler.of("released", lab.hangs)]
        assert ticks == sorted(set(ticks))  # the later tick may not be released yet: claimed is
        got.release.set()
        assert eventually(lambda: scheduler.of("notified", lab.hangs), WAIT), scheduler.lines
        assert scheduler.stop() == 0
        said = scheduler.of("notify-failed", lab.hangs)
        assert all(e["notify"] == "slow" and "s3cr3t" not in json.dumps(e) for e in said)
        shown = [line for line in scheduler.lines if '"event":"notify-failed"' in line]
        print("\n" + "\n".join(shown[:2]))  # for docs/notifications.md
        _no_secret(scheduler.lines, lab.secrets)
    finally:
        got.release.set()
        scheduler.kill()


def test_a_url_file_others_may_read_refuses_the_start_and_a_run_in_one_line(lab: Lab) -> None:
    schedule = [*LOCKCTL, "schedule", "--config", str(lab.config)]
    run = [*LOCKCTL, "run", "--config", str(lab.config), "--job", lab.flaky, "--", "/bin/true"]
    lab.hook_file.chmod(0o644)
    try:
        done = [
            subprocess.run(c, capture_output=True, text=True, timeout=60) for c in (schedule, run)
        ]
    finally:
        lab.hook_file.chmod(0o600)
    for each in done:  # the scheduler's start, and a run (whether its tick is taken or not)
        assert each.returncode == 2, each
        assert each.stdout == ""
        assert each.stderr.strip().splitlines() == [
            f"lockctl: error: {lab.config}: jobs.{lab.flaky}: {lab.hook_file}: URL file has mode "
            f"0644; it holds a secret, so others must not read it (chmod 600 {lab.hook_file})"
        ]
        _no_secret(each.stderr.splitlines(), lab.secrets)


def test_lockctl_run_of_a_scheduled_job_notifies_before_it_exits(
    lab: Lab, receiver: tuple[Receiver, http.server.ThreadingHTTPServer]
) -> None:
    """A per-tick timer's run: its tick's outcome is told from its record, after the run and
    before the process exits (so the receiver has it by the time the exit is seen)."""
    got, _ = receiver
    command = ["/bin/sh", "-c", "echo disk full >&2; exit 3"]
    run = [*LOCKCTL, "run", "--config", str(lab.config), "--job", lab.timer, "--", *command]
    tries: list[subprocess.CompletedProcess[str]] = []

    def ran() -> bool:  # a run started past its tick's window is said missed: a later one runs
        tries.append(subprocess.run(run, capture_output=True, text=True, timeout=120))
        return tries[-1].returncode != 0

    assert eventually(ran, WAIT, pause=0.5), tries[-1]
    done = tries[-1]
    assert done.returncode == 3, done
    events = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    tick = next(e["tick"] for e in events if e["event"] == "acquired")
    bodies = [b for b in _bodies(got, "failed") if b["tick"] == tick and b["job"] == lab.timer]
    assert len(bodies) == 1 and bodies[0]["output"]["stderr"] == ["disk full"], bodies
    assert bodies[0]["exit_status"] == 3 and bodies[0]["text"].endswith("exit status 3: disk full")
    told = [(e["event"], e["notify"]) for e in events if e["event"].startswith("notif")]
    assert sorted(told) == [("notified", "chat"), ("notified", "ping")], told
    assert f"/ping/{lab.secrets[1]}/fail" in [r.path for r in got.seen("GET", "/ping/")]
    _no_secret(done.stderr.splitlines() + done.stdout.splitlines(), lab.secrets)


def test_serve_of_an_embedded_app_notifies_its_jobs(
    lab: Lab, receiver: tuple[Receiver, http.server.ThreadingHTTPServer]
) -> None:
    """provision.embed's serve() tells a decorated job's failures as `lockctl schedule` does."""
    got, _ = receiver
    events = io.StringIO()
    locker = Locker.from_config(lab.config, events=events)
    before = len(_bodies(got, "failed"))

    @locker.singleton(lab.flaky)
    def export(run: Run) -> None:
        raise RuntimeError("the warehouse is down")

    stop = threading.Event()
    server = threading.Thread(target=locker.serve, args=(stop,))
    server.start()
    try:
        assert eventually(lambda: len(_bodies(got, "failed")) > before, WAIT), events.getvalue()
    finally:
        stop.set()
        server.join(60)
        locker.close()
    body = _bodies(got, "failed")[before]
    assert (body["job"], body["worker"], body["notify"]) == (lab.flaky, WORKER, "chat")
    assert body["exit_status"] not in (0, None)
    said = [json.loads(line) for line in events.getvalue().splitlines() if line.startswith("{")]
    assert any(e["event"] == "notified" and e["notify"] == "chat" for e in said), said
    _no_secret(events.getvalue().splitlines(), lab.secrets)


def test_a_reload_reads_the_url_files_again_and_refuses_one_others_may_read(
    lab: Lab, receiver: tuple[Receiver, http.server.ThreadingHTTPServer]
) -> None:
    got, server = receiver
    kept = lab.hook_file.read_text()
    moved = f"/moved/{uuid.uuid4().hex}"  # the URL's new secret path
    scheduler = Scheduler(lab.config)
    try:
        assert eventually(lambda: scheduler.of("notified", lab.flaky), WAIT), scheduler.lines
        lab.hook_file.chmod(0o644)
        scheduler.process.send_signal(signal.SIGHUP)
        assert eventually(lambda: scheduler.events("reload-refused"), WAIT), scheduler.lines
        refused = scheduler.events("reload-refused")[0]["error"]
        assert refused == (
            f"{lab.config}: jobs.{lab.flaky}: {lab.hook_file}: URL file has mode 0644; it holds "
            f"a secret, so others must not read it (chmod 600 {lab.hook_file})"
        )
        told = len(scheduler.of("notified", lab.flaky))
        assert eventually(lambda: len(scheduler.of("notified", lab.flaky)) > told, WAIT)

        lab.hook_file.write_text(got.url(server, moved) + "\n")  # a new URL, taken at a reload
        lab.hook_file.chmod(0o600)
        scheduler.process.send_signal(signal.SIGHUP)
        assert eventually(lambda: scheduler.events("reloaded"), WAIT), scheduler.lines
        assert eventually(lambda: got.seen("POST", moved), WAIT), scheduler.lines
        assert scheduler.stop() == 0
        _no_secret(scheduler.lines, (*lab.secrets, moved))
    finally:
        scheduler.kill()
        lab.hook_file.write_text(kept)
        lab.hook_file.chmod(0o600)


def test_an_embedded_call_and_a_tick_block_notify_from_the_replica_that_ran(
    lab: Lab, receiver: tuple[Receiver, http.server.ThreadingHTTPServer]
) -> None:
    """A decorated call's failure posts its body to the job's notify block, and a `with
    locker.tick()` block's success pings, sent on the Locker's own lanes, ended by close()."""
    got, _ = receiver
    events = io.StringIO()
    locker = Locker.from_config(lab.config, events=events)
    failing = threading.Event()

    @locker.singleton(lab.flaky)
    def export(run: Run) -> None:
        if failing.is_set():
            raise RuntimeError("the warehouse is down")

    pinged = f"/ping/{lab.secrets[1]}"
    try:
        assert eventually(lambda: export().ran, WAIT, pause=0.3)  # a success first
        failing.set()
        outcomes: list[RunOutcome] = []
        assert eventually(lambda: outcomes.append(export()) or outcomes[-1].ran, WAIT, pause=0.3)
        assert outcomes[-1].tick is not None and not outcomes[-1].succeeded
        tick = tick_name(outcomes[-1].tick)

        def failed_told() -> bool:
            return any(b["tick"] == tick for b in _bodies(got, "failed"))

        assert eventually(failed_told, WAIT), events.getvalue()
        before = [r.path for r in got.seen("GET", "/ping/")].count(pinged)

        def block_ran() -> bool:
            with locker.tick(lab.flaky) as claim:
                return bool(claim)

        assert eventually(block_ran, WAIT, pause=0.3)
    finally:
        locker.close()  # the lanes drained: what the runs decided is sent by now
    assert [r.path for r in got.seen("GET", "/ping/")].count(pinged) > before
    body = next(b for b in _bodies(got, "failed") if b["tick"] == tick)
    assert (body["job"], body["worker"], body["notify"]) == (lab.flaky, WORKER, "chat")
    assert body["output"]["stderr"][-1].endswith("the warehouse is down"), body
    said = [json.loads(line) for line in events.getvalue().splitlines() if line.startswith("{")]
    told = {(e["notify"], e["tick"]) for e in said if e["event"] == "notified"}
    assert ("chat", tick) in told and ("ping", tick) in told, said
    _no_secret(events.getvalue().splitlines(), lab.secrets)
