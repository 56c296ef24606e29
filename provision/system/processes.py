"""Starting and stopping processes by PID, with pidfiles. Never by name.

A PID is only trusted while /proc/<pid>/cmdline still carries the process's marker (for an
agent, its own config file), so a reused PID is never signalled. `stop` is SIGTERM, a grace,
then SIGKILL; the same from a shell (scripts/vagrant-verify):

    python -m provision.system.processes stop PIDFILE --marker TEXT [--grace SECONDS]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from provision.system.deadline import Deadline, wait_until
from provision.system.files import PUBLIC_MODE, write_atomically

STOP_TIMEOUT = 10.0  # seconds between SIGTERM and SIGKILL
POLL_PAUSE = 0.05


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
    write_atomically(pidfile, f"{pid}\n", mode=PUBLIC_MODE)
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
    markers = dict(processes)
    running = [pid for pid, marker in processes if is_running(pid, marker)]
    terminate(running, lambda pid: is_running(pid, markers[pid]), timeout)
    return running


def terminate(
    pids: Sequence[int],
    alive: Callable[[int], bool],
    grace: float,
    *,
    wake: bool = False,
) -> None:
    """SIGTERM `pids` (all of them alive a moment ago, and ours), wait until `alive` says each
    is gone, SIGKILL whoever is still alive after `grace` seconds (shared), and wait for those.

    `alive` is the caller's own test: a PID marker, or a Popen's poll() for our children (whose
    exit status must not be reaped from under them). `wake`: SIGCONT first, since a stopped
    process cannot act on SIGTERM.
    """
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            if wake:
                os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGTERM)
    deadline = Deadline(grace)
    for pid in pids:
        if not _wait_gone(pid, alive, deadline):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _wait_gone(pid, alive, Deadline(grace))


def stop_pidfile(pidfile: Path, marker: str, grace: float = STOP_TIMEOUT) -> bool:
    """Stop the process named in `pidfile` if it is still ours (its cmdline carries `marker`),
    then remove the pidfile. True if there was one to stop."""
    pid = read_pid(pidfile)
    stopped = bool(stop([(pid, marker)], grace)) if pid is not None else False
    pidfile.unlink(missing_ok=True)
    return stopped


def _wait_gone(pid: int, alive: Callable[[int], bool], deadline: Deadline) -> bool:
    return wait_until(deadline, lambda: not alive(pid), POLL_PAUSE)


def _reap(pid: int) -> None:
    """Collect the exit status if `pid` is our own child, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def main(argv: list[str] | None = None) -> int:
    """`stop PIDFILE --marker TEXT [--grace S]`: exit 0 whether or not it was running."""
    parser = argparse.ArgumentParser(prog="python -m provision.system.processes")
    commands = parser.add_subparsers(dest="command", required=True)
    stop_command = commands.add_parser("stop", help="stop the process in PIDFILE if it is ours")
    stop_command.add_argument("pidfile", type=Path)
    stop_command.add_argument("--marker", required=True, help="text its command line carries")
    stop_command.add_argument("--grace", type=float, default=STOP_TIMEOUT)
    args = parser.parse_args(argv)
    stop_pidfile(args.pidfile, args.marker, args.grace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
