"""A plain lock's run (runner/plain.py, on the tick core's pieces) inside one long-lived
process, on the real cluster: it runs a job a thousand times without leaking a thread, a file
descriptor or a session, and a stop request at any moment (waiting, right after acquiring,
while the job runs, during the cleanup) ends the run with its session destroyed.

The jobs are shell scripts with children (a background sleep, a TERM-ignoring grandchild), not a
single process. It runs in the test process itself, which has children of its own (the
cluster's agents are not ours, but other tests' processes may be): the run must leave them be.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from procscan import pids_with

from provision.consul import AgentClock, Consul
from provision.outcomes import Outcome
from provision.runner.events import EventLog
from provision.runner.plain import PlainAsk, run_plain_on_core
from provision.runner.results import RunOptions, RunResult
from provision.runner.stop import StopRequest
from provision.timings import JobTimings
from provision.workers.config import JobConfig

if TYPE_CHECKING:
    pass

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("subreaper")]

WORKER = "worker-1"
TIMINGS = JobTimings(ttl=10.0, lock_delay=4.0, renew_interval=1.0, kill_grace=1.0, min_hold=0.0)
RUNS = 1000
# Sockets the client's HTTP pool may add after the warm-up and keep, however many runs: requests
# that overlap more on a loaded machine (a renewal, the key's watch, a release at once) open
# another pooled connection. A socket leaked per run would be hundreds.
POOL_GROWTH = 4
# A script with a child: the child ends with it (no leftovers, so each run is quick).
SCRIPT_WITH_CHILD = ["sh", "-c", "sleep 0 & wait; exit 3"]


@pytest.fixture
def job(consul: Consul) -> Iterator[JobConfig]:
    uid = uuid.uuid4().hex[:8]
    yield JobConfig(f"engine-{uid}", f"test/engine-{uid}/.lock", TIMINGS, None)
    consul.kv.delete(f"test/engine-{uid}/", recurse=True)


class StopOn(io.StringIO):
    """An event stream that requests a stop when a given event is written (a precise moment)."""

    def __init__(self, stop: StopRequest, event: str) -> None:
        super().__init__()
        self.stop, self.event = stop, event

    def write(self, text: str) -> int:
        written = super().write(text)
        if json.loads(text)["event"] == self.event:
            self.stop.request()
        return written

    def events(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.getvalue().splitlines()]


def _open_fds() -> dict[int, str]:
    """Each open descriptor and what it is. The listing's own descriptor is closed by the time
    it is read (and its number may differ between listings): left out, never a failure."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            found[int(name)] = os.readlink(f"/proc/self/fd/{name}")
    return found


def _sessions(consul: Consul, job: JobConfig) -> list[str]:
    """The plain lock's sessions for this job (named `lockctl <job> on <worker>`)."""
    return [
        s.id for s in consul.session.list(node=WORKER) if s.name.startswith(f"lockctl {job.name} ")
    ]


def _run(
    consul: Consul, job: JobConfig, command: list[str], stop: StopRequest, **kw: object
) -> RunResult:
    events = EventLog(job.name, WORKER, kw.pop("stream", io.StringIO()))  # type: ignore[arg-type]
    options = RunOptions(**kw)  # type: ignore[arg-type]
    ask = PlainAsk(job, WORKER, tuple(command), options)
    return run_plain_on_core(consul, AgentClock(), ask, events, stop)


def test_a_thousand_runs_in_one_process_leak_no_thread_fd_or_session(
    consul: Consul, job: JobConfig
) -> None:
    stop = StopRequest()
    for _ in range(3):  # warm up: the HTTP pool's connections (renewer, watcher, main thread)
        _run(consul, job, SCRIPT_WITH_CHILD, stop)
    threads, fds = threading.active_count(), _open_fds()
    outcomes = [_run(consul, job, SCRIPT_WITH_CHILD, stop) for _ in range(RUNS)]
    assert {(r.outcome, r.exit_code) for r in outcomes} == {(Outcome.RAN, 3)}
    assert len({r.lock_index for r in outcomes}) == RUNS  # each run held the lock anew
    assert threading.active_count() == threads
    opened = {fd: what for fd, what in _open_fds().items() if fd not in fds}
    assert {fd: what for fd, what in opened.items() if not what.startswith("socket:")} == {}
    assert len(opened) <= POOL_GROWTH, opened
    assert _sessions(consul, job) == []


def test_a_stop_while_waiting_ends_the_wait_and_destroys_the_session(
    consul: Consul, job: JobConfig
) -> None:
    holder = consul.session.create(name=f"holder {job.name}", ttl=10, lock_delay=0)
    try:
        assert consul.kv.put(job.lock_key, b"", acquire=holder)
        stop = StopRequest()
        stream = StopOn(stop, "never")
        threading.Timer(0.5, stop.request).start()
        began = time.monotonic()
        result = _run(consul, job, ["true"], stop, wait=True, stream=stream)
        assert result.outcome is Outcome.INTERRUPTED and result.exit_code == 128 + 15
        # the stop ended the wait: the holder's session (TTL 10 s, never renewed) was still on
        assert time.monotonic() - began < 8
        assert _sessions(consul, job) == []
        kinds = [(e["event"], e.get("signal")) for e in stream.events()]
        assert kinds == [("waiting", None), ("interrupted", "SIGTERM")]
    finally:
        consul.session.destroy(holder)


MARK = f"30.{uuid.uuid4().int % 10**6:06d}"  # a `sleep` argument no other process has
TERM_IGNORING_TREE = [
    "sh",
    "-c",
    # a TERM-ignoring grandchild in a session of its own, and the script waits for it
    f"setsid sh -c 'trap \"\" TERM; sleep {MARK}' & wait",
]


@pytest.mark.parametrize(
    ("moment", "outcomes"),
    [
        ("acquired", {Outcome.INTERRUPTED}),  # right after acquiring, the job just started
        ("renewed", {Outcome.INTERRUPTED}),  # while the job runs
        ("released", {Outcome.RAN}),  # during the cleanup: changes nothing
    ],
)
def test_a_stop_at_any_moment_ends_the_run_and_destroys_the_session(
    consul: Consul, job: JobConfig, moment: str, outcomes: set[Outcome], tmp_path: Path
) -> None:
    stop = StopRequest()
    stream = StopOn(stop, moment)
    command = ["sh", "-c", "sleep 2"] if moment == "released" else TERM_IGNORING_TREE
    began = time.monotonic()
    result = _run(consul, job, command, stop, stream=stream)
    assert result.outcome in outcomes
    assert time.monotonic() - began < 2 + TIMINGS.kill_grace + 2
    assert pids_with(MARK) == []  # the TERM-ignoring grandchild too
    assert _sessions(consul, job) == []
    kinds = [e["event"] for e in stream.events()]
    assert kinds[0] == "acquired" and kinds[-1] == "released"
    assert not consul.kv.get(job.lock_key)[0] or not consul.kv.get(job.lock_key)[0].session
