"""The embedded body's fencing, without Consul: the decisions as tables (past_fence, what
run.check() answers, what the warden of an isolated body does), and an isolated body's real
process tree (tests/apps/isolated_app.py: a child, and a setsid'd child deaf to SIGTERM) when
its app is killed or stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

from provision.embed import LockLost, Run, RunStopped
from provision.embed.run import Vouch
from provision.embed.warden import SharedConfirmation, _facts
from provision.fencing import Action, FenceBounds, decide, past_fence
from tests.lockctl_process import eventually

ROOT = Path(__file__).resolve().parents[2]
BOUNDS = FenceBounds(fence_after=2.0, kill_after=3.0, kill_grace=1.0)


@pytest.mark.parametrize(
    ("now", "confirmed_at", "passed"),
    [
        (10.0, 9.0, False),  # one second after the confirmation: well inside
        (10.999, 9.0, False),  # a millisecond before the bound
        (11.0, 9.0, True),  # at the bound: no longer vouched for
        (50.0, 9.0, True),  # long after (a pause)
        (10.0, float("-inf"), True),  # never confirmed
        (10.0, 10.5, False),  # a confirmation sent "after" now: a later reader's clock
    ],
)
def test_past_fence(now: float, confirmed_at: float, passed: bool) -> None:
    assert past_fence(now, confirmed_at, 2.0) is passed


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_run(clock: FakeClock, confirmed: list[float]) -> Run:
    run = Run("job", "worker-1", datetime(2026, 12, 6, tzinfo=timezone.utc), 4, "s")
    run.vouch = Vouch(clock, lambda: confirmed[-1], BOUNDS.fence_after)
    return run


@pytest.mark.parametrize(
    ("elapsed", "told", "raises"),
    [
        (0.5, None, None),  # confirmed, nobody said anything: go on
        (1.99, None, None),
        (2.0, None, LockLost),  # the bound passed, the supervisor has not run yet: lost
        (40.0, None, LockLost),  # after a pause of the whole process
        (0.5, "lost", LockLost),  # the supervisor said so (Consul: the key changed)
        (0.5, "stop", RunStopped),  # a timeout or close()
    ],
)
def test_check_judges_the_bound_itself(
    elapsed: float, told: str | None, raises: type[Exception] | None
) -> None:
    clock = FakeClock()
    run = make_run(clock, [clock.now])
    clock.now += elapsed
    if told is not None:
        run._fence(told, lost=told == "lost")
    if raises is None:
        run.check()
        assert not run.lost.is_set() and not run.stopping.is_set()
    else:
        with pytest.raises(raises):
            run.check()
        assert run.stopping.is_set()
        assert run.lost.is_set() is (raises is LockLost)


class PassingBetweenReads:
    """A clock that is inside the bound at its first reading and past it ever after: the
    bound passes in the middle of one check()."""

    def __init__(self) -> None:
        self.readings = 0

    def __call__(self) -> float:
        self.readings += 1
        return 100.0 if self.readings == 1 else 140.0


def test_a_bound_that_passes_during_check_is_said_lost_not_stopped() -> None:
    run = Run("job", "worker-1", datetime(2026, 12, 6, tzinfo=timezone.utc), 4, "s")
    run.vouch = Vouch(PassingBetweenReads(), lambda: 100.0, BOUNDS.fence_after)
    with contextlib.suppress(LockLost):  # inside the bound when judged: it may return
        run.check()  # but a plain RunStopped is wrong
    with pytest.raises(LockLost, match="no confirmation of the lock in time"):
        run.check()


def test_a_newer_confirmation_moves_the_bound() -> None:
    clock = FakeClock()
    confirmed = [clock.now]
    run = make_run(clock, confirmed)
    clock.now += 1.5
    confirmed.append(clock.now)  # a renewal sent now succeeded
    clock.now += 1.5  # 3 s after the first, 1.5 s after the newest
    run.check()
    clock.now += 0.5
    with pytest.raises(LockLost, match="no confirmation of the lock in time"):
        run.check()


def test_lost_wait_returns_at_the_bound_without_anyone_setting_it() -> None:
    run = Run("job", "worker-1", datetime(2026, 12, 6, tzinfo=timezone.utc), 4, "s")
    confirmed_at = time.monotonic()
    run.vouch = Vouch(time.monotonic, lambda: confirmed_at, 0.3)
    assert not run.lost.wait(0.05)  # inside the bound: a plain timeout
    assert run.lost.wait(30)  # nobody calls set(): the wait itself judges the bound
    assert time.monotonic() >= confirmed_at + 0.3
    assert run.reason == "no confirmation of the lock in time"


def test_a_set_from_another_thread_wakes_a_waiter() -> None:
    run = Run("job", "worker-1", datetime(2026, 12, 6, tzinfo=timezone.utc), 4, "s")
    run.vouch = Vouch(time.monotonic, time.monotonic, 60.0)  # always freshly confirmed
    threading.Timer(0.05, lambda: run._fence("the lock key changed", lost=True)).start()
    assert run.lost.wait(30)
    assert run.reason == "the lock key changed"


@pytest.mark.parametrize(
    ("elapsed", "terminated", "gone", "action", "wake_in"),
    [
        (0.5, None, False, Action.KEEP_GOING, 1.5),  # sleep until fence_after
        (2.0, None, False, Action.TERMINATE, None),  # SIGTERM to the namespace
        (2.5, 2.0, False, Action.KEEP_GOING, 0.5),  # the grace runs, up to kill_after
        (3.0, 2.0, False, Action.KILL, None),  # kill_after: SIGKILL, whatever the grace
        (0.5, None, True, Action.TERMINATE, None),  # the app is gone: the lock is lost
        (1.6, 0.5, True, Action.KILL, None),  # ... and the grace is over
    ],
)
def test_the_warden_s_decisions(
    elapsed: float, terminated: float | None, gone: bool, action: Action, wake_in: float | None
) -> None:
    start = 1000.0
    facts = _facts(start + elapsed, start, None if terminated is None else start + terminated, gone)
    decision = decide(facts, BOUNDS)
    assert decision.action is action
    if action is Action.TERMINATE:
        assert decision.signum == signal.SIGTERM
    if action is Action.KILL:
        assert decision.signum == signal.SIGKILL
    if wake_in is not None:
        assert decision.wake_at == pytest.approx(start + elapsed + wake_in)


def test_shared_confirmation_reads_what_was_written_across_a_fork() -> None:
    shared = SharedConfirmation(12.5)
    assert shared.read() == 12.5
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child sees the parent's later writes: memory shared, not copied
        os.close(reader)
        deadline = time.monotonic() + 10
        while shared.read() != 99.25 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.write(writer, str(shared.read()).encode())
        os._exit(0)
    os.close(writer)
    shared.write(99.25)
    assert os.read(reader, 64) == b"99.25"
    os.waitpid(pid, 0)
    os.close(reader)
    shared.close()


# -- the isolated body's real process tree ----------------------------------------------------
class IsolatedApp:
    def __init__(self, state: Path, fence_after: float, kill_after: float) -> None:
        self.state = state
        argv = [str(state), str(fence_after), str(kill_after), "600"]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.apps.isolated_app", *argv],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )

    def children(self) -> list[int]:
        def read() -> list[int]:
            paths = [self.state / f"child-{n}.pid" for n in (1, 2)]
            return [int(p.read_text()) for p in paths] if all(p.exists() for p in paths) else []

        pids = eventually(read, timeout=30)
        assert pids, "the body's children did not start"
        return list(pids)

    def checks(self) -> list[str]:
        path = self.state / "checks"
        return path.read_text().splitlines() if path.exists() else []

    def containment(self) -> str:
        return (self.state / "keeper.pid").read_text().split()[1]

    def end(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)
            self.process.kill()
        self.process.wait(30)
        assert self.process.stdout is not None
        self.process.stdout.close()


@pytest.fixture
def isolated(tmp_path: Path) -> Iterator[list[IsolatedApp]]:
    made: list[IsolatedApp] = []
    yield made
    for app in made:
        app.end()


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_killed_app_takes_the_isolated_body_s_whole_tree(
    tmp_path: Path, isolated: list[IsolatedApp]
) -> None:
    app = IsolatedApp(tmp_path, fence_after=60.0, kill_after=70.0)  # only the kill can end it
    isolated.append(app)
    children = app.children()
    assert app.containment() == "pid-namespace"
    assert all(alive(pid) for pid in children)
    os.kill(app.process.pid, signal.SIGKILL)
    app.process.wait(30)
    gone = eventually(lambda: not any(alive(pid) for pid in children), timeout=15)
    assert gone, "a child of the body outlived its killed app"


def test_a_stopped_app_s_body_is_ended_by_its_warden_by_kill_after(
    tmp_path: Path, isolated: list[IsolatedApp]
) -> None:
    app = IsolatedApp(tmp_path, fence_after=1.5, kill_after=2.5)
    isolated.append(app)
    children = app.children()
    # the body's check() keeps passing past fence_after from the start: the confirmations
    # the app sends reach the body's process through its warden
    assert eventually(lambda: any(x != "lost" and float(x) > 3.0 for x in app.checks()), 30)
    os.kill(app.process.pid, signal.SIGSTOP)  # the app alone, not its body
    stopped_at = time.monotonic()  # the newest confirmation was sent before this
    # The warden alone can end them while the app stays stopped (the children sleep 300 s,
    # one ignores SIGTERM). How soon after kill_after is the machine's scheduling, not the
    # warden's decision (tested in virtual time): poll, bounded, rather than sleep a margin.
    ended = eventually(lambda: not any(alive(pid) for pid in children), 30)
    late = time.monotonic() - stopped_at
    survivors = [pid for pid in children if alive(pid)]
    assert ended and not survivors, f"alive {late:.2f} s after the app stopped: {survivors}"
    assert eventually(lambda: "lost" in app.checks(), 30), "run.check() went on passing"
    os.kill(app.process.pid, signal.SIGCONT)
    assert app.process.wait(30) == 0
    assert app.process.stdout is not None
    assert app.process.stdout.read().strip() == str(128 + signal.SIGKILL)
