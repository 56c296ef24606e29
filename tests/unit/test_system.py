"""provision/system/: the deadline loops on a fake clock, atomic writes, stopping by pidfile."""

from __future__ import annotations

import stat
import sys
import time
from pathlib import Path

import pytest

from provision.system.deadline import Deadline, attempts, retry_until, wait_until
from provision.system.files import PUBLIC_MODE, SECRET_MODE, write_atomically
from provision.system.processes import is_running, main, read_pid, spawn, stop_pidfile


class FakeClock:
    """A monotonic clock that moves only when slept on (or told to)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


# --- deadline -------------------------------------------------------------------------------


def test_deadline_counts_down_and_expires() -> None:
    clock = FakeClock()
    deadline = Deadline(2.0, clock)
    assert deadline.remaining() == 2.0 and not deadline.expired()
    clock.now += 2.5
    assert deadline.remaining() == 0.0 and deadline.expired()


def test_attempts_pause_between_tries_and_stop_after_the_deadline() -> None:
    clock = FakeClock()
    tries = list(attempts(Deadline(1.0, clock), 0.25, clock.sleep))
    assert tries == [1, 2, 3, 4, 5]  # at 0, 0.25, 0.5, 0.75 and 1.0 s: expired after the fifth
    assert clock.sleeps == [0.25] * 4


def test_attempts_try_once_even_when_the_deadline_has_passed() -> None:
    clock = FakeClock()
    assert list(attempts(Deadline(0.0, clock), 0.1, clock.sleep)) == [1]
    assert clock.sleeps == []


def test_wait_until_says_whether_the_condition_came_true_in_time() -> None:
    clock = FakeClock()
    ready_at = clock.now + 0.5
    assert wait_until(Deadline(1.0, clock), lambda: clock.now >= ready_at, 0.25, clock.sleep)
    assert clock.now == pytest.approx(ready_at)
    assert not wait_until(Deadline(1.0, clock), lambda: False, 0.1, clock.sleep)


def test_retry_until_retries_the_named_errors_then_returns() -> None:
    clock = FakeClock()
    answers: list[object] = [ConnectionError("down"), ConnectionError("down"), "ok"]

    def attempt() -> object:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    deadline = Deadline(5.0, clock)
    result = retry_until(deadline, attempt, retry_on=(OSError,), pause=0.5, sleep=clock.sleep)
    assert result == "ok"
    assert clock.sleeps == [0.5, 0.5]


def test_retry_until_raises_the_last_error_once_the_deadline_has_passed() -> None:
    clock = FakeClock()
    calls = []

    def attempt() -> None:
        calls.append(clock.now)
        raise TimeoutError(f"try {len(calls)}")

    deadline = Deadline(1.0, clock)
    with pytest.raises(TimeoutError, match="try 3"):
        retry_until(deadline, attempt, retry_on=(OSError,), pause=0.5, sleep=clock.sleep)
    assert calls == [100.0, 100.5, 101.0]


def test_retry_until_raises_other_errors_at_once() -> None:
    clock = FakeClock()

    def attempt() -> None:
        raise ValueError("a bug, not a transient answer")

    with pytest.raises(ValueError):
        retry_until(Deadline(9.0, clock), attempt, retry_on=(OSError,), pause=1, sleep=clock.sleep)
    assert clock.sleeps == []


# --- atomic writes --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [SECRET_MODE, PUBLIC_MODE])
def test_write_atomically_replaces_the_file_with_the_mode_asked(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "file"
    path.write_text("old")
    path.chmod(0o666)
    assert write_atomically(path, "new\n", mode=mode) == path
    assert path.read_text() == "new\n"
    assert stat.S_IMODE(path.stat().st_mode) == mode
    assert [p.name for p in tmp_path.iterdir()] == ["file"]


@pytest.mark.parametrize("failing", ["fsync", "chmod", "replace"])
def test_write_atomically_failure_keeps_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    path = tmp_path / "file"
    path.write_text("old")

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(f"provision.system.files.os.{failing}", broken)
    with pytest.raises(OSError, match="No space left"):
        write_atomically(path, "new", mode=PUBLIC_MODE)
    monkeypatch.undo()
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["file"]


# --- processes ------------------------------------------------------------------------------

IGNORES_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"


def _spawn_python(tmp_path: Path, code: str, marker: str) -> tuple[int, Path]:
    pidfile = tmp_path / "proc.pid"
    argv = [sys.executable, "-c", code, marker]
    pid = spawn(argv, tmp_path / "proc.log", pidfile)
    assert read_pid(pidfile) == pid
    assert wait_until(Deadline(5.0), lambda: is_running(pid, marker), 0.02)
    return pid, pidfile


def test_stop_pidfile_stops_our_process_with_sigterm_and_removes_the_pidfile(
    tmp_path: Path,
) -> None:
    pid, pidfile = _spawn_python(tmp_path, "import time; time.sleep(60)", "marker-term")
    began = time.monotonic()
    assert stop_pidfile(pidfile, "marker-term", grace=10.0)
    assert time.monotonic() - began < 5.0  # SIGTERM was enough: no wait for the grace
    assert not is_running(pid, "marker-term")
    assert not pidfile.exists()


def test_stop_pidfile_kills_a_process_that_ignores_sigterm_after_the_grace(tmp_path: Path) -> None:
    pid, pidfile = _spawn_python(tmp_path, IGNORES_TERM, "marker-kill")
    time.sleep(0.3)  # let it install its handler
    assert main(["stop", str(pidfile), "--marker", "marker-kill", "--grace", "0.5"]) == 0
    assert not is_running(pid, "marker-kill")
    assert not pidfile.exists()


def test_stop_pidfile_leaves_a_process_alone_whose_cmdline_lacks_the_marker(
    tmp_path: Path,
) -> None:
    pid, pidfile = _spawn_python(tmp_path, "import time; time.sleep(60)", "marker-ours")
    try:
        assert not stop_pidfile(pidfile, "someone-else", grace=0.5)
        assert is_running(pid, "marker-ours")
    finally:
        pidfile.write_text(f"{pid}\n")
        assert stop_pidfile(pidfile, "marker-ours")
