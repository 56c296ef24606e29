"""The embedded API's parts that need no Consul: importing it loads none of the CLI's weight (a
fresh interpreter), a run's outcome and its Run's fencing flags (tables), the events that reach
the body, and the bodies the supervisor drives (a thread told to stop; a forked process whose
group is signalled, its `sleep` child dead with it)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from provision.embed import LockLost, Outcome, Run, RunOutcome, RunStopped, SkipReason
from provision.embed.bodies import ProcessBody, ThreadBody
from provision.embed.run import RunEvents
from provision.fencing import BodyFence, FenceBounds
from provision.runner.results import RunResult
from tests.lockctl_process import wait_until

TICK = datetime(2026, 12, 4, 22, 0, 0, tzinfo=timezone.utc)
LOCK_ENV = {
    "LOCKCTL_TICK": "2026-12-04T22:00:00Z",
    "LOCK_KEY": "locks/a/.lock",
    "LOCK_SESSION": "s-1",
    "LOCK_INDEX": "7",
    "LOCK_MODIFY_INDEX": "40",
    "LOCKCTL_JOB": "a",
    "LOCKCTL_WORKER": "worker-1",
}


# a lock confirmed at every look, for as long as a test takes: only what the test does ends a body
FRESH = BodyFence(
    FenceBounds(fence_after=600.0, kill_after=610.0, kill_grace=10.0),
    time.monotonic,
    time.monotonic,
    lambda follower: lambda: None,
)


def next_tick(tick: datetime) -> datetime:
    return tick + timedelta(seconds=2)


def test_importing_it_loads_no_cli_typer_rich_or_jinja() -> None:
    code = (
        "import sys, provision.embed\n"
        "heavy = ('typer', 'rich', 'jinja2', 'click', 'provision.cli')\n"
        "print([m for m in sys.modules if m.startswith(heavy)])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("result", "ran", "succeeded"),
    [
        (RunResult(Outcome.RAN, 0, 7, TICK, duration=0.5), True, True),
        (RunResult(Outcome.RAN, 1, 7, TICK, duration=0.5), True, False),
        (RunResult(Outcome.SKIPPED, 0, tick=TICK, skip=SkipReason.TAKEN), False, False),
        (RunResult(Outcome.MISSED, 0, tick=TICK), False, False),
        (RunResult(Outcome.LOST, 3, 7, TICK, duration=4.0), True, False),
    ],
)
def test_outcome_of_a_result(result: RunResult, ran: bool, succeeded: bool) -> None:
    outcome = RunOutcome.of(result)
    assert (outcome.ran, outcome.succeeded) == (ran, succeeded)
    assert outcome.skip is result.skip and outcome.tick == result.tick
    assert outcome.exit_status == (result.exit_code if ran else None)


@pytest.mark.parametrize(
    ("event", "lost", "stopping", "raises"),
    [
        ("renewed", False, False, None),
        ("fenced", True, True, LockLost),
        ("timed-out", False, True, RunStopped),
    ],
)
def test_events_reach_the_run(
    event: str, lost: bool, stopping: bool, raises: type[Exception] | None
) -> None:
    stream = io.StringIO()
    events = RunEvents("a", "worker-1", stream, "flag")
    run = events.run = Run.from_lock_env(LOCK_ENV)
    assert (run.tick, run.lock_index, run.session) == (TICK, 7, "s-1")
    events.emit(event, reason="session invalidated (renew answered 404)")
    assert json.loads(stream.getvalue())["event"] == event  # written before the run is told
    assert (run.lost.is_set(), run.stopping.is_set()) == (lost, stopping)
    if raises is None:
        run.check()
    else:
        with pytest.raises(raises):
            run.check()


def test_a_thread_body_is_told_not_killed() -> None:
    seen: list[str] = []

    def body(run: Run) -> None:
        while not run.stopping.wait(0.01):
            pass
        seen.append(run.reason or "")
        run.check()

    thread = ThreadBody(body, RunEvents("a", "w", io.StringIO(), "flag"), next_tick)
    thread.start(LOCK_ENV, FRESH)
    assert thread.run is not None and thread.run.deadline == next_tick(TICK)
    assert thread.tree_alive() and thread.exit_status is None
    assert thread.signal_tree(signal.SIGTERM)  # only tells it
    assert thread.wait() == 1 and not thread.tree_alive()
    assert seen == ["stopped (SIGTERM)"]
    assert thread.output_tails() == (None, "RunStopped: stopped (SIGTERM)")


def test_a_thread_body_told_why_keeps_that_reason_over_the_signal_s() -> None:
    """An operator's abort: the body's run.check() raises with who asked and why, not with
    the SIGTERM that follows (the first reason given is kept)."""
    thread = ThreadBody(lambda run: run.stopping.wait(10) and run.check(), _events(), next_tick)
    thread.start(LOCK_ENV, FRESH)
    thread.tell("aborted by ops at 2026-12-07T03:00:00Z: stuck")
    thread.signal_tree(signal.SIGTERM)  # only tells it: the reason stays the first one
    assert thread.wait() == 1
    assert thread.output_tails() == (
        None,
        "RunStopped: aborted by ops at 2026-12-07T03:00:00Z: stuck",
    )


def _events() -> RunEvents:
    return RunEvents("a", "w", io.StringIO(), "flag")


def test_a_process_body_dies_with_its_namespace(tmp_path: Path) -> None:
    pid_file = tmp_path / "sleep.pid"
    # the host's PID of the child: in the body's PID namespace, Popen's pid is another number
    code = "import os, sys, time; open(sys.argv[1], 'w').write(os.readlink('/proc/self') + ' ')"
    code += "; time.sleep(300)"

    def body(run: Run) -> None:
        subprocess.Popen([sys.executable, "-c", code, str(pid_file)])
        while True:
            time.sleep(0.1)

    forked = ProcessBody(body, RunEvents("a", "w", io.StringIO(), "flag"), next_tick)
    forked.start(LOCK_ENV, FRESH)
    assert wait_until(lambda: pid_file.exists() and pid_file.read_text().endswith(" "), 10)
    sleeper = int(pid_file.read_text())
    assert forked.containment == "pid-namespace" and forked.warning is None
    assert forked.pid != os.getpid() and forked.tree_alive()
    assert forked.signal_tree(signal.SIGKILL)
    assert forked.wait() == 128 + signal.SIGKILL
    assert wait_until(lambda: not forked.tree_alive(), 10)
    assert wait_until(lambda: not _alive(sleeper), 10)


def test_a_process_body_that_returns_exits_0() -> None:
    forked = ProcessBody(lambda run: None, RunEvents("a", "w", io.StringIO(), "flag"), next_tick)
    forked.start(LOCK_ENV, FRESH)
    assert forked.wait() == 0 and forked.exit_status == 0
    assert wait_until(lambda: not forked.tree_alive(), 10)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


CONFIG = {
    "format": 1,
    "worker": "worker-1",
    "consul": {"address": "http://127.0.0.1:8500", "token_file": "/nonexistent/worker-1.token"},
    "jobs": {
        "a": {
            "lock_key": "locks/a/.lock",
            "ttl": "10s",
            "lock_delay": "4s",
            "renew_interval": "1s",
            "kill_grace": "1s",
            "schedule": "@every 2s",
            "workers": ["worker-1"],
        }
    },
}


@pytest.mark.parametrize(
    ("environ", "with_config", "message"),
    [
        ({}, False, "LOCKCTL_CONFIG: not set (the worker config with the jobs)"),
        ({"LOCKCTL_WORKER": "worker-2"}, True, "LOCKCTL_WORKER: 'worker-2', but {path} is for"),
        ({"CONSUL_HTTP_TOKEN_FILE": "/nonexistent/t"}, True, "/nonexistent/t: cannot read"),
    ],
)
def test_from_env_refuses_in_one_line(
    tmp_path: Path, environ: dict[str, str], with_config: bool, message: str
) -> None:
    from provision.embed import Locker
    from provision.errors import InputError

    path = tmp_path / "lockctl.json"
    path.write_text(json.dumps(CONFIG))
    env = {**environ, "LOCKCTL_CONFIG": str(path)} if with_config else dict(environ)
    with pytest.raises(InputError) as raised:
        Locker.from_env(env)
    assert str(raised.value).startswith(message.format(path=path))
    assert "\n" not in str(raised.value)
