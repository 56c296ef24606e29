"""The job's process and everything it starts, so none of it outlives the lock.

The child leads its own process group, so signals reach a shell script's children too. The runner
also becomes a child subreaper (Linux), so descendants that leave the group or are orphaned are
re-parented to it and can be found and stopped. The child gets PDEATHSIG=SIGKILL, so if the
runner itself is killed (kill -9), the child does not run on without a lock holder.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from provision.errors import InputError

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_libc = None


def _prctl(option: int, value: int) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    _libc.prctl(option, value, 0, 0, 0)


def become_subreaper() -> None:
    """Orphaned descendants of ours get re-parented to us, not to init (Linux only)."""
    with contextlib.suppress(OSError, AttributeError):
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Child:
    """The job, started in its own process group."""

    def __init__(self, command: Sequence[str], env: Mapping[str, str]) -> None:
        try:
            # argv from the worker's own config, no shell; preexec_fn is safe here because the
            # child is spawned before the runner starts any thread that could hold a lock.
            self.process = subprocess.Popen(
                list(command),
                env=dict(env),
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        except OSError as exc:
            raise InputError(f"cannot start {command[0]!r}: {exc.strerror}") from None
        self.pid = self.process.pid
        self.started = time.monotonic()

    def wait(self) -> int:
        """Block until the child exits; its status as a shell reports it (128+N for signal N)."""
        status = self.process.wait()
        return 128 - status if status < 0 else status

    @property
    def exit_status(self) -> int | None:
        status = self.process.poll()
        if status is None:
            return None
        return 128 - status if status < 0 else status

    def signal_group(self, signum: int) -> None:
        """Send `signum` to the child's whole process group (and to stray descendants)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signum)
        for pid in stray_descendants():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)

    def stop(self, grace: float, *, kill_by: float | None = None) -> None:
        """SIGTERM the group, SIGKILL whatever is left after `grace` (or at `kill_by`, if sooner).

        Also used after a normal exit, so a script's background children do not run on.
        """
        self.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + grace
        if kill_by is not None:
            deadline = min(deadline, kill_by)
        while time.monotonic() < deadline and self._group_alive():
            time.sleep(0.01)
        if self._group_alive():
            self.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        _reap_strays()

    def _group_alive(self) -> bool:
        _reap_strays()
        if self.process.poll() is None:
            return True
        try:
            os.killpg(self.pid, 0)
        except (ProcessLookupError, PermissionError):
            return bool(stray_descendants())
        return True


def stray_descendants() -> list[int]:
    """Living processes re-parented to us (we are their subreaper), other than our own children
    that subprocess still tracks. Zombies are left to `_reap_strays`."""
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == me and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def _reap_strays() -> None:
    """Collect exit statuses of re-parented descendants, so they do not linger as zombies."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
