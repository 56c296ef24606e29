"""The tick core on real parts: two replicas' `TickCore`s, each on its own agent's Consul
(ConsulTickStore), in real time (ThreadTimerClock: one thread runs each core, as a
VirtualClock does in the simulator), running real process trees (runner/core_body.py: the
job in its PID namespace, a setsid'd leftover killed before the run is said to have ended).

What the simulator proves of the core's decisions in virtual time, this shows on Consul and on
processes: every tick of the window has one record, and a tick that ran ran once, on the worker
and under the fencing token its record names, with tokens growing tick by tick; nothing the job
started outlives its run; a stop completes the runs and destroys the sessions."""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from procscan import pids_with

from provision.consul import AgentClock, Consul
from provision.ledger.records import TickOutcome, TickRecord, parse_tick_name
from provision.ledger.store import Ledger
from provision.runner.core_body import Command, RunnerBody, call_of
from provision.runner.environment import job_environment
from provision.schedule import parse_schedule
from provision.system.http_call import HttpCall
from provision.tick.clock import ThreadTimerClock
from provision.tick.consul_store import ConsulTickStore
from provision.tick.core import CoreJob, Identity, TickCore
from provision.tick.edge import Note
from provision.tick.store import JobKeys
from provision.timings import JobTimings

if TYPE_CHECKING:
    from conftest import LiveCluster

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("subreaper")]

WORKERS = ("worker-1", "worker-2")
EVERY = 2  # seconds between ticks
RUN_FOR = 12.0  # seconds the replicas run
# a tick nobody ran is recorded missed once its window (2 s) and MISSED_GRACE (2 s) passed: the
# window judged ends that long, and a margin, before the stop
SETTLED_AFTER = 6.0
SETTLE = 20.0  # seconds a stop may take to complete the runs and destroy the sessions
TIMINGS = JobTimings(ttl=10.0, lock_delay=4.0, renew_interval=1.0, kill_grace=1.0)


@dataclass
class Replica:
    """One replica: its core, the thread that runs its clock, what its listener heard."""

    core: TickCore
    clock: ThreadTimerClock
    consul: Consul
    notes: list[Note] = field(default_factory=list)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.clock.call_at(self.clock.monotonic(), self.core.start)
        self.thread = threading.Thread(target=self.clock.run, name=self.core.worker)
        self.thread.start()

    def stop(self) -> None:
        """Stop the core in its own thread; end its clock once its runs are completed."""
        done = threading.Event()

        def look() -> None:
            if self.core.runs:
                self.clock.call_later(0.1, look)
            else:
                done.set()

        self.clock.call_at(self.clock.monotonic(), self.core.stop)
        self.clock.call_later(0.1, look)
        assert done.wait(SETTLE), f"{self.core.worker}: runs not completed: {self.notes[-8:]}"
        self.clock.close()
        assert self.thread is not None
        self.thread.join(SETTLE)
        assert not self.thread.is_alive()


@dataclass(frozen=True)
class Lab:
    jobs: tuple[CoreJob, ...]  # two commands, then an HTTP job
    oracle: Path  # one line per command's run: job tick worker lock-index
    marker: str  # in the argv of every leftover the commands start
    app: str  # the HTTP job's URL
    calls: Path  # what the app was sent: one JSON line per call

    @property
    def web(self) -> CoreJob:
        return self.jobs[-1]


class App(BaseHTTPRequestHandler):
    """The HTTP job's app: each call's headers as an oracle line, and its Idempotency-Key."""

    oracle: Path

    def do_POST(self) -> None:
        said = [self.headers[h] for h in ("X-Lockctl-Job", "X-Lockctl-Tick", "X-Lockctl-Worker")]
        line = [*said, self.headers["X-Lockctl-Lock-Index"], self.headers["Idempotency-Key"]]
        with self.oracle.open("a") as oracle:
            oracle.write(json.dumps(line) + "\n")
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        """Quiet: the calls are in the oracle."""


@pytest.fixture
def app(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    calls = tmp_path / "calls"
    handler = type("Handler", (App,), {"oracle": calls})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/job", calls
    server.shutdown()
    server.server_close()
    thread.join(10)


def _job_script(oracle: Path, marker: str) -> str:
    """The job: a line for the oracle, a setsid'd leftover that ignores SIGTERM and would sleep
    a minute, a child it waits for."""
    leftover = f"setsid sh -c 'trap \"\" TERM; exec sleep 6{marker}' >/dev/null 2>&1 &"
    line = f'echo "$LOCKCTL_JOB $LOCKCTL_TICK $LOCKCTL_WORKER $LOCK_INDEX" >> {oracle}'
    return f"{line}; {leftover} sleep 0.3 & wait $!"


@pytest.fixture
def lab(tmp_path: Path, live_cluster: LiveCluster, app: tuple[str, Path]) -> Iterator[Lab]:
    uid = uuid.uuid4().hex[:8]
    schedule = parse_schedule(f"@every {EVERY}s")
    jobs = tuple(
        CoreJob(JobKeys(f"core-{name}-{uid}", f"test/core-{name}-{uid}/.lock"), schedule, TIMINGS)
        for name in ("a", "b", "web")
    )
    marker = str(int(uuid.uuid4().int % 10**9)).zfill(9)  # digits: `sleep 6<marker>`
    url, calls = app
    yield Lab(jobs, tmp_path / "oracle", f".{marker}", url, calls)
    consul = live_cluster.management()
    for job in jobs:
        consul.kv.delete(job.keys.lock_key.removesuffix(".lock"), recurse=True)


def _replica(live: LiveCluster, worker: str, lab: Lab) -> Replica:
    agent = AgentClock()  # the client teaches it the agent's clock; the core's clock reads it
    consul = Consul(live.management(worker).settings, agent_clock=agent)
    clock = ThreadTimerClock(agent)
    script = _job_script(lab.oracle, lab.marker)
    environment = job_environment(os.environ)
    makers = {job.name: Command(("sh", "-c", script), environment).prepare for job in lab.jobs}
    makers[lab.web.name] = call_of(HttpCall(lab.app, method="POST", timeout=10.0))
    locks = {job.name: job.keys.lock_key for job in lab.jobs}
    notes: list[Note] = []
    core = TickCore(
        ConsulTickStore(consul),
        clock,
        Identity(worker, host=worker, pid=os.getpid()),
        lab.jobs,
        lambda job, tick: RunnerBody(makers[job], locks[job], clock),
        notes.append,
    )
    return Replica(core, clock, consul, notes)


def test_two_replicas_run_each_tick_once_on_consul_with_real_processes(
    live_cluster: LiveCluster, lab: Lab
) -> None:
    replicas = [_replica(live_cluster, worker, lab) for worker in WORKERS]
    started = datetime.now().astimezone()
    for replica in replicas:
        replica.start()
    try:
        time.sleep(RUN_FOR)
    finally:
        for replica in replicas:
            replica.stop()
    stopped = datetime.now().astimezone()

    runs = [line.split() for line in lab.oracle.read_text().splitlines()] + _calls(lab)
    consul = live_cluster.management()
    for job in lab.jobs:
        records = {r.tick: r for r in Ledger(consul, job.keys.lock_key).records()}
        ran = [
            (parse_tick_name(tick), worker, int(index))
            for name, tick, worker, index in runs
            if name == job.name
        ]
        ticks = [tick for tick, _, _ in ran]
        assert len(ticks) == len(set(ticks)), ran  # no tick ran twice
        # every tick of the window, after the first turns and before the stop, has a record
        window = _ticks_between(
            started + timedelta(seconds=EVERY), stopped - timedelta(seconds=SETTLED_AFTER)
        )
        assert window and all(tick in records for tick in window), (window, sorted(records))
        for tick, worker, index in ran:  # a run is its record's: its worker, its token
            record = records[tick]
            assert (record.worker, record.lock_index) == (worker, index), record
            assert record.outcome in (TickOutcome.SUCCEEDED, TickOutcome.INTERRUPTED), record
        assert _tokens_grow(records.values()), sorted(records.values(), key=lambda r: r.tick)
        assert sum(1 for tick in window if records[tick].outcome is TickOutcome.SUCCEEDED) >= 1
    assert pids_with(f"6{lab.marker}") == []  # every leftover was killed before its run ended
    for worker in WORKERS:  # the stop destroyed every session the replica claimed under
        mine = {r.session for r in _all_records(consul, lab) if r.worker == worker}
        live = {s for s in mine if s and consul.session.info(s) is not None}  # each by its ID
        assert not live, f"{worker}: sessions left: {live}"
    completed = [n for replica in replicas for n in replica.notes if n.kind == "completed"]
    assert len(completed) >= len(lab.jobs), [replica.notes[-8:] for replica in replicas]


def _calls(lab: Lab) -> list[list[str]]:
    """The HTTP job's runs as the app saw them (job, tick, worker, lock index), each with the
    run's Idempotency-Key `lockctl run` would send."""
    calls = []
    for line in lab.calls.read_text().splitlines():
        *fields, key = json.loads(line)
        job, tick = fields[0], fields[1]
        assert key == f'"lockctl:{job}:{tick}"', line
        calls.append(fields)
    assert calls, "the HTTP job never ran"
    return calls


def _ticks_between(first: datetime, last: datetime) -> list[datetime]:
    schedule = parse_schedule(f"@every {EVERY}s")
    ticks, tick = [], schedule.next_ticks(first, 1)[0]
    while tick <= last:
        ticks.append(tick)
        tick = schedule.next_ticks(tick, 1)[0]
    return ticks


def _tokens_grow(records: Iterable[TickRecord]) -> bool:
    """The fencing tokens of the ticks that ran, in tick order, only grow."""
    ran = sorted((r for r in records if r.lock_index), key=lambda r: r.tick)
    return all(a.lock_index < b.lock_index for a, b in itertools.pairwise(ran))


def _all_records(consul: Consul, lab: Lab) -> list[TickRecord]:
    return [r for job in lab.jobs for r in Ledger(consul, job.keys.lock_key).records()]
