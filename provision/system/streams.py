"""Standard streams that a timer or a supervisor started us with closed.

A process started with fd 0, 1 or 2 closed (`>&-`, some init systems, a parent that closed
them) gets None for sys.stdin/stdout/stderr from Python, so the first print or event would
raise; and the first file or socket it opens takes the free number, so a later write "to
stderr" would go into a Consul connection or a token file, and the job, which inherits fds 0-2,
would write there too. So before anything else opens a file, each closed one of the three is
opened on /dev/null (as a daemon does): what would have been written there is dropped, as the
caller asked by closing it, and nothing fails because of it.
"""

from __future__ import annotations

import os
import sys

STREAMS = ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w"))


def occupy_closed_streams() -> list[int]:
    """Open /dev/null on whichever of fds 0-2 is closed; the ones that were."""
    reopened = []
    for fd, name, mode in STREAMS:
        if _is_open(fd):
            continue
        null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: this one, or lower
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        reopened.append(fd)
        if getattr(sys, name) is None:  # Python found it closed at start
            setattr(sys, name, open(fd, mode, encoding="utf-8", closefd=False))  # noqa: SIM115
    return reopened


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True
