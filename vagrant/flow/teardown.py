"""The run's one undo stack, and signals turned into an exception so that it always unwinds.

Every resource the flow makes (the namespace, a daemon, the pool, the VMs, a child process, the
run's own state) pushes its undo right after it is made, or right before when making it can fail
halfway (a daemon that may have written its pidfile, a `vagrant up` that made some VMs). The stack
unwinds in reverse order once, at the end, whatever happened: success, a failed step, SIGTERM or
Ctrl-C (both raise `Interrupted` in the main thread, so a blocked `Popen.wait()` returns at once).
An undo that raises is reported and the others still run; an undo may return what it found left
behind, which fails the run.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType

Undo = Callable[[], "str | None"]
Say = Callable[[str], None]
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """SIGINT or SIGTERM during the flow: a BaseException, so no `except Exception` swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signal.Signals(signum).name}")
        self.signum = signum


@dataclass(frozen=True)
class Entry:
    what: str
    undo: Undo


class UndoStack:
    """Undos in the order their resources were made; `unwind` runs them newest first."""

    def __init__(self, say: Say = print) -> None:
        self._entries: list[Entry] = []
        self._say = say

    def push(self, what: str, undo: Undo) -> None:
        self._entries.append(Entry(what, undo))

    def __len__(self) -> int:
        return len(self._entries)

    def unwind(self) -> list[str]:
        """Run every undo, newest first; what was left behind (reported, or an undo's failure)."""
        left: list[str] = []
        while self._entries:
            entry = self._entries.pop()
            try:
                found = entry.undo()
            except Exception as exc:  # one failed undo must not keep the others from running
                found = f"{entry.what} failed ({type(exc).__name__}: {exc})"
                self._say(f"teardown: {found}")
            if found:
                left.append(found)
        return left


class SignalGuard:
    """SIGINT/SIGTERM raise `Interrupted` while the flow runs; during the teardown they are only
    noted, so a second Ctrl-C cannot cut the teardown short (each undo has its own time bound)."""

    def __init__(self, say: Say = print) -> None:
        self.raising = False
        self.received: list[int] = []
        self._say = say

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)
        if self.raising:
            self.raising = False  # one Interrupted; the next signal lands in the teardown
            raise Interrupted(signum)
        self._say(f"vagrant-verify: {signal.Signals(signum).name}: tearing down first")

    @contextlib.contextmanager
    def installed(self) -> Iterator[SignalGuard]:
        previous = {signum: signal.signal(signum, self._handle) for signum in SIGNALS}
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    @contextlib.contextmanager
    def raise_within(self) -> Iterator[None]:
        """Signals raise `Interrupted` inside this block only."""
        self.raising = True
        try:
            yield
        finally:
            self.raising = False
