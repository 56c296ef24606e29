"""`lockctl --help` at 100 columns: every command's summary is whole, on one line.

Typer's command panel shows the first paragraph of a command's help (up to the first blank
line) and keeps its line breaks; a long or broken first paragraph wraps onto rows with an empty
command column, which reads as a sentence cut in two. The rest of the help is for
`lockctl COMMAND --help`.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pytest
import typer
from typer.core import TyperCommand, TyperGroup

from provision.cli import app

COLUMNS = 100
PANEL_TOP = "╭─ Commands "
PANEL_BOTTOM = "╰"


def _help_screen(*words: str) -> list[str]:
    """`lockctl WORDS --help` as a user at a 100-column terminal sees it (its own process: Rich
    reads COLUMNS when the console is made)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TERMINAL_WIDTH", "FORCE_COLOR")}
    done = subprocess.run(
        [sys.executable, "-m", "provision", *words, "--help"],
        capture_output=True,
        text=True,
        env={**env, "COLUMNS": str(COLUMNS), "NO_COLOR": "1"},
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def _panel_rows(screen: list[str]) -> list[tuple[str, str]]:
    """(command column, summary column) of each row in the Commands panel."""
    top = next(i for i, line in enumerate(screen) if line.startswith(PANEL_TOP))
    rows = []
    for line in screen[top + 1 :]:
        if line.startswith(PANEL_BOTTOM):
            return rows
        inside = line.removeprefix("│").removesuffix("│").strip()
        if line.startswith("│  "):  # the command column is empty: the row above goes on
            rows.append(("", inside))
        else:
            name, _, summary = inside.partition(" ")
            rows.append((name, summary.strip()))
    raise AssertionError("the Commands panel never closes")


def _summary(command: TyperCommand | TyperGroup) -> str:
    """What the panel shows for a command: the first paragraph of its help."""
    return inspect.cleandoc(command.short_help or command.help or "").split("\n\n")[0]


def _groups() -> dict[tuple[str, ...], TyperGroup]:
    """The root and each command group under it (`cluster`), by their words after `lockctl`."""
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    found = {(): root}
    for name, command in root.commands.items():
        if isinstance(command, TyperGroup):
            found[(name,)] = command
    return found


GROUPS = _groups()


@pytest.mark.parametrize("words", list(GROUPS), ids=lambda words: " ".join(words) or "lockctl")
def test_every_summary_is_whole_on_one_line(words: tuple[str, ...]) -> None:
    rows = _panel_rows(_help_screen(*words))
    continued = [summary for name, summary in rows if not name]
    assert not continued, f"summaries wrapped onto another row: {continued}"
    shown = dict(rows)
    for name, command in GROUPS[words].commands.items():
        if command.hidden:
            continue
        summary = _summary(command)  # type: ignore[arg-type]
        assert "\n" not in summary, f"{name}: the first paragraph of its help is one line"
        assert shown.get(name) == summary, f"{name}: shown {shown.get(name)!r}"
