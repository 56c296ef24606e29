"""One thread per process that copies every running job's output: a selector over their pipes.

A scheduler runs hundreds of jobs; a copy thread per stream (two per run) cost two thread starts
per run, each waiting for a turn of the interpreter lock while a burst of runs starts, and two
idle stacks per running job. The pump is started on the first stream it is given and then
serves every stream of the process: `add` hands it a pipe's read end, it reads what comes,
hands each chunk to the stream (its tee: system/tails.py and the runner's descriptor) and, at
end of file, closes the read end and says the stream is done.

A fork (the namespace helper, runner/forkserver.py) leaves the child with a copy of the pump but
not its thread: the child starts a pump of its own if it ever needs one (register_at_fork).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import threading
from typing import Protocol

CHUNK = 65536


class PumpedStream(Protocol):
    """What the pump serves: a read end, a place for each chunk, and a word at the end."""

    read_end: int

    def received(self, chunk: bytes) -> None: ...

    def ended(self) -> None: ...


class OutputPump:
    """Copies every stream it was given until its end of file, on one daemon thread."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._waiting: list[PumpedStream] = []
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self._selector.register(self._wake_read, selectors.EVENT_READ, None)
        self._thread: threading.Thread | None = None

    def add(self, stream: PumpedStream) -> None:
        """Serve `stream` from now on; its read end is the pump's to close."""
        with self._lock:
            self._waiting.append(stream)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="lockctl-output", daemon=True
                )
                self._thread.start()
        with contextlib.suppress(BlockingIOError):  # a wake-up is pending already
            os.write(self._wake_write, b"\0")

    def _run(self) -> None:
        while True:
            for key, _ in self._selector.select():
                if key.data is None:
                    self._take_waiting()
                else:
                    self._pump(key.data)

    def _take_waiting(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._wake_read, CHUNK)
        with self._lock:
            waiting, self._waiting = self._waiting, []
        for stream in waiting:
            self._selector.register(stream.read_end, selectors.EVENT_READ, stream)

    def _pump(self, stream: PumpedStream) -> None:
        try:
            chunk = os.read(stream.read_end, CHUNK)
        except OSError:
            chunk = b""
        if chunk:
            stream.received(chunk)
            return
        self._selector.unregister(stream.read_end)
        with contextlib.suppress(OSError):
            os.close(stream.read_end)
        stream.ended()


_pump: OutputPump | None = None
_pump_lock = threading.Lock()


def output_pump() -> OutputPump:
    """This process's pump, made on first use."""
    global _pump
    with _pump_lock:
        if _pump is None:
            _pump = OutputPump()
        return _pump


def _forget_in_child() -> None:
    global _pump, _pump_lock
    _pump, _pump_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)
