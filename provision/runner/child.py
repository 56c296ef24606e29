"""The job's process and everything it starts, so none of it outlives the lock.

The job is prepared before the lock is acquired and started once the lock is ours. Where the
machine allows it (see containment.py), preparing starts the job's own init in a new PID
namespace, which waits for the go: its start-up is off the hand-over path, and nothing of the
job can leave the namespace. Elsewhere the job leads its own process group and the runner, a
child subreaper (become_subreaper, set by whoever owns the process), finds its orphans.

Either way the job's first process gets PDEATHSIG=SIGKILL, so if the runner itself is killed
(kill -9), the job does not run on without a lock holder. A namespace the machine refuses is
found out by the first job that tries (its init says why, or unshare does on a pipe of ours);
that job and every later one of the process then run in a process group.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from provision.errors import InputError
from provision.runner.containment import (
    PID_NAMESPACE,
    PROCESS_GROUP,
    die_with_parent,
    namespace_argv,
    namespace_refused,
    open_pidfd,
    pdeathsig_argv,
    refusal_reason,
    remember_refusal,
    send_signal,
)
from provision.runner.nsinit import READY
from provision.runner.output import OutputTee

if TYPE_CHECKING:
    from provision.fencing import BodyFence
    from provision.runner.forkserver import ForkServer, KeptProcess

INIT_START_TIMEOUT = 10.0  # seconds for nsinit to say ready (a Python start on a loaded host)
ANSWER_MAX = 1024  # bytes of the init's first line: ready, or the step the machine refused
UNSHARE_SAID_MAX = 65536  # bytes of unshare's stderr read for why it failed (one line, usually)


def check_program(command: Sequence[str], env: Mapping[str, str]) -> None:
    """Refuse a command that cannot start, before any lock is taken for it."""
    if not command or shutil.which(command[0], path=env.get("PATH")) is None:
        shown = command[0] if command else ""
        raise InputError(f"cannot start {shown!r}: not found or not executable")


class Child:
    """The job: prepared before the lock, started once it is ours, and every process it makes."""

    def __init__(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        forks: ForkServer | None = None,
        hidden: Sequence[str] = (),
        secrets: Sequence[str] = (),
        *,
        checked: bool = False,
    ) -> None:
        """`forks`: a long-lived process's namespace helper (runner/forkserver.py), which forks
        the namespace instead of starting unshare and a Python for it. `hidden`: files (absolute
        paths) the job's mount namespace covers with an empty one (the worker's secrets).
        `secrets`: what the ends of its output kept for the record must not show. `checked`:
        the caller just checked the command (gone since, it fails at its exec, docs/runner.md)."""
        if not checked:
            check_program(command, env)
        self.command, self.env = list(command), dict(env)
        self.containment = PROCESS_GROUP
        self.warning = namespace_refused()  # why the containment is weaker, if it is
        self._not_ours: set[int] = set()
        if self.warning is not None:
            self._note_children()
        self.process: subprocess.Popen[bytes] | KeptProcess | None = None
        self._kept: KeptProcess | None = None  # the process, when the helper forked it
        self._control: socket.socket | None = None
        self._unshare_said: int | None = None  # the read end of unshare's stderr (one-shot way)
        self._init: int | None = None  # a pidfd (or the pid) of the namespace's init
        self._init_pid: int | None = None  # its PID: the one stray a namespaced job can have
        self.hidden = list(hidden)
        self.output = OutputTee()  # the job's stdout and stderr: tee'd, their ends kept
        self._secrets = list(secrets)  # what the ends must not show (runner/output.py)
        if self.warning is None:
            self._prepare_namespace(forks)

    def output_tails(self) -> tuple[str | None, str | None]:
        """The ends of the job's stdout and stderr, masked and printable, once it is over."""
        return self.output.tails(self._secrets)

    @property
    def pid(self) -> int:
        assert self.process is not None, "the job was not started"
        return self.process.pid

    def _prepare_namespace(self, forks: ForkServer | None) -> None:
        ours, theirs = socket.socketpair()
        try:
            self._kept = None
            if forks is not None:
                self._kept = forks.spawn(
                    self.command, self.env, theirs, self.hidden, self.output.child_fds
                )
            self.process = self._kept if self._kept is not None else self._unshare(theirs)
        except InputError as exc:
            ours.close()
            self._refuse(str(exc))
            return
        finally:
            theirs.close()
        self._control, self.containment = ours, PID_NAMESPACE

    def _unshare(self, control: socket.socket) -> subprocess.Popen[bytes]:
        """The one-shot way: unshare, and a Python for the init. unshare's stderr is a pipe of
        ours (why it could not make the namespace); the init gives the job its own stderr."""
        stdout, stderr = self.output.child_fds
        self._unshare_said, said_write = os.pipe()
        try:
            ns_argv = namespace_argv(control.fileno(), stderr, self.command, self.hidden)
            argv, needs_hook = pdeathsig_argv(ns_argv)
            pass_fds = (control.fileno(), stderr)
            return self._popen(argv, self.env, needs_hook, (stdout, said_write), pass_fds)
        finally:
            os.close(said_write)

    def start(self, lock_env: Mapping[str, str], fence: BodyFence | None = None) -> None:
        """Start the job with the lock's variables added to its environment (the supervisor
        kills its tree within the fence's bounds: the job need not follow them)."""
        if self._control is None or not self._go(self._control, lock_env):
            argv, needs_hook = pdeathsig_argv(self.command)
            env = {**self.env, **lock_env}
            self.process = self._popen(argv, env, needs_hook, self.output.child_fds)
        self.output.start()  # threads only now: the job is forked (its preexec hook is run)

    def _go(self, control: socket.socket, lock_env: Mapping[str, str]) -> bool:
        """Wait for the init's ready, send the go; False when no namespace could be made."""
        self._control = None
        said = b""
        try:
            control.settimeout(INIT_START_TIMEOUT)
            said = _init_answer(control)
            if said != READY:
                raise OSError("the job's init did not start")
            kept_init = None if self._kept is None else self._kept.init_pid
            self._init_pid = kept_init or _only_child(self.pid)
            self._init = open_pidfd(self._init_pid)
            control.sendall(json.dumps({"env": dict(lock_env)}).encode())
            control.shutdown(socket.SHUT_WR)
            return True
        except (OSError, ValueError):
            self._refuse(self._why_no_namespace(said))
            return False
        finally:
            control.close()

    def _why_no_namespace(self, init_said: bytes) -> str:
        """The namespace ended before its init said ready: it was not allowed, and why."""
        assert self.process is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = self.process.wait(timeout=INIT_START_TIMEOUT)
            return refusal_reason(init_said, self._read_unshare_said(), code)
        self._kill_prepared()
        return "the job's init did not say ready in time"

    def _read_unshare_said(self) -> bytes:
        """What unshare wrote on its stderr before it ended (none of it in the job's output)."""
        if self._unshare_said is None:
            return b""
        os.set_blocking(self._unshare_said, False)
        with contextlib.suppress(BlockingIOError):
            return os.read(self._unshare_said, UNSHARE_SAID_MAX)
        return b""

    def _note_children(self) -> None:
        """Children we already have are not the job's: a long-lived process (a scheduler, a
        test) may have others. Whatever becomes our child later was started by the job. Only a
        job in a process group needs this (a scan of every thread's children: many ms in a
        scheduler of hundreds of threads)."""
        self._not_ours = {pid for pid, _ in _our_children()}

    def _refuse(self, reason: str) -> None:
        remember_refusal(reason)
        self._note_children()  # before the job starts in its process group
        self._close_init()  # the output's pipes stay: the job starts with them after all
        self.warning, self.containment, self.process, self._kept = reason, PROCESS_GROUP, None, None

    def abort(self) -> None:
        """The lock was not ours: end what was prepared (the waiting init), leave nothing."""
        if self._control is not None:
            # Killed first: closing the socket with the init's unread "ready" in it resets the
            # connection, and an init still alive would print ECONNRESET's traceback.
            self._kill_prepared()
            self._control.close()
            self._control = None
        self.output.close()

    def _kill_prepared(self) -> None:
        if self._kept is not None:
            self._kept.kill()  # its init, which has no go yet, dies with it (PDEATHSIG)
            self._kept.wait()
        elif self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def close(self) -> None:
        """Release what the child holds in this process (the init's pidfd, the output)."""
        self._close_init()
        self.output.close()

    def _close_init(self) -> None:
        # unshare's stderr only now: closed while unshare lives, a word of it would kill it
        for fd in (self._init, self._unshare_said):
            if fd is not None and fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._init = self._unshare_said = None
        if self._kept is not None:
            self._kept.close()

    @staticmethod
    def _popen(
        argv: list[str],
        env: Mapping[str, str],
        needs_hook: bool,
        output: tuple[int, int],
        pass_fds: tuple[int, ...] = (),
    ) -> subprocess.Popen[bytes]:
        try:
            # argv from the worker's own config, no shell. The preexec fallback is safe because
            # the child is spawned before the runner starts any thread that could hold a lock.
            return subprocess.Popen(
                argv,
                env=dict(env),
                stdout=output[0],
                stderr=output[1],
                start_new_session=True,
                pass_fds=pass_fds,
                preexec_fn=die_with_parent if needs_hook else None,
            )
        except OSError as exc:
            raise InputError(f"cannot start {argv[0]!r}: {exc.strerror}") from None

    def wait(self) -> int:
        """Block until the child exits; its status as a shell reports it (128+N for signal N)."""
        assert self.process is not None
        status = self.process.wait()
        return 128 - status if status < 0 else status

    @property
    def exit_status(self) -> int | None:
        status = None if self.process is None else self.process.poll()
        if status is None:
            return None
        return 128 - status if status < 0 else status

    def signal_tree(self, signum: int) -> bool:
        """Send `signum` to every process of the job; whether anything was there to get it.

        In a namespace, the init forwards it to all of them (unshare would ignore it); SIGKILL
        goes to unshare and the init themselves, and the kernel ends the rest. Otherwise the
        job's process group gets it, and its orphans that were re-parented to us.
        """
        reached = False
        if self._kept is not None:
            return self._signal_kept(self._kept, signum)
        if signum != signal.SIGKILL and self._init is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
                send_signal(self._init, signum)
                reached = True
        else:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signum)
                reached = True
        for pid in self._strays():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)
                reached = True
        return reached

    def _signal_kept(self, kept: KeptProcess, signum: int) -> bool:
        """A namespace the helper forked: the init gets the signal (SIGKILL too: the kernel then
        ends the namespace), and the keeper SIGKILL, which it takes for itself."""
        reached = False
        if self._init is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
                send_signal(self._init, signum)
                reached = True
        if signum == signal.SIGKILL:
            kept.kill()
        return reached or kept.poll() is None

    def tree_alive(self) -> bool:
        """Whether any process of the job is alive: its first process, its process group, or a
        descendant re-parented to us. Reaps re-parented zombies on the way."""
        self._reap_strays()
        if self.process is None:
            return False
        if self.process.poll() is None:
            return True
        if self._kept is not None:  # its keeper ends after the last process of the namespace
            return False
        try:
            os.killpg(self.pid, 0)
        except (ProcessLookupError, PermissionError):
            return bool(self._strays())
        return True

    def _strays(self) -> list[int]:
        return [pid for pid, state in self._job_children() if state != "Z"]

    def _job_children(self) -> list[tuple[int, str]]:
        """(pid, state) of the children of ours that are this job's. Nothing leaves a PID
        namespace (its orphans go to its init), so there the one such child is the init itself,
        re-parented to us once unshare died (never when the helper forked it: the helper is its
        subreaper then); any other child is another job's (a scheduler runs several at once)."""
        if self.containment == PID_NAMESPACE:
            if self._kept is not None or self._init_pid is None:
                return []
            state = _child_state(self._init_pid)
            return [] if state is None else [(self._init_pid, state)]
        return [(pid, state) for pid, state in _our_children() if pid not in self._not_ours]

    def _is_first(self, pid: int) -> bool:
        return self.process is not None and pid == self.process.pid

    def _reap_strays(self) -> None:
        """Collect exit statuses of re-parented descendants, so they do not linger as zombies.

        Never the job itself: subprocess must reap that one, or its exit status would be lost (a
        waitpid(-1) here could take it first, and subprocess would then report 0). Never a child
        that is not the job's either: its owner wants its status.
        """
        for pid, state in self._job_children():
            if state == "Z" and not self._is_first(pid):
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
                if pid == self._init_pid:
                    self._init_pid = None  # reaped: its PID may soon be another process's


def _init_answer(control: socket.socket) -> bytes:
    """The init's first line on the control socket (ready, or the step the machine refused), or
    all that came before its end: nothing when it ended without a word (unshare failed)."""
    said = b""
    while not said.endswith(b"\n") and len(said) < ANSWER_MAX:
        chunk = control.recv(ANSWER_MAX - len(said))
        if not chunk:
            break
        said += chunk
    return said


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
        state = _child_state(pid, me)
        if state is not None:
            found.append((pid, state))
    return found


def _child_state(pid: int, me: int | None = None) -> str | None:
    """The state letter of process `pid` if it is a child of ours (Z: a zombie), else None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            stat = handle.read()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0] if int(fields[1]) == (me or os.getpid()) else None


def _only_child(pid: int) -> int:
    """The one child of `pid` (unshare's: the namespace's init, as our namespace numbers it)."""
    with open(f"/proc/{pid}/task/{pid}/children", "rb") as handle:
        (child,) = handle.read().split()
    return int(child)
