"""Spec problems: one located problem, the collector gathering them for one file, and the error
carrying all of them at once."""

from __future__ import annotations

from dataclasses import dataclass

from provision.errors import InputError


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a spec, located: `FILE:LINE[:COL]: where: message`."""

    path: str
    line: int
    where: str
    message: str
    column: int | None = None

    def __str__(self) -> str:
        column = f":{self.column}" if self.column is not None else ""
        return f"{self.path}:{self.line}{column}: {self.where}: {self.message}"


class SpecError(InputError):
    """The spec is invalid; `problems` lists every problem found, in file order.

    `str()` is a one-line summary so the CLI's error boundary stays one line; the CLI prints each
    problem on its own line before it.
    """

    def __init__(self, path: str, problems: tuple[Problem, ...]) -> None:
        count = len(problems)
        super().__init__(f"{path}: {count} problem{'' if count == 1 else 's'}")
        self.path = path
        self.problems = problems


class Problems:
    """Collects problems (deduplicated, in order) for one file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.found: dict[Problem, None] = {}

    def add(self, line: int, where: str, message: str, column: int | None = None) -> None:
        self.found[Problem(self.path, line, where, message, column)] = None

    def raise_if_any(self) -> None:
        if self.found:
            ordered = sorted(self.found, key=lambda p: (p.line, p.column or 0))
            raise SpecError(self.path, tuple(ordered))


def shown(text: str) -> str:
    """`text` made safe for a one-line message (escapes control and non-ASCII characters)."""
    return text.encode("unicode_escape").decode("ascii").replace('"', '\\"')
