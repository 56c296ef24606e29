"""`lockctl run` through the console script's fast path on the real cluster: a skip loads no
Typer, click, rich or other command; a taken tick is settled without the HTTP client; and
--metrics-textfile counts skips and runs across processes (what the textfile collector would
read after each)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from prometheus_client.parser import text_string_to_metric_families
from workers_lab import minted_workers

from provision.consul import Consul
from provision.ledger.records import TickOutcome, TickRecord, tick_name
from provision.ledger.store import Ledger
from provision.schedule import parse_schedule

if TYPE_CHECKING:
    from conftest import LiveCluster


WORKERS = ("worker-1", "worker-2")
WAIT = 30.0
TICK_EVERY = 5

# The console script's entry, in a child interpreter, reporting which watched modules it loaded
# (exit_process would os._exit before anything could be reported).
PROBE = """
import json, sys
import provision.cli.entry as entry
def exit_process(code):
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in WATCHED or m in WATCHED)
    sys.stdout.write(json.dumps({"code": code, "loaded": loaded}) + "\\n")
    sys.stdout.flush()
    raise SystemExit(code)
WATCHED = set(sys.argv[1].split(","))
entry.exit_process = exit_process
entry.main(sys.argv[2:])
"""
HEAVY = ("requests", "urllib3", "provision.runner.plain", "provision.consul.client")
NOT_FOR_RUN = (
    "typer",
    "click",
    "rich",
    "pydantic",
    "jinja2",
    "hcl2",
    "provision.cli.app",
    "provision.cli.acl",
    "provision.cli.cluster",
    "provision.cli.options",
    "provision.cli.policies",
    "provision.cli.status",
    "provision.cli.verify",
    "provision.cli.workers",
    "provision.cli.schedulejob",
)


@dataclass(frozen=True)
class Lab:
    configs: dict[str, Path]
    job: str
    key: str
    tmp: Path
    cluster: LiveCluster
    tick_job: str


@pytest.fixture(scope="module")
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("run-entry")
    uid = uuid.uuid4().hex[:8]
    prefix = f"test/run-entry-{uid}/"
    lines = ["defaults {", '  renew_interval = "5s"', "}"]
    for worker in WORKERS:
        lines += [f'worker "{worker}" {{', f'  address = "{live_cluster.address(worker)}"', "}"]
    workers = json.dumps(list(WORKERS))
    lines += [f'job "entry-{uid}" {{', f'  prefix  = "{prefix}"', f"  workers = {workers}", "}"]
    lines += [
        f'job "tick-{uid}" {{',
        f'  prefix   = "{prefix.removesuffix("/")}-tick/"',
        f"  workers  = {workers}",
        f'  schedule = "@every {TICK_EVERY}s"',
        "}",
    ]
    spec = tmp / "locks.hcl"
    spec.write_text("\n".join(lines) + "\n")
    with minted_workers(live_cluster, spec, WORKERS, tmp, uid, prefix.removesuffix("/")) as made:
        yield Lab(made.configs, f"entry-{uid}", f"{prefix}.lock", tmp, live_cluster, f"tick-{uid}")


class Holder:
    """Another session (management token) holding the job's lock, LockDelay 0."""

    def __init__(self, lab: Lab) -> None:
        self.consul: Consul = lab.cluster.management("worker-1")
        self.key = lab.key
        self.session = self.consul.session.create(name="holder", ttl=30, lock_delay=0)
        assert self.consul.kv.put(self.key, b"holder", acquire=self.session)

    def release(self) -> None:
        self.consul.kv.put(self.key, release=self.session)
        self.consul.session.destroy(self.session)


def probe(
    lab: Lab, *args: str, job: str | None = None, watched: tuple[str, ...] = NOT_FOR_RUN
) -> tuple[dict[str, object], list[dict[str, object]]]:
    argv = ["run", "--config", str(lab.configs["worker-2"]), "--job", job or lab.job, *args]
    done = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(watched), *argv],
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "LOCKCTL_CONFIG"},
    )
    assert "Traceback" not in done.stderr, done.stderr
    events = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    return json.loads(done.stdout.splitlines()[-1]), events


def test_a_taken_tick_is_skipped_without_the_http_client_or_the_engine(lab: Lab) -> None:
    """The commonest run of all, a scheduled job whose tick another worker took: one plain
    read (the standard library's http.client), no requests, no engine, no session."""
    schedule = parse_schedule(f"@every {TICK_EVERY}s")
    tick = schedule.next_ticks(datetime.now(timezone.utc), 1)[0]
    time.sleep(max(0.0, tick.timestamp() + 0.1 - time.time()))  # just after the tick
    record = TickRecord(tick, TickOutcome.SUCCEEDED, worker="worker-1", lock_index=7)
    ledger = Ledger(lab.cluster.management(), lab.key.replace("/.lock", "-tick/.lock"))
    assert ledger.record_missed([record]) == 1  # cas index 0: written as given
    sessions_before = _sessions_of(lab, "worker-2")
    report, events = probe(lab, "--", "true", job=lab.tick_job, watched=NOT_FOR_RUN + HEAVY)
    assert report == {"code": 0, "loaded": []}
    assert [e["event"] for e in events] == ["skipped"]
    assert events[0]["reason"] == f"tick {tick_name(tick)} already run by worker-1 (succeeded)"
    assert events[0]["taken_lock_index"] == 7
    assert _sessions_of(lab, "worker-2") <= sessions_before  # none made


def test_a_held_lock_is_skipped_without_the_http_client_or_a_session(lab: Lab) -> None:
    """A plain lock's run that does not wait, while another session holds the lock: two plain
    reads (the key's holder, its session's node), no requests, no engine, no session; the
    skipped event says what the engine's would (here the worker's token may not read the
    holder's session, so its node stays unknown)."""
    holder = Holder(lab)
    try:
        sessions_before = _sessions_of(lab, "worker-2")
        report, events = probe(lab, "--", "true", watched=NOT_FOR_RUN + HEAVY)
        assert _sessions_of(lab, "worker-2") <= sessions_before  # none made
    finally:
        holder.release()
    assert report == {"code": 0, "loaded": []}
    assert [e["event"] for e in events] == ["skipped"]
    assert events[0]["holder"] == holder.session
    assert events[0]["reason"].startswith("held by"), events


def test_a_free_lock_is_run_on_the_plain_lock_path(lab: Lab) -> None:
    """The quick read finds no holder: the run goes on and runs its job."""
    report, events = probe(lab, "--", "true", watched=HEAVY)
    assert report["code"] == 0, events
    assert "acquired" in [e["event"] for e in events], events
    assert "provision.runner.plain" in report["loaded"]  # type: ignore[operator]


def _sessions_of(lab: Lab, node: str) -> set[str]:
    """The sessions of this module's jobs on one worker's node (a run names its session
    `lockctl <job> on <worker>`); other tests' sessions on the node are not looked at."""
    on_node = lab.cluster.management().session.list(node=node)
    return {s.id for s in on_node if _of_lab(lab, s.name)}


def _of_lab(lab: Lab, session_name: str) -> bool:
    return any(job in session_name for job in (lab.job, lab.tick_job))


def test_a_skip_loads_neither_typer_nor_rich_nor_the_other_commands(lab: Lab) -> None:
    holder = Holder(lab)
    try:
        report, events = probe(lab, "--", "true")
    finally:
        holder.release()
    assert report == {"code": 0, "loaded": []}
    assert [e["event"] for e in events] == ["skipped"]


def _samples(path: Path) -> dict[str, float]:
    found = {}
    for family in text_string_to_metric_families(path.read_text()):
        for sample in family.samples:
            outcome = sample.labels.get("outcome")
            assert sample.labels["worker"] == "worker-2"
            found[sample.name + (f"{{{outcome}}}" if outcome else "")] = sample.value
    return found


def test_metrics_count_skips_and_runs_and_a_skip_keeps_the_last_success(lab: Lab) -> None:
    prom = lab.tmp / "textfile" / "lockctl-entry.prom"
    prom.parent.mkdir()
    flags = ("--metrics-textfile", str(prom), "--")
    holder = Holder(lab)
    try:
        assert probe(lab, *flags, "true")[0]["code"] == 0
    finally:
        holder.release()
    assert _samples(prom) == {"lockctl_ticks_total{skipped}": 1.0}
    report, events = probe(lab, *flags, "sh", "-c", "sleep 0.2")
    assert report["code"] == 0 and events[-1]["event"] == "released"
    after_run = _samples(prom)
    assert after_run["lockctl_ticks_total{ran}"] == 1.0
    assert after_run["lockctl_job_last_exit_status"] == 0.0
    assert 0.2 <= after_run["lockctl_job_last_duration_seconds"] < 10
    success = after_run["lockctl_job_last_success_timestamp_seconds"]
    holder = Holder(lab)
    try:
        assert probe(lab, *flags, "true")[0]["code"] == 0
    finally:
        holder.release()
    after_skip = _samples(prom)
    assert after_skip["lockctl_job_last_success_timestamp_seconds"] == success
    assert after_skip["lockctl_ticks_total{skipped}"] == 2.0
    assert sorted(p.name for p in prom.parent.iterdir()) == [prom.name]  # no temporary left


def test_a_metrics_folder_that_cannot_be_written_keeps_the_jobs_exit_status(lab: Lab) -> None:
    report, events = probe(
        lab, "--metrics-textfile", "/proc/lockctl.prom", "--", "sh", "-c", "exit 3"
    )
    assert report["code"] == 3
    warning = events[-1]
    assert warning["event"] == "metrics-warning" and warning["path"] == "/proc/lockctl.prom"
    assert str(warning["warning"]).startswith("metrics not written: ")


@pytest.mark.parametrize("closed", ["1", "2", "1 2", "0 1 2"])
def test_a_run_with_its_streams_closed_runs_releases_and_exits_as_the_job(
    lab: Lab, closed: str
) -> None:
    """A timer or a supervisor that starts `lockctl run` with stdout, stderr (or both, or stdin
    too) closed: the job runs, the lock is released and the session destroyed, and the exit
    status is the job's. Once, a closed stdout ended a good run in a traceback and a closed
    stderr in exit 1 with the lock left to its TTL."""
    ran = lab.tmp / f"closed-{closed.replace(' ', '-')}"
    argv = [sys.executable, "-m", "provision", "run", "--config", str(lab.configs["worker-2"])]
    argv += ["--job", lab.job, "--", "sh", "-c", f"echo ran > {ran}; exit 3"]
    redirects = " ".join(f"{fd}>&-" if fd != "0" else "<&-" for fd in closed.split())
    shell = f'exec "$@" {redirects}'
    done = subprocess.run(  # stderr captured when it is not the one closed
        ["sh", "-c", shell, "sh", *argv], capture_output=True, text=True, timeout=WAIT
    )
    assert done.returncode == 3, (done.returncode, done.stderr)
    assert ran.read_text() == "ran\n"
    assert "Traceback" not in done.stderr, done.stderr
    consul = lab.cluster.management("worker-2")
    entry, _ = consul.kv.get(lab.key)
    assert entry is None or not entry.session, entry  # released, not left to its TTL
    node_sessions = [s for s in consul.session.list(node="worker-2") if lab.job in s.name]
    assert not node_sessions, node_sessions
