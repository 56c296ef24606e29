"""The flag parser of the commands served without Typer (`run`, `schedule`): argparse, whose
usage errors are lockctl's own bad-input error (one line naming the flag, exit 2)."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from provision.errors import InputError


class CommandParser(argparse.ArgumentParser):
    """argparse without abbreviated flags (`--conf` is not `--config`), and a usage error
    raised as InputError, so the caller's error boundary prints it like any bad input."""

    def __init__(self, command: str, **kwargs: Any) -> None:
        super().__init__(prog=f"lockctl {command}", allow_abbrev=False, **kwargs)
        self.command = command

    def error(self, message: str) -> NoReturn:
        raise InputError(f"{self.command}: {message} (see {self.prog} --help)")
