"""Where tables go: a rich console that does not squeeze tables into 80 columns in a pipe, and
cells for text lockctl did not write itself (shown as it is, never read as Rich markup)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from provision.system.text import DEFAULT_LIMIT, printable

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

PIPE_WIDTH = 160  # a log file or a CI console is not a terminal: do not truncate columns


def console(*, stderr: bool = False) -> Console:
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else PIPE_WIDTH)


def cell(text: object, limit: int = DEFAULT_LIMIT, style: str = "") -> Text:
    """Untrusted text as a table cell or a line: control characters escaped, bounded, and a
    `[red]` or `[link=...]` in it shown literally (a Text is never parsed as markup)."""
    from rich.text import Text

    return Text(printable(str(text), limit), style=style)
