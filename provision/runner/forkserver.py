"""The runner's side of the resident namespace helper (nsserver.py) of a long-lived process.

`lockctl schedule` starts one ForkServer and hands it to every run: each job's PID namespace is
then forked by the helper (well under a millisecond of CPU) instead of started by `unshare` and
a new Python (20-40 ms). What the job gets is the same: its own PID namespace and /proc, the init
that forwards signals and reaps, the ready/go hand-shake, PDEATHSIG all the way down.

A job forked this way is the helper's child, not ours, so its exit status comes from the helper
on a socket of the job's own (KeptProcess: a Popen look-alike for child.py). When the helper
cannot be used (it died, it could not fork), `spawn` says so and the run starts its namespace the
one-shot way instead.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from provision.runner.containment import die_with_parent, open_pidfd, pdeathsig_argv, send_signal

NSSERVER = Path(__file__).with_name("nsserver.py")
START_TIMEOUT = 10.0  # seconds for an answer to a request (the helper forks and says the PID)


class KeptProcess:
    """A job's namespace, forked by the helper: its init itself (as root), or the keeper whose
    one child the init is (in a user namespace): what child.py needs of a Popen."""

    def __init__(self, pid: int, status: socket.socket, *, is_init: bool) -> None:
        self.pid = pid
        self.init_pid = pid if is_init else None  # else: the keeper's only child
        self.returncode: int | None = None
        self._status = status
        self._handle: int | None = open_pidfd(pid)  # None once closed
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        """The exit status (-N for signal N) once the helper reported it, else None."""
        with self._lock:
            if self.returncode is None:
                try:
                    said = self._status.recv(64, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    return None
                except OSError:
                    said = b""
                # End of file without a status: the helper itself died, and the keeper (its
                # PDEATHSIG) with it, and the namespace with the keeper.
                self.returncode = int(said) if said.strip() else -signal.SIGKILL
                self._status.close()
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired("lockctl-job", timeout or 0.0)
            with contextlib.suppress(OSError, ValueError):  # closed meanwhile: poll says
                select.select([self._status], [], [], left)
        return code

    def kill(self) -> None:
        """SIGKILL the keeper (through its pidfd: never a process that reused the PID)."""
        if self.poll() is not None or self._handle is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
            send_signal(self._handle, signal.SIGKILL)

    def close(self) -> None:
        if self._handle is not None and self._handle >= 0:
            with contextlib.suppress(OSError):
                os.close(self._handle)
        self._handle = None


@dataclass
class _Asked:
    """A request sent to the helper; its answer (pid, is_init) once read."""

    answer: tuple[int, int] | None = None


class ForkServer:
    """The helper process, started once; `spawn` from any thread."""

    def __init__(self) -> None:
        self._socket: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None
        # Requests are pipelined: a thread writes its request (one at a time), then waits for
        # the answers in order, the thread reading them handing each to its asker. So the
        # helper forks 100 jobs that tick at once back to back, without waiting each time for
        # a busy scheduler thread to come and read its answer.
        self._send_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._asked: collections.deque[_Asked] = collections.deque()  # sent, not yet answered

    def start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        argv, needs_hook = pdeathsig_argv(
            [sys.executable, "-I", "-S", str(NSSERVER), str(theirs.fileno())]
        )
        try:
            self._process = subprocess.Popen(
                argv,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,  # a terminal's ^C is the scheduler's to handle
                preexec_fn=die_with_parent if needs_hook else None,
            )
        except OSError:
            ours.close()
            return  # every run then starts its namespace the one-shot way
        finally:
            theirs.close()
        ours.settimeout(START_TIMEOUT)
        self._socket = ours

    def spawn(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        control: socket.socket,
        hidden: Sequence[str] = (),
        output: tuple[int, int] | None = None,
    ) -> KeptProcess | None:
        """Fork `command`'s namespace, its init talking on `control`'s peer and covering the
        `hidden` files, its stdout and stderr the `output` pipes (else the helper's own); None
        when the helper cannot (the caller then starts it the one-shot way)."""
        job = {"command": list(command), "env": dict(env), "hidden": list(hidden)}
        body = json.dumps(job).encode()
        status_ours, status_theirs = socket.socketpair()
        pid = is_init = 0
        mine, sent = _Asked(), False
        try:
            with self._send_lock:
                if self._socket is not None:
                    fds = [control.fileno(), status_theirs.fileno(), *(output or ())]
                    self._ask(self._socket, body, fds)
                    self._asked.append(mine)
                    sent = True
            if sent:
                pid, is_init = self._await(mine)
        except (OSError, ValueError):
            self._broken()
        finally:
            status_theirs.close()
        if not pid:
            status_ours.close()
            return None
        return KeptProcess(pid, status_ours, is_init=bool(is_init))

    @staticmethod
    def _ask(server: socket.socket, body: bytes, fds: list[int]) -> None:
        head = struct.pack("!I", len(body))
        rights = struct.pack(f"{len(fds)}i", *fds)
        server.sendmsg([head], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)])
        server.sendall(body)

    def _await(self, mine: _Asked) -> tuple[int, int]:
        """Read answers, in the order their requests were sent, until ours has come."""
        with self._read_lock:
            while mine.answer is None:
                server = self._socket
                if server is None:
                    raise ValueError("the namespace helper is gone")
                answer = b""
                while len(answer) < 8:
                    chunk = server.recv(8 - len(answer))
                    if not chunk:
                        raise ValueError("the namespace helper ended")
                    answer += chunk
                pid, is_init = struct.unpack("!II", answer)
                self._asked.popleft().answer = (int(pid), int(is_init))
            return mine.answer

    def _broken(self) -> None:
        """The helper is gone (or mistaken): every later run starts the one-shot way."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def close(self) -> None:
        """End the helper (end of file on its socket) once no run needs it; its jobs are over."""
        with self._send_lock:
            self._broken()
        if self._process is not None:
            try:
                self._process.wait(timeout=START_TIMEOUT)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
