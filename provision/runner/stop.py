"""Waking a run: from whoever owns the process's signals (`StopRequest`, a `Wakeup`).

A self-pipe, not threading.Event: `StopRequest.request` is called from signal handlers, and a
handler that took a lock the interrupted main thread already held would deadlock it. A write to
a non-blocking pipe cannot block.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal


class Wakeup:
    """A level a thread (or a signal handler) can raise and a run can wait on."""

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
    first signal number is kept. The run forwards it to the job and ends."""

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
