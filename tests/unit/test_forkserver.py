"""The scheduler's namespace helper (runner/forkserver.py, nsserver.py), on real processes: the
job it forks gets what the one-shot `unshare` path gives (its own PID namespace and /proc, the
lock's variables, its exit status as a shell has it, signals to every process of its tree, none
of it alive after a SIGKILL), nothing of the helper's descriptors, and the chain of PDEATHSIG:
the scheduler killed with -9 leaves no job alive. Shell scripts with children, a setsid'd
daemon and a program that ignores SIGTERM, as users write them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.runner.child import Child
from provision.runner.containment import PID_NAMESPACE
from provision.runner.forkserver import ForkServer
from tests.integration.procscan import pids_with
from tests.lockctl_process import wait_until

MARK = f"300.{os.getpid()}7"


@pytest.fixture
def forks() -> Iterator[ForkServer]:
    server = ForkServer()
    server.start()
    yield server
    server.close()


def started(forks: ForkServer, script: str, **lock_env: str) -> Child:
    child = Child(["sh", "-c", script], dict(os.environ), forks)
    child.start(lock_env)
    assert child.containment == PID_NAMESPACE and child.warning is None
    return child


def test_the_job_gets_its_own_namespace_proc_and_the_locks_variables(
    forks: ForkServer, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    child = started(
        forks,
        f'echo "$$ $LOCKCTL_TICK" > {out}; ls /proc | grep -c "^[0-9]" >> {out}; '
        f"ls /proc/self/fd >> {out}",
        LOCKCTL_TICK="2026-12-02T00:00:00Z",
    )
    assert child.wait() == 0
    head, processes, *fds = out.read_text().splitlines()
    assert head == "2 2026-12-02T00:00:00Z"  # PID 2: the init is PID 1
    # its /proc shows the namespace only: the init, the shell, ls/grep; not this machine's
    assert int(processes) <= 5
    # the helper's sockets and pipes did not leak into the job: stdin/out/err and ls's own dir
    assert set(fds) <= {"0", "1", "2", "3"}


@pytest.mark.parametrize(
    ("script", "status"), [("exit 3", 3), ("kill -USR1 $$", 128 + signal.SIGUSR1), ("true", 0)]
)
def test_the_exit_status_is_the_jobs_as_a_shell_reports_it(
    forks: ForkServer, script: str, status: int
) -> None:
    child = started(forks, script)
    assert child.wait() == status
    assert child.exit_status == status and not child.tree_alive()


def test_signals_reach_the_whole_tree_and_sigkill_leaves_nothing(
    forks: ForkServer, tmp_path: Path
) -> None:
    got = tmp_path / "daemon-got"
    script = (
        f"setsid sh -c 'trap \"echo TERM > {got}; exit 0\" TERM; sleep {MARK}1 & wait' & "
        f"sh -c 'trap \"\" TERM; sleep {MARK}2 & wait' & trap '' TERM; wait"
    )  # the job's main process ignores TERM too: its end would end the namespace
    child = started(forks, script)
    assert wait_until(lambda: len(pids_with(f"{MARK}1") + pids_with(f"{MARK}2")) == 2)
    assert child.signal_tree(signal.SIGTERM)
    assert wait_until(got.exists), "the setsid'd daemon never got the SIGTERM"
    time.sleep(0.2)
    assert child.tree_alive(), "the TERM-ignoring program and its sleep live on"
    assert pids_with(f"{MARK}2"), "ignoring TERM, it is still there"
    child.signal_tree(signal.SIGKILL)
    assert child.wait() == 128 + signal.SIGKILL
    assert not child.tree_alive()
    assert pids_with(f"{MARK}1") == [] and pids_with(f"{MARK}2") == []


def test_jobs_forked_from_many_threads_at_once_each_get_their_own(forks: ForkServer) -> None:
    results: dict[int, int] = {}

    def one(n: int) -> None:
        child = Child(["sh", "-c", f'[ "$LOCK_INDEX" = {n} ] && exit {n % 7}'], os.environ, forks)
        child.start({"LOCK_INDEX": str(n)})
        results[n] = child.wait()
        child.close()

    threads = [threading.Thread(target=one, args=(n,)) for n in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == {n: n % 7 for n in range(40)}


def test_a_job_not_started_is_gone_when_aborted(forks: ForkServer) -> None:
    child = Child(["sleep", f"{MARK}3"], dict(os.environ), forks)
    child.abort()  # the lock was not ours: the prepared init dies, and its keeper
    child.close()
    assert pids_with(f"{MARK}3") == []


def test_without_its_helper_the_job_dies_and_the_next_one_starts_the_one_shot_way(
    forks: ForkServer,
) -> None:
    child = started(forks, f"sleep {MARK}4")
    assert forks._process is not None
    os.kill(forks._process.pid, signal.SIGKILL)  # the helper is ours: we started it
    assert child.wait() == 128 + signal.SIGKILL  # keeper, init and job died with it
    assert wait_until(lambda: pids_with(f"{MARK}4") == [])
    later = Child(["sh", "-c", "exit 4"], dict(os.environ), forks)  # unshare + nsinit now
    later.start({})
    assert later.containment == PID_NAMESPACE and later.wait() == 4


SCHEDULER = f"""
import os, sys, time
from provision.runner.child import Child
from provision.runner.forkserver import ForkServer
forks = ForkServer()
forks.start()
child = Child(["sh", "-c", "setsid sleep {MARK}5 & sleep {MARK}6"], dict(os.environ), forks)
child.start({{}})
print("started", flush=True)
time.sleep(60)
"""


def test_a_scheduler_killed_with_sigkill_leaves_no_job_alive() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", SCHEDULER], stdout=subprocess.PIPE, text=True
    ) as scheduler:
        try:
            assert scheduler.stdout is not None and scheduler.stdout.readline() == "started\n"
            assert wait_until(lambda: len(pids_with(f"{MARK}5") + pids_with(f"{MARK}6")) == 2)
            scheduler.kill()  # ours: we started it
            scheduler.wait()
            assert wait_until(lambda: pids_with(f"{MARK}5") + pids_with(f"{MARK}6") == []), (
                "a job outlived its scheduler"
            )
        finally:
            scheduler.kill()
