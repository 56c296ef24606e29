"""`lockctl schedule` on the real cluster: three long-lived schedulers on three workers (three
client agents) run an `@every 3s` job; every tick runs exactly once with no overlap, each
replica keeps one session across ticks, SIGTERM of the replica running a job lets another
replica run the very next tick, a second scheduler of the same config is refused, and a bad
config on SIGHUP is refused while the old one keeps running."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from procscan import catches, pids_with
from scheduler_lab import SchedulerProcess
from workers_lab import minted_workers, spec_text

from provision.errors import EXIT_ENVIRONMENT
from provision.ledger.records import TickOutcome, tick_name
from provision.ledger.store import Ledger
from provision.schedule import parse_schedule
from tests.lockctl_process import LOCKCTL, wait_until

if TYPE_CHECKING:
    from conftest import LiveCluster


WORKERS = ("worker-1", "worker-2", "worker-3")
EVERY = 3
SCHEDULE = parse_schedule(f"@every {EVERY}s")
# short name -> the job's sleep, or "family": a job with children that hide (see _command)
JOBS = {
    "steady": "0.2",
    "handover": "2",
    "single": "0.1",
    "reload": "0.1",
    "hup": "0.1",
    "family-term": "family",
    "family-kill9": "family",
}
# a unique `sleep` argument per family job: its processes are found in /proc by it
MARKS = {short: f"300.{uuid.uuid4().int % 10**9:09d}" for short in JOBS}
WAIT = 30.0


@dataclass(frozen=True)
class Lab:
    tmp: Path
    configs: dict[str, Path]
    jobs: dict[str, str]
    keys: dict[str, str]
    logs: dict[str, Path]
    cluster: LiveCluster


def _command(log: Path, sleep: str, mark: str) -> str:
    line = 'echo "$LOCKCTL_TICK $LOCKCTL_WORKER $(date +%s.%N)'
    script = f'{line} start" >> {log}; sleep {sleep}; {line} end" >> {log}'
    if sleep == "family":  # a daemon that setsid's away, a grandchild that ignores SIGTERM
        script = (
            f'{line} start" >> {log}; setsid sleep {mark} & '
            f'(trap "" TERM; sleep {mark}) & sleep {mark}'
        )
    return json.dumps(["/bin/sh", "-c", script])


def _spec_text(cluster: LiveCluster, uid: str, logs: dict[str, Path]) -> str:
    jobs = {
        f"{short}-{uid}": {
            "prefix": f'"test/sched-{uid}/{short}/"',
            "schedule": f'"@every {EVERY}s"',
            "command": _command(logs[short], sleep, MARKS[short]),
        }
        for short, sleep in JOBS.items()
    }
    return spec_text(cluster, WORKERS, jobs)


@pytest.fixture(scope="module")
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("sched")
    uid = uuid.uuid4().hex[:8]
    logs = {short: tmp / f"{short}.log" for short in JOBS}
    spec_path = tmp / "locks.hcl"
    spec_path.write_text(_spec_text(live_cluster, uid, logs))
    kv = f"test/sched-{uid}/"
    with minted_workers(live_cluster, spec_path, WORKERS, tmp, uid, kv) as made:
        yield Lab(
            tmp,
            made.configs,
            {short: f"{short}-{uid}" for short in JOBS},
            {short: f"{kv}{short}/.lock" for short in JOBS},
            logs,
            live_cluster,
        )


class Scheduler(SchedulerProcess):
    """One `lockctl schedule` subprocess for one job's own config."""

    def __init__(self, lab: Lab, worker: str, short: str) -> None:
        self.worker = worker
        super().__init__(_job_only_config(lab, worker, short))


def _job_only_config(lab: Lab, worker: str, short: str) -> Path:
    """The worker's config with only this test's job (each test schedules its own job)."""
    raw = json.loads(lab.configs[worker].read_text())
    raw["jobs"] = {lab.jobs[short]: raw["jobs"][lab.jobs[short]]}
    path = lab.tmp / f"{worker}-{short}.json"
    path.write_text(json.dumps(raw))
    return path


@pytest.fixture
def schedulers() -> Iterator[list[Scheduler]]:
    started: list[Scheduler] = []
    yield started
    for scheduler in started:
        scheduler.kill()
    for mark in MARKS.values():  # a test that failed may leave its job's family: by pid
        for pid in pids_with(mark):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _runs(log: Path) -> list[tuple[str, str, float, float]]:
    """(tick, worker, start, end) per run, from the job's own log."""
    starts: dict[tuple[str, str], float] = {}
    runs = []
    for line in log.read_text().splitlines() if log.exists() else []:
        tick, worker, moment, what = line.split()
        if what == "start":
            starts[(tick, worker)] = float(moment)
        else:
            runs.append((tick, worker, starts[(tick, worker)], float(moment)))
    return sorted(runs, key=lambda run: run[2])


def _wait_for_tick_boundary() -> datetime:
    tick = SCHEDULE.next_ticks(datetime.now(timezone.utc), 1)[0]
    time.sleep(max(0.0, tick.timestamp() - time.time() + 0.2))
    return tick


def test_three_schedulers_run_every_tick_exactly_once_without_overlap(
    lab: Lab, schedulers: list[Scheduler]
) -> None:
    for worker in WORKERS:
        schedulers.append(Scheduler(lab, worker, "steady"))
    first = _wait_for_tick_boundary()
    # stop between two ticks (1.5 s after one), not while the tick's 0.2 s job may still run:
    # a run stopped by the stop is `interrupted`, which this test is not about
    time.sleep(8 * EVERY + 1.3)
    stop_at = time.time()
    assert [s.stop() for s in schedulers] == [0, 0, 0], [s.lines for s in schedulers]

    runs = _runs(lab.logs["steady"])
    ticks = [tick for tick, _, _, _ in runs]
    assert len(ticks) == len(set(ticks)), runs  # never twice
    for earlier, later in itertools.pairwise(runs):
        assert later[2] >= earlier[3], (earlier, later)  # no overlap
    records = {r.tick: r for r in Ledger(lab.cluster.management(), lab.keys["steady"]).records()}
    for tick, worker, _, _ in runs:
        record = records[datetime.fromisoformat(tick.replace("Z", "+00:00"))]
        assert (record.outcome, record.worker) == (TickOutcome.SUCCEEDED, worker)
    before_first = first - timedelta(seconds=1)
    due = [t for t in SCHEDULE.next_ticks(before_first, 20) if t.timestamp() <= stop_at - 1]
    missed = [tick_name(t) for t in due if tick_name(t) not in ticks]
    assert not missed, (missed, ticks)  # every tick from the first to the stop was run
    for scheduler in schedulers:
        # one session per replica, kept across ticks; destroyed at the end
        assert len(scheduler.events("session-created")) == 1, scheduler.lines
        assert len(scheduler.events("session-destroyed")) == 1
        assert not any("Traceback" in line for line in scheduler.lines)
        assert scheduler.events("stopped")


def test_sigterm_of_the_running_replica_hands_the_next_tick_to_another(
    lab: Lab, schedulers: list[Scheduler]
) -> None:
    by_worker = {}
    for worker in WORKERS:
        by_worker[worker] = Scheduler(lab, worker, "handover")
        schedulers.append(by_worker[worker])
    # The replicas start mid-interval and may run the current tick late: wait for a tick that
    # starts on time, so its 2 s job is over (killed) well before the next tick.
    boundary = tick_name(_wait_for_tick_boundary())
    deadline = time.time() + 2 * EVERY
    running: list[tuple[str, str]] = []
    while time.time() < deadline and not running:  # a replica whose job has started
        log = lab.logs["handover"]
        lines = log.read_text().splitlines() if log.exists() else []
        running = [
            (ln.split()[0], ln.split()[1])
            for ln in lines
            if ln.endswith("start") and ln.split()[0] >= boundary
        ]
        time.sleep(0.05)
    assert running, "no replica started the job"
    tick, active = running[-1]
    assert by_worker[active].stop(signal.SIGTERM) == 0
    stopped = by_worker[active]
    released = stopped.events("released")
    assert released and released[-1]["child_status"] == 128 + signal.SIGTERM, stopped.lines
    next_tick = tick_name(SCHEDULE.next_ticks(datetime.fromisoformat(tick[:-1] + "+00:00"), 1)[0])

    def taken_over() -> bool:  # the next tick's 2 s job, run to its end by another replica
        return any(r[0] == next_tick and r[1] != active for r in _runs(lab.logs["handover"]))

    # its turn there may come a claim stagger (1 s) after the tick, when the stopped replica
    # was first in its claim order: waited for, within a bound
    wait_until(taken_over, EVERY + 2 + WAIT)
    for worker, scheduler in by_worker.items():
        if worker != active:
            assert scheduler.stop() == 0
    runs = _runs(lab.logs["handover"])
    others = {w: s.events("skipped") for w, s in by_worker.items() if w != active}
    assert [r for r in runs if r[0] == next_tick and r[1] != active], (
        next_tick,
        runs,
        stopped.lines,
        others,
    )
    assert len({r[0] for r in runs}) == len(runs)
    assert stopped.events("session-destroyed")


def test_a_second_scheduler_of_the_same_config_is_refused(
    lab: Lab, schedulers: list[Scheduler]
) -> None:
    first = Scheduler(lab, "worker-1", "single")
    schedulers.append(first)
    time.sleep(1.5)
    second = subprocess.run(
        [*LOCKCTL, "schedule", "--config", str(first.config)],
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert second.returncode == EXIT_ENVIRONMENT, second.stderr
    assert "another `lockctl schedule` runs with this config" in second.stderr
    assert first.process.poll() is None
    assert first.stop() == 0


def _wait_for_event(scheduler: Scheduler, name: str, timeout: float = WAIT) -> list[dict[str, Any]]:
    """The scheduler's `name` events once there is one (or [] after `timeout`)."""
    wait_until(lambda: scheduler.events(name) or scheduler.process.poll() is not None, timeout)
    return scheduler.events(name)


def test_sighup_with_a_bad_config_keeps_the_old_one(lab: Lab, schedulers: list[Scheduler]) -> None:
    scheduler = Scheduler(lab, "worker-2", "reload")
    schedulers.append(scheduler)
    # the config is read and the jobs started: a bad config now is a reload's, not the start's
    assert _wait_for_event(scheduler, "started"), scheduler.lines
    good = scheduler.config.read_text()
    scheduler.config.write_text("{not json")
    scheduler.process.send_signal(signal.SIGHUP)
    refused = _wait_for_event(scheduler, "reload-refused")
    assert scheduler.process.poll() is None
    assert refused and "not a JSON worker config" in refused[0]["error"], scheduler.lines
    scheduler.config.write_text(good)
    scheduler.process.send_signal(signal.SIGHUP)
    assert _wait_for_event(scheduler, "reloaded"), scheduler.lines
    assert scheduler.process.poll() is None
    _wait_for_tick_boundary()
    time.sleep(1.0)
    assert scheduler.stop() == 0
    assert _runs(lab.logs["reload"]), scheduler.lines  # still ticking after the reload


def test_a_sighup_at_any_moment_of_the_start_is_a_reload_never_a_stop(
    lab: Lab, schedulers: list[Scheduler]
) -> None:
    """SIGHUP the instant the scheduler has a handler for it (its first act, before the config
    is read), then again and again, at random moments, until it has started: it never dies of
    it nor stops (a SIGHUP right after start once killed it); it starts, keeps running, and
    stops on SIGTERM alone, exit 0. (That the handlers come before the config is read is
    pinned in-process by tests/unit/test_cli_signals.py.)"""
    rng = random.Random(os.getpid())
    for round_number in range(8):
        scheduler = Scheduler(lab, "worker-3", "hup")
        schedulers.append(scheduler)
        pid = scheduler.process.pid
        give_up_at = time.monotonic() + WAIT
        while not catches(pid, signal.SIGHUP) and scheduler.process.poll() is None:
            assert time.monotonic() < give_up_at, scheduler.lines
            time.sleep(0.0005)
        sent = 0
        while not scheduler.events("started") and scheduler.process.poll() is None:
            scheduler.process.send_signal(signal.SIGHUP)
            sent += 1
            time.sleep(rng.uniform(0, 0.05) if round_number % 2 else 0.2)
        context = (round_number, sent, scheduler.lines)
        assert scheduler.events("started"), context
        time.sleep(0.3)  # a reload asked for after the config was read happens now
        assert scheduler.process.poll() is None, context
        assert not scheduler.events("stopped"), context
        assert scheduler.stop(signal.SIGTERM) == 0, context
        (stopped,) = scheduler.events("stopped")
        assert stopped["signal"] == signal.SIGTERM, context
        assert not any("Traceback" in line for line in scheduler.lines), context


@pytest.mark.parametrize("ending", ["term", "kill9"])
def test_no_process_of_a_job_outlives_its_scheduler(
    lab: Lab, schedulers: list[Scheduler], ending: str
) -> None:
    """The job forks a daemon that setsid's away and a grandchild that ignores SIGTERM; after
    SIGTERM to the scheduler (kill grace 1 s) and after kill -9 of it, /proc holds none of them:
    they live in the job's PID namespace, which dies with its init."""
    short = f"family-{ending}"
    mark = MARKS[short]
    scheduler = Scheduler(lab, "worker-1", short)
    schedulers.append(scheduler)
    assert wait_until(lambda: len(pids_with(mark)) >= 3, 3 * EVERY + 5), scheduler.lines
    if ending == "term":
        assert scheduler.stop(signal.SIGTERM) == 0
        released = scheduler.events("released")
        assert released and released[-1]["child_status"] == 128 + signal.SIGTERM, scheduler.lines
    else:
        scheduler.kill()
    assert wait_until(lambda: not pids_with(mark), 5.0), pids_with(mark)
