"""Starting and stopping agent processes by PID, with pidfiles. Never by name.

A PID is only trusted while /proc/<pid>/cmdline still names the agent's own config file, so a
reused PID is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

STOP_TIMEOUT = 10.0  # seconds between SIGTERM and SIGKILL


def spawn(argv: list[str], log_file: Path, pidfile: Path) -> int:
    """Start `argv` in its own session (a Ctrl-C at the terminal does not reach it); record its PID.

    posix_spawn rather than subprocess.Popen: the agent outlives this process, and a Popen object
    would warn when collected while the agent still runs.
    """
    log_fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        pid = os.posix_spawn(
            argv[0],
            argv,
            dict(os.environ),
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, log_fd, 1),
                (os.POSIX_SPAWN_DUP2, log_fd, 2),
            ],
            setsid=True,
        )
    finally:
        os.close(log_fd)
    tmp = pidfile.with_suffix(".tmp")
    tmp.write_text(f"{pid}\n", encoding="utf-8")
    os.replace(tmp, pidfile)
    return pid


def read_pid(pidfile: Path) -> int | None:
    try:
        return int(pidfile.read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None


def is_running(pid: int, marker: str) -> bool:
    """True if `pid` is alive (not a zombie) and its command line contains `marker`."""
    _reap(pid)
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z" and marker in cmdline


def stop(processes: list[tuple[int, str]], timeout: float = STOP_TIMEOUT) -> list[int]:
    """Stop (pid, marker) processes together: SIGTERM all, SIGKILL whoever outlives `timeout`.

    Together, because a client agent's graceful leave takes seconds and they need not queue.
    Returns the PIDs that were running (and are now gone); others are left alone.
    """
    running = [(pid, marker) for pid, marker in processes if is_running(pid, marker)]
    for pid, _ in running:
        os.kill(pid, signal.SIGTERM)
    give_up_at = time.monotonic() + timeout
    for pid, marker in running:
        if not _wait_gone(pid, marker, max(0.0, give_up_at - time.monotonic())):
            os.kill(pid, signal.SIGKILL)
            _wait_gone(pid, marker, timeout)
    return [pid for pid, _ in running]


def _wait_gone(pid: int, marker: str, timeout: float) -> bool:
    give_up_at = time.monotonic() + timeout
    while time.monotonic() < give_up_at:
        if not is_running(pid, marker):
            return True
        time.sleep(0.05)
    return not is_running(pid, marker)


def _reap(pid: int) -> None:
    """Collect the exit status if `pid` is our own child, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
