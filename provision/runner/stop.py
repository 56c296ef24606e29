"""Waking the engine: from its helper threads (`Wakeup`) and from whoever owns the process's
signals (`StopRequest`).

Both are self-pipes, not threading.Event: `StopRequest.request` is called from signal handlers,
and a handler that took a lock the interrupted main thread already held would deadlock it. A
write to a non-blocking pipe cannot block, and the engine waits on both pipes with one select.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
from collections.abc import Sequence


class Wakeup:
    """A level a thread (or a signal handler) can raise and the engine can wait on."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)

    def set(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):  # full (already set) or closed
            os.write(self._write, b"\0")

    def fileno(self) -> int:
        return self._read

    def clear(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self._read, 512):
                pass

    def close(self) -> None:
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)


class StopRequest(Wakeup):
    """A request to stop, made once (by a signal handler, a test, a scheduler's shutdown); the
    first signal number is kept. The engine forwards it to the job and ends the run."""

    def __init__(self) -> None:
        super().__init__()
        self.signum: int | None = None

    def request(self, signum: int = signal.SIGTERM) -> None:
        if self.signum is None:
            self.signum = signum
        self.set()

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def sleep(self, seconds: float) -> bool:
        """Sleep up to `seconds`, less if a stop is requested; True when it was."""
        if not self.requested:
            wait_readable([self.fileno()], seconds)
        return self.requested


def wait_readable(fds: list[int], timeout: float | None) -> None:
    """Block until one of `fds` is readable or `timeout` (seconds; None: no limit) passes.

    poll, not select: select cannot watch a descriptor numbered 1024 or above, which a scheduler
    with hundreds of jobs and their connections reaches."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    poller.poll(None if timeout is None else max(0, round(timeout * 1000)))


def wait_for(
    wakeup: Wakeup, stop: StopRequest, timeout: float | None, also: Sequence[int] = ()
) -> None:
    """Block until `wakeup` is set, a stop is requested (the first time), one of `also` is
    readable (the job's exit), or `timeout` passes.

    A stop already requested is not waited on again: it stays readable, and the engine has
    already acted on it.
    """
    fds = [wakeup.fileno(), *also] + ([] if stop.requested else [stop.fileno()])
    wait_readable(fds, timeout)
    wakeup.clear()
