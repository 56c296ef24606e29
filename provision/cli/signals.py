"""The CLI owns the process's signals: while a command runs, SIGTERM, SIGINT and SIGHUP become a
stop request for the core (the runner's engine, the scheduler, apply's lock), which ends the run
cleanly at its own safe points; for `lockctl schedule`, SIGHUP is a reload request instead.

The handlers only record (StopRequest.request writes to a pipe, ReloadRequest sets a flag): they
never raise, so no signal can unwind the core half-way, wherever it arrives (while acquiring,
while the job runs, during the release and the session's destroy). A command installs them as
the first thing it does, before it reads its config or takes or announces anything: a signal
that comes at any moment after that is a request, never a death by signal with a lock held.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from provision.runner.stop import StopRequest

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None


class ReloadRequest:
    """SIGHUP for a process that reloads: noted until the process can reload, then passed on.

    A request that came before `forward_to` is passed on there, once; after it, each request
    calls the target at once (from the signal handler: the target must only set a flag).
    """

    def __init__(self) -> None:
        self._target: Callable[[], object] | None = None
        self.pending = False

    def request(self) -> None:
        target = self._target
        if target is None:
            self.pending = True
        else:
            target()

    def clear(self) -> None:
        """Forget a request not yet passed on (the config is about to be read: it is met)."""
        self.pending = False

    def forward_to(self, target: Callable[[], object]) -> None:
        # Handlers run in the main thread between two bytecodes: whether one runs before or
        # after the target is set, the request reaches it (at worst twice: it is only a flag).
        self._target = target
        if self.pending:
            self.pending = False
            target()


@contextmanager
def signals_request_stop(
    stop: StopRequest, *, restore: bool = True, reload: ReloadRequest | None = None
) -> Iterator[StopRequest]:
    """Within the block, the stop signals request `stop` (SIGHUP requests `reload` instead, if
    given); the previous handlers come back after.

    With `restore` False (a process that exits right after) they are ignored after the block: a
    signal that comes once the run is over must not turn the job's exit status into a death by
    signal. Ignored, not recorded: Python's own shutdown resets its handlers to the default.

    Outside the main thread (a command run in-process by a test's thread) no handler is set:
    Python delivers signals to the main thread only.
    """
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handle(signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGHUP and reload is not None:
            reload.request()
        else:
            stop.request(signum)

    previous: dict[int, Handler] = {}
    try:
        for signum in STOP_SIGNALS:
            previous[signum] = signal.signal(signum, handle)
        yield stop
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler if restore else signal.SIG_IGN)


@contextmanager
def stop_signals() -> Iterator[StopRequest]:
    """For a command that ends at the core's safe points (apply, rotate): a fresh StopRequest
    that the stop signals set within the block; the previous handlers and no open pipe after."""
    stop = StopRequest()
    try:
        with signals_request_stop(stop) as requested:
            yield requested
    finally:
        stop.close()
