"""The embedded Python API on the real cluster (issue 22, item 4): three processes of a small
app (tests/apps/embed_app.py), each firing the same decorated function from APScheduler 3 every
2 seconds, put it behind lockctl. Each tick runs once across them (an oracle file the body
appends to, and the ledger); a kill -9 of the replica running the body: the others carry on
within the takeover bound; a replica SIGSTOPped past its TTL finds `run.lost` set after SIGCONT
and the fenced store refuses its stale lock index; with isolation="process" the body's process
tree (it started a `sleep`) is dead before another replica runs the job.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from workers_lab import FAST_DEFAULTS, minted_workers, spec_text

from provision.embed import EXIT_ON_LOST, Locker, Outcome, Run, SkipReason
from tests.lockctl_process import eventually

if TYPE_CHECKING:
    from conftest import LiveCluster

pytestmark = pytest.mark.cluster

WORKERS = ("worker-1", "worker-2", "worker-3")
JOBS = ("once", "kill", "stop", "proc", "exit", "inproc", "pkill", "pstop", "check")
SERVED = ("s-stop", "s-proc", "s-exit", "s-check")  # the same scenarios, fired by serve()
TTL = float(FAST_DEFAULTS["ttl"].rstrip("s"))
LOCK_DELAY = float(FAST_DEFAULTS["lock_delay"].rstrip("s"))
# a dead replica's session ends within 2 x TTL (Consul's grace), then the lock-delay runs
TAKEOVER = 2 * TTL + LOCK_DELAY
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Lab:
    tmp: Path
    configs: dict[str, Path]
    jobs: dict[str, str]
    cluster: LiveCluster


@pytest.fixture(scope="module")
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("embed")
    uid = uuid.uuid4().hex[:8]
    kv = f"test/embed-{uid}/"
    jobs = {s: {"prefix": f'"{kv}{s}/"', "schedule": '"@every 2s"'} for s in JOBS + SERVED}
    spec_path = tmp / "locks.hcl"
    spec_path.write_text(
        spec_text(live_cluster, WORKERS, {f"{s}-{uid}": a for s, a in jobs.items()})
    )
    with minted_workers(live_cluster, spec_path, WORKERS, tmp, uid, kv) as made:
        yield Lab(tmp, made.configs, {s: f"{s}-{uid}" for s in JOBS + SERVED}, live_cluster)


class App:
    """One replica of the app: a process of tests/apps/embed_app.py."""

    def __init__(self, lab: Lab, worker: str, short: str, mode: str, state: Path) -> None:
        self.worker = worker
        self.log = open(state / f"{worker}.err", "w")  # noqa: SIM115 (closed in stop)
        argv = [str(lab.configs[worker]), lab.jobs[short], str(state), mode]
        argv += ["serve"] if short in SERVED else []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.apps.embed_app", *argv],
            cwd=ROOT,
            stdout=self.log,
            stderr=self.log,
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


@pytest.fixture
def apps(lab: Lab) -> Iterator[list[App]]:
    started: list[App] = []
    yield started
    for app in started:
        with_cont(app)
        app.stop()


def with_cont(app: App) -> None:
    if app.process.poll() is None:
        os.kill(app.process.pid, signal.SIGCONT)


def start(lab: Lab, apps: list[App], short: str, mode: str) -> Path:
    state = lab.tmp / short
    state.mkdir()
    apps.extend(App(lab, worker, short, mode, state) for worker in WORKERS)
    return state


def oracle(state: Path) -> list[dict[str, Any]]:
    path = state / "oracle.log"
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def runs(state: Path) -> list[dict[str, Any]]:
    return [line for line in oracle(state) if not line.get("lost")]


def ledger_rows(lab: Lab, short: str) -> dict[datetime, tuple[str, str | None]]:
    """The ledger's ticks: outcome and who ran them, read through the API's own reader."""
    with Locker.from_config(lab.configs["worker-1"], events=io.StringIO()) as locker:
        rows = locker.history(lab.jobs[short], limit=200).runs
    return {row.tick: (row.outcome, row.record and row.record.worker) for row in rows}


def test_three_replicas_run_each_tick_once(lab: Lab, apps: list[App]) -> None:
    state = start(lab, apps, "once", "quick")
    assert eventually(lambda: len(runs(state)) >= 15, timeout=60), "fewer than 15 runs in 60 s"
    for app in apps:
        app.stop()
    lines = runs(state)
    ticks = [line["tick"] for line in lines]
    assert len(ticks) == len(set(ticks)), f"a tick ran twice: {sorted(map(str, ticks))}"
    assert {line["worker"] for line in lines} <= set(WORKERS)
    # every run of the oracle is a succeeded record of the ledger, by the same worker, and the
    # ticks between the first and the last were all run (APScheduler fires every 2 s in each)
    # (the last may be `interrupted`: the replica running it was stopped)
    ledger = ledger_rows(lab, "once")
    for line in lines:
        outcome, worker = ledger[datetime.fromisoformat(line["tick"])]
        assert worker == line["worker"] and outcome in ("succeeded", "interrupted")
    first, last = min(ledger), max(ledger)
    expected = int((last - first).total_seconds() // 2) + 1
    ran = [tick for tick, (outcome, _) in ledger.items() if outcome != "missed"]
    assert len(ran) == len(lines) >= expected - 1, f"{expected - len(ran)} ticks not run"
    # the other replicas were told why they did not run: skipped, the tick taken
    skips = [line for app in apps for line in outcomes(state, app) if line["outcome"] == "skipped"]
    assert skips and all(line["skip"] in ("taken", "overlap") for line in skips)


def outcomes(state: Path, app: App) -> list[dict[str, Any]]:
    text = (state / f"{app.worker}.err").read_text()
    return [json.loads(x) for x in text.splitlines() if x.startswith('{"worker"')]


def test_kill9_of_the_running_replica_the_others_carry_on(lab: Lab, apps: list[App]) -> None:
    state = start(lab, apps, "kill", "slow")  # the body takes 1.5 s: killed while it runs
    first = eventually(lambda: runs(state), timeout=30)
    assert first
    victim = next(app for app in apps if app.worker == first[-1]["worker"])
    os.kill(victim.process.pid, signal.SIGKILL)
    killed_at = time.time()
    victim.process.wait()

    def after() -> list[dict[str, Any]]:
        return [line for line in runs(state) if line["at"] > killed_at]

    later = eventually(lambda: len(after()) >= 2, timeout=TAKEOVER + 30)
    assert later, "the other replicas did not carry on"
    resumed = after()
    assert {line["worker"] for line in resumed} <= set(WORKERS) - {victim.worker}
    assert resumed[0]["at"] - killed_at <= TAKEOVER + 5, "later than the takeover bound"
    ticks = [line["tick"] for line in runs(state)]
    assert len(ticks) == len(set(ticks))


@pytest.mark.parametrize("short", ["stop", "s-stop"])
def test_sigstop_past_the_ttl_sets_lost_and_the_store_refuses(
    lab: Lab, apps: list[App], short: str
) -> None:
    state = start(lab, apps, short, "hang-once")
    # each replica's first run hangs until lost; the first of them to run is the victim
    first = eventually(lambda: runs(state), timeout=30)
    assert first
    victim = next(app for app in apps if app.worker == first[0]["worker"])
    os.kill(victim.process.pid, signal.SIGSTOP)
    stale = first[0]["lock_index"]
    # its session expires, another replica runs a tick with a higher lock index (first runs
    # of the other replicas hang too: they need their own loss, so kill them later)
    store = state / "fence.json"

    def higher() -> bool:
        return store.exists() and json.loads(store.read_text())["highest"] > stale

    # the other two would hang in their first runs too: a replica that runs quick replaces them
    for app in apps:
        if app is not victim:
            app.stop()
    helper = App(lab, next(w for w in WORKERS if w != victim.worker), short, "quick", state)
    apps.append(helper)
    assert eventually(higher, timeout=2 * TTL + LOCK_DELAY + 30), "no later run took over"
    os.kill(victim.process.pid, signal.SIGCONT)
    late = eventually(lambda: [x for x in oracle(state) if x.get("lost")], timeout=30)
    assert late, "the stopped replica's run.lost was not set"
    assert late[0]["worker"] == victim.worker and late[0]["lock_index"] == stale
    assert late[0]["accepted"] is False


def child_pid(state: Path) -> int:
    """The PID the body's child wrote (the host's), once it has."""
    text = eventually(lambda: _read(state / "sleep.pid"), timeout=30)
    assert text, "the body's child did not start"
    return int(text)


def _read(path: Path) -> str:
    try:
        text = path.read_text()
    except OSError:
        return ""
    return text if text.isdigit() else ""


def holder(state: Path, apps: list[App]) -> App:
    """The replica whose body hangs (it wrote its worker's name first)."""
    worker = eventually(lambda: _read_name(state / "hung"), timeout=30)
    return next(app for app in apps if app.worker == worker)


def _read_name(path: Path) -> str:
    return path.read_text() if path.exists() else ""


@pytest.mark.parametrize("short", ["proc", "s-proc"])
def test_process_isolation_kills_the_tree_before_another_runs(
    lab: Lab, apps: list[App], short: str
) -> None:
    """The isolated body lives on while its lock is renewed (its warden is told of every
    confirmation: without them it would end the body within LockDelay), and dies with the
    lock, before another replica runs the job."""
    state = start(lab, apps, short, "process")
    sleep_pid = child_pid(state)
    assert eventually(lambda: runs(state), timeout=30)
    time.sleep(LOCK_DELAY + 2)
    assert _alive(sleep_pid), "the isolated body was ended while its lock was renewed"
    assert len(runs(state)) == 1
    session = _lock_session(lab, short)
    assert session
    lab.cluster.management().session.destroy(session)  # the lock is lost under the body
    later = eventually(lambda: runs(state)[1:], timeout=TAKEOVER + 30)
    assert later, "no replica ran the job after the loss"
    assert later[0]["sleep_alive"] is False, "the body's sleep outlived the lock"
    assert not Path(f"/proc/{sleep_pid}").exists() or "Z" in _state(sleep_pid)


def test_kill9_of_the_app_kills_the_isolated_body_s_child(lab: Lab, apps: list[App]) -> None:
    """The app is killed (an OOM kill, a stop timeout run out) while its isolated body runs a
    child: nothing of the body lives on to overlap the next replica's run."""
    state = start(lab, apps, "pkill", "process")
    sleep_pid = child_pid(state)
    victim = holder(state, apps)
    os.kill(victim.process.pid, signal.SIGKILL)
    victim.process.wait()
    later = eventually(lambda: runs(state)[1:], timeout=TAKEOVER + 30)
    assert later, "no replica ran the job after the kill"
    assert later[0]["worker"] != victim.worker
    assert later[0]["sleep_alive"] is False, "the body's child outlived the killed app"
    assert not _alive(sleep_pid)


def test_sigstop_of_the_app_the_warden_ends_the_body_in_time(lab: Lab, apps: list[App]) -> None:
    """The app's process alone is stopped (not its group): it can neither renew nor kill. The
    warden beside the body ends the body's tree (a setsid'd child deaf to SIGTERM) before
    another replica may hold the lock, and the next replica's body finds it dead."""
    state = start(lab, apps, "pstop", "process-stop")
    sleep_pid = child_pid(state)
    victim = holder(state, apps)
    os.kill(victim.process.pid, signal.SIGSTOP)
    later = eventually(lambda: runs(state)[1:], timeout=TAKEOVER + 30)
    assert later, "no replica ran the job while the holder was stopped"
    assert later[0]["worker"] != victim.worker
    assert later[0]["sleep_alive"] is False, "the body's child lived on after the lock passed"
    assert not _alive(sleep_pid)


@pytest.mark.parametrize("short", ["check", "s-check"])
def test_check_never_passes_after_another_replica_ran(
    lab: Lab, apps: list[App], short: str
) -> None:
    """A body looping on run.check() in an app stopped past TTL and LockDelay: after SIGCONT,
    check() raises at its first call; it never returned once another replica had run."""
    state = start(lab, apps, short, "check-loop")
    victim = holder(state, apps)
    time.sleep(1.0)  # the body is in its loop: its lock confirmed by at least one renewal
    os.kill(victim.process.pid, signal.SIGSTOP)
    later = eventually(lambda: runs(state)[1:], timeout=TAKEOVER + 30)
    assert later, "no replica ran the job while the holder was stopped"
    time.sleep(1.0)  # the later run has started: a check() that passed now would be stale
    os.kill(victim.process.pid, signal.SIGCONT)
    lost = eventually(lambda: [x for x in oracle(state) if x.get("lost")], timeout=30)
    assert lost, "the stopped body's run.check() never raised"
    assert lost[0]["worker"] == victim.worker
    assert lost[0]["last_ok"] < later[0]["at"], (
        f"run.check() returned {lost[0]['last_ok'] - later[0]['at']:.3f} s after another "
        f"replica's run started ({lost[0]['reason']})"
    )


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def _lock_session(lab: Lab, short: str) -> str | None:
    uid = lab.jobs[short].split("-")[-1]
    entry, _ = lab.cluster.management().kv.get(f"test/embed-{uid}/{short}/.lock")
    return entry.session if entry is not None else None


@pytest.mark.parametrize("short", ["exit", "s-exit"])
def test_on_lost_exit_ends_the_process_after_the_event(
    lab: Lab, apps: list[App], short: str
) -> None:
    state = start(lab, apps, short, "exit")  # the first run anywhere hangs, never looking
    first = eventually(lambda: runs(state), timeout=30)
    assert first
    holder = next(app for app in apps if app.worker == first[0]["worker"])
    session = _lock_session(lab, short)
    assert session
    lab.cluster.management().session.destroy(session)
    assert holder.process.wait(TAKEOVER + 30) == EXIT_ON_LOST
    lines = (state / f"{holder.worker}.err").read_text().splitlines()
    events = [json.loads(x) for x in lines if x.startswith('{"time"')]
    assert events[-1]["event"] == "fenced"  # written before the exit


def _env(config: Path) -> dict[str, str]:
    """What a pod would be given: Consul's variables, and the config with the jobs."""
    raw = json.loads(config.read_text())
    consul, env = raw["consul"], {"LOCKCTL_CONFIG": str(config), "LOCKCTL_WORKER": raw["worker"]}
    names = {
        "address": "CONSUL_HTTP_ADDR",
        "token_file": "CONSUL_HTTP_TOKEN_FILE",
        "ca_file": "CONSUL_CACERT",
        "cert_file": "CONSUL_CLIENT_CERT",
        "key_file": "CONSUL_CLIENT_KEY",
    }
    return env | {names[key]: value for key, value in consul.items() if key in names}


def test_block_serve_and_asyncio_in_one_process(lab: Lab) -> None:
    job = lab.jobs["inproc"]
    one = Locker.from_config(lab.configs["worker-1"], events=io.StringIO())
    two = Locker.from_env(_env(lab.configs["worker-2"]), events=io.StringIO())
    try:
        # the block form, in two replicas at once: one has the run, the other says why not
        claims: dict[str, Any] = {}
        ready = threading.Barrier(2)

        def block(locker: Locker) -> None:
            ready.wait()
            with locker.tick(job) as claim:
                claims[locker.worker] = (bool(claim), claim.outcome, claim.run)
                if claim.run is not None:
                    claim.run.check()
            claims[locker.worker] += (claim.outcome,)

        threads = [threading.Thread(target=block, args=(x,)) for x in (one, two)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        (ran,) = [c for c in claims.values() if c[0]]
        (other,) = [c for c in claims.values() if not c[0]]
        assert ran[1] is None and ran[3].outcome is Outcome.RAN and ran[3].ran
        assert ran[2].lock_index == ran[3].lock_index
        assert other[1].outcome is Outcome.SKIPPED and other[1].skip is SkipReason.TAKEN
        # serve(): both replicas fire the decorated job at its ticks; each tick runs once
        ticks: list[tuple[str, str]] = []
        for locker in (one, two):

            def body(run: Run, worker: str = locker.worker) -> None:
                ticks.append((run.tick.isoformat(), worker))

            locker.singleton(job)(body)
        stop = threading.Event()
        servers = [threading.Thread(target=x.serve, args=(stop,)) for x in (one, two)]
        for server in servers:
            server.start()
        eventually(lambda: len(ticks) >= 3, timeout=30)
        stop.set()
        for server in servers:
            server.join(30)
        assert len(ticks) >= 3, ticks
        assert len({tick for tick, _ in ticks}) == len(ticks), f"a tick ran twice: {ticks}"
        # asyncio: the decorated call awaited through the loop's executor
        outcome = asyncio.run(one.run_async(one.registered[job]))
        assert outcome.outcome in (Outcome.RAN, Outcome.SKIPPED)
        assert outcome.tick is not None
    finally:
        one.close()
        two.close()
    assert not one.sessions and not two.sessions  # destroyed by close()
