"""Child processes of the flow: each started here is waited for by its own Popen (never a bare
`wait`, which would also wait for the tee of flow.log), and stopped by the undo stack if the run
ends while it still runs.

`Shell.ns(argv)` prefixes `ip netns exec NS`: everything that talks to the VMs goes through it.
A child's output goes to the flow's own (fd 1, teed into flow.log), or through a pump thread into
a log file: with time stamps and Vagrant's progress bars cut (`stamp_line`), or copied to the
output as well (`echo`, as `| tee` did).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from flow.teardown import UndoStack
from provision.system.deadline import Deadline
from provision.system.processes import terminate

STOP_GRACE = 30.0  # seconds between SIGTERM and SIGKILL for a child (Vagrant cleans up on TERM)
TEE_GRACE = 30.0
PUMP_GRACE = 30.0  # seconds to drain a child's output once it has exited
_PROGRESS = re.compile(r"^.*Progress: .*%")


class FlowFailed(Exception):
    """A step failed: the message is printed, the teardown runs, the run exits `status`."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def stamp_line(line: str, now: float | None = None) -> str:
    """`HH:MM:SS line`, with a \\r-redrawn progress bar cut to its last state and no ESC[K."""
    text = _PROGRESS.sub("", line.rstrip("\n")).replace("\x1b[K", "")
    return f"{time.strftime('%H:%M:%S', time.localtime(now))} {text}"


@dataclass
class Child:
    name: str
    popen: subprocess.Popen[bytes]
    pump: threading.Thread | None = None
    returncode: int | None = field(default=None)


def _pump(source: IO[bytes], log: Path, stamp: bool, echo: bool) -> None:
    with log.open("w", encoding="utf-8") as out:
        for raw in source:
            line = raw.decode("utf-8", errors="replace")
            out.write((stamp_line(line) if stamp else line.rstrip("\n")) + "\n")
            out.flush()
            if echo:
                sys.stdout.write(line if line.endswith("\n") else line + "\n")
                sys.stdout.flush()
    source.close()


def stop_child(child: Child) -> str | None:
    """The undo of a child: SIGTERM (SIGKILL after a grace) if it still runs; reaped by Popen."""
    if child.popen.poll() is None:
        print(f"teardown: stopping {child.name} (pid {child.popen.pid})", flush=True)
        terminate([child.popen.pid], lambda _pid: child.popen.poll() is None, STOP_GRACE)
    return None


class Shell:
    def __init__(self, namespace: str, stack: UndoStack) -> None:
        self.namespace = namespace
        self.stack = stack

    def ns(self, argv: Sequence[str]) -> list[str]:
        """`argv` inside the run's network namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def start(
        self,
        argv: Sequence[str],
        name: str,
        *,
        log: Path | None = None,
        stamp: bool = False,
        echo: bool = False,
        quiet: bool = False,
        stdin: int | None = subprocess.DEVNULL,
    ) -> Child:
        """Start `argv`; its undo (stop it if it still runs) is on the stack from now on.

        Its output: into `log` (stderr too; `stamp`ed, or `echo`ed as well), nowhere if `quiet`,
        else the flow's own output."""
        sys.stdout.flush()
        stdout: int | None = subprocess.PIPE if log else subprocess.DEVNULL if quiet else None
        stderr = subprocess.STDOUT if log else subprocess.DEVNULL if quiet else None
        popen = subprocess.Popen(list(argv), stdin=stdin, stdout=stdout, stderr=stderr)
        child = Child(name, popen)
        self.stack.push(f"stop {name}", lambda: stop_child(child))
        if log and popen.stdout:
            child.pump = threading.Thread(
                target=_pump, args=(popen.stdout, log, stamp, echo), daemon=True
            )
            child.pump.start()
        return child

    def wait(self, child: Child, timeout: float | None = None) -> int:
        """Its exit status; past `timeout` it is stopped and that is a failure."""
        try:
            child.returncode = child.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            stop_child(child)
            raise FlowFailed(
                f"{child.name}: still running after {timeout:.0f} s; stopped"
            ) from None
        if child.pump:
            # A grandchild may still hold the pipe: never wait for it without a bound.
            child.pump.join(PUMP_GRACE)
            if child.pump.is_alive():
                print(f"{child.name}: its output pipe is still open; its log may be cut short")
        return child.returncode

    def wait_all(self, children: Sequence[Child], timeout: float | None = None) -> list[int]:
        """Every child's exit status, in order (all waited for, even after one failed), all
        within one `timeout`."""
        deadline = Deadline(timeout) if timeout is not None else None
        return [self.wait(c, deadline.remaining() if deadline else None) for c in children]

    def run(
        self,
        argv: Sequence[str],
        name: str,
        *,
        check: bool = True,
        timeout: float | None = None,
        log: Path | None = None,
        stamp: bool = False,
        echo: bool = False,
        quiet: bool = False,
    ) -> int:
        child = self.start(argv, name, log=log, stamp=stamp, echo=echo, quiet=quiet)
        status = self.wait(child, timeout)
        if check and status != 0:
            raise FlowFailed(f"{name}: exit {status}")
        return status


def output_of(argv: Sequence[str], *, timeout: float = 60) -> str:
    """A short query's standard output ('' if it failed): `virsh list`, `ip netns pids`."""
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    return done.stdout if done.returncode == 0 else ""


def succeeds(argv: Sequence[str], *, timeout: float = 60) -> bool:
    done = subprocess.run(list(argv), capture_output=True, timeout=timeout, check=False)
    return done.returncode == 0


def tail(path: Path, lines: int) -> None:
    if path.is_file():
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
        print("\n".join(text[-lines:]), flush=True)


RUBY_FRAME = re.compile(r"^(\d\d:\d\d:\d\d )?\s*/\S+\.rb:\d+:in ")
FRAMES_KEPT = 3


def without_backtraces(lines: Sequence[str]) -> list[str]:
    """`lines` with each run of Ruby backtrace frames cut to its first few (the innermost, where
    the error was raised): a failed `vagrant up` prints a hundred frames after its message, and a
    tail of the log showed only frames."""
    kept: list[str] = []
    run = 0
    for line in lines:
        if not RUBY_FRAME.match(line):
            if run > FRAMES_KEPT:
                kept.append(f"    ... {run - FRAMES_KEPT} more backtrace frames")
            run = 0
            kept.append(line)
            continue
        run += 1
        if run <= FRAMES_KEPT:
            kept.append(line)
    if run > FRAMES_KEPT:
        kept.append(f"    ... {run - FRAMES_KEPT} more backtrace frames")
    return kept


def tail_of_failure(path: Path, lines: int) -> None:
    """The last `lines` of a failed command's log, its backtraces cut short."""
    if path.is_file():
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
        print("\n".join(without_backtraces(text)[-lines:]), flush=True)


@contextmanager
def output_teed_to(log: Path) -> Iterator[None]:
    """This process's stdout and stderr, and its children's, go to the terminal and into `log`.

    `tee` runs in its own session, so a Ctrl-C at the terminal does not end it before the
    teardown has said what it did; it ends when the last writer closes the pipe, at the end.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    tee = subprocess.Popen(["tee", str(log)], stdin=subprocess.PIPE, start_new_session=True)
    assert tee.stdin is not None
    saved = os.dup(1), os.dup(2)
    os.dup2(tee.stdin.fileno(), 1)
    os.dup2(tee.stdin.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        tee.stdin.close()
        try:  # a process of the run still holding the pipe must not hang the end of the run
            tee.wait(TEE_GRACE)
        except subprocess.TimeoutExpired:
            tee.kill()
            tee.wait()
