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
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence

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


def check_program(command: Sequence[str], env: Mapping[str, str]) -> None:
    """Refuse a command that cannot start, before any lock is taken for it."""
    if not command or shutil.which(command[0], path=env.get("PATH")) is None:
        shown = command[0] if command else ""
        raise InputError(f"cannot start {shown!r}: not found or not executable")


def _with_pdeathsig(command: Sequence[str], env: Mapping[str, str]) -> tuple[list[str], bool]:
    """The argv that starts `command` with PDEATHSIG=SIGKILL, and whether a preexec hook must
    set it instead. util-linux's `setpriv --pdeathsig` does it in the child's own exec chain, so
    Python can use its vfork path (0.2 ms instead of 2.9 ms measured: the hand-over waits on it).
    """
    check_program(command, env)
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return list(command), True
    return [setpriv, "--pdeathsig", "KILL", "--", *command], False


class Child:
    """The job, started in its own process group, and every process it leaves behind."""

    def __init__(self, command: Sequence[str], env: Mapping[str, str]) -> None:
        argv, needs_hook = _with_pdeathsig(command, env)
        # Children we already had are not the job's: a long-lived process (a scheduler, a test)
        # may have others. Whatever becomes our child later was started by the job.
        self._not_ours = {pid for pid, _ in _our_children()}
        try:
            # argv from the worker's own config, no shell. The preexec fallback is safe because
            # the child is spawned before the runner starts any thread that could hold a lock.
            self.process = subprocess.Popen(
                argv,
                env=dict(env),
                start_new_session=True,
                preexec_fn=_die_with_parent if needs_hook else None,
            )
        except OSError as exc:
            raise InputError(f"cannot start {command[0]!r}: {exc.strerror}") from None
        self.pid = self.process.pid

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

    def signal_tree(self, signum: int) -> bool:
        """Send `signum` to the child's whole process group and to stray descendants; whether
        anything was there to receive it."""
        reached = False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signum)
            reached = True
        for pid in self._strays():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)
                reached = True
        return reached

    def tree_alive(self) -> bool:
        """Whether any process of the job is alive: its main process, its process group, or a
        descendant re-parented to us. Reaps re-parented zombies on the way."""
        self._reap_strays()
        if self.process.poll() is None:
            return True
        try:
            os.killpg(self.pid, 0)
        except (ProcessLookupError, PermissionError):
            return bool(self._strays())
        return True

    def _strays(self) -> list[int]:
        return [pid for pid in stray_descendants() if pid not in self._not_ours]

    def _reap_strays(self) -> None:
        """Collect exit statuses of re-parented descendants, so they do not linger as zombies.

        Never the job itself: subprocess must reap that one, or its exit status would be lost (a
        waitpid(-1) here could take it first, and subprocess would then report 0). Never a child
        that is not the job's either: its owner wants its status.
        """
        for pid, state in _our_children():
            if state == "Z" and pid != self.pid and pid not in self._not_ours:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)


def stray_descendants() -> list[int]:
    """Living child processes of ours: the job itself while it runs, and descendants that were
    re-parented to us (we are their subreaper). Zombies are left to `Child._reap_strays`."""
    return [pid for pid, state in _our_children() if state != "Z"]


def _our_children() -> list[tuple[int, str]]:
    """(pid, state) of each child process of ours.

    /proc/self/task/*/children lists them directly (a few reads); without it (a kernel built
    without CONFIG_PROC_CHILDREN), every process in /proc is checked for our pid as its parent.
    """
    me = os.getpid()
    candidates: set[int] = set()
    try:
        for task in os.listdir(f"/proc/{me}/task"):
            # Bytes: no codec to look up (the first ascii lookup is an import, ~0.5 ms on the
            # hand-over path, where this first runs).
            with open(f"/proc/{me}/task/{task}/children", "rb") as handle:
                candidates.update(int(pid) for pid in handle.read().split())
    except OSError:  # no such file, or a thread ended meanwhile: the slow, complete way
        candidates = {int(name) for name in os.listdir("/proc") if name.isdigit()}
    found = []
    for pid in candidates:
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == me:
            found.append((pid, fields[0]))
    return found
