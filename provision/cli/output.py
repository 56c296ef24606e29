"""Where tables go: a rich console that does not squeeze tables into 80 columns in a pipe."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

PIPE_WIDTH = 160  # a log file or a CI console is not a terminal: do not truncate columns


def console(*, stderr: bool = False) -> Console:
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else PIPE_WIDTH)
