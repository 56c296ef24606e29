"""The phase timer: each phase's wall time as a "name seconds" line in phases.txt (teardown too).

The same lines make the report's phase table and summary.json's `phases_s`, so the file's format
(`%-22s %7.1f s`) is read back by `parse_phases`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

Clock = Callable[[], float]


def phase_line(name: str, seconds: float) -> str:
    return f"{name:<22} {seconds:7.1f} s"


def parse_phases(text: str) -> dict[str, float]:
    """phases.txt back into {name: seconds}, in order."""
    phases: dict[str, float] = {}
    for line in text.splitlines():
        if line.strip():
            name, seconds, _unit = line.rsplit(None, 2)
            phases[name.strip()] = float(seconds)
    return phases


def phase_table(text: str) -> list[str]:
    """The phase lines and their total, as the report shows them."""
    lines = [line for line in text.splitlines() if line.strip()]
    total = sum(parse_phases(text).values())
    return [*lines, phase_line("total", total)]


class PhaseTimer:
    """One phase at a time: `start` ends the running one (its line is written then)."""

    def __init__(
        self, path: Path, clock: Clock = time.monotonic, say: Callable[[str], None] = print
    ) -> None:
        self.path = path
        self._clock = clock
        self._say = say
        self.current: str | None = None
        self._started = 0.0

    def start(self, name: str) -> None:
        self.end()
        self.current, self._started = name, self._clock()
        self._say(f"\n== {name}")

    def end(self) -> None:
        if self.current is None:
            return
        line = phase_line(self.current, self._clock() - self._started)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(line + "\n")
        self.current = None

    def text(self) -> str:
        return self.path.read_text(encoding="utf-8") if self.path.is_file() else ""
