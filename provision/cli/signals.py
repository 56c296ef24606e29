"""The CLI owns the process's signals: while a command runs, SIGTERM, SIGINT and SIGHUP become a
stop request for the engine, which forwards them to the job and ends the run cleanly.

The handlers only record (StopRequest.request writes to a pipe): they never raise, so no signal
can unwind the engine half-way, wherever it arrives (while acquiring, while the job runs, during
the release and the session's destroy).
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from provision.runner.stop import StopRequest

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None


@contextmanager
def signals_request_stop(stop: StopRequest, *, restore: bool = True) -> Iterator[StopRequest]:
    """Within the block, the stop signals request `stop`; the previous handlers come back after.

    With `restore` False (a process that exits right after) they are ignored after the block: a
    signal that comes once the run is over must not turn the job's exit status into a death by
    signal. Ignored, not recorded: Python's own shutdown resets its handlers to the default.
    """

    def handle(signum: int, _frame: FrameType | None) -> None:
        stop.request(signum)

    previous: dict[int, Handler] = {}
    try:
        for signum in STOP_SIGNALS:
            previous[signum] = signal.signal(signum, handle)
        yield stop
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler if restore else signal.SIG_IGN)
