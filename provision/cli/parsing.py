"""The flag parser of the commands served without Typer (`run`, `schedule`): argparse, whose
usage errors are lockctl's own bad-input error (one line naming the flag, exit 2)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, NoReturn

from provision.errors import InputError


class CommandParser(argparse.ArgumentParser):
    """argparse without abbreviated flags (`--conf` is not `--config`), and a usage error
    raised as InputError, so the caller's error boundary prints it like any bad input."""

    def __init__(self, command: str, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(prog=f"lockctl {command}", allow_abbrev=False, **kwargs)
        self.command = command

    def error(self, message: str) -> NoReturn:
        raise InputError(f"{self.command}: {message} (see {self.prog} --help)")


class HelpFormatter(argparse.HelpFormatter):
    """argparse's, as wide as the terminal as argparse's own is, without importing shutil for
    it (~2 ms of every `lockctl run`: argparse makes a formatter for each flag it is given)."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=terminal_columns() - 2)


def terminal_columns(fallback: int = 80) -> int:
    """The terminal's width as shutil.get_terminal_size() says it: $COLUMNS, else stdout's
    terminal, else `fallback`."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns > 0:
        return columns
    if sys.__stdout__ is None:
        return fallback
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or fallback
    except (ValueError, OSError):  # closed, detached, or not a terminal
        return fallback
