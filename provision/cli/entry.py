"""The `lockctl` console script: `run` and `schedule` without Typer, every other command
through the Typer app.

Every worker starts `lockctl run` on every tick and most of those runs skip, so the run path
loads neither Typer, click, rich, pydantic nor the other commands' modules; a scheduler lives
for months and keeps what it loads. Each of the two has one parser, argparse's (runjob.py,
schedulejob.py), which the Typer app's pass-through commands use too; `run --help` and a
malformed `run` are served by it alike.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import sys
from collections.abc import Sequence

from provision.cli.boundary import configure_logging, serve
from provision.system.streams import occupy_closed_streams

ROOT_SWITCHES = ("-v", "--verbose")  # the root options `run` and `schedule` may come with


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point: exits with the command's status."""
    occupy_closed_streams()  # before any file or socket could take fd 0, 1 or 2
    args = list(sys.argv[1:] if argv is None else argv)
    verbose, command, rest = split_root(args)
    if command == "run":
        # The run's imports make many objects and no garbage: collecting during them costs
        # ~15 ms of a skip. runjob re-enables the collector (after freezing what was imported)
        # before the job starts, so a long run is collected as usual.
        gc.disable()
        from provision.cli.runjob import serve_run

        # Logging is set up by the run once it loads the Consul client (what logs): a skip
        # settled by the quick read never imports the logging package (~4 ms).
        exit_process(serve(functools.partial(serve_run, verbose=verbose), rest))
    if command == "schedule":  # a long-lived process: no Typer, pydantic or click
        configure_logging(verbose)
        from provision.cli.schedulejob import serve_schedule

        exit_process(serve(serve_schedule, rest))
    from provision.cli.app import main as typer_main

    typer_main(args)


def split_root(argv: Sequence[str]) -> tuple[bool, str | None, list[str]]:
    """(-v given, the command word, the words after it) for `[-v] COMMAND ...`; the command is
    None when something else comes first (`--version`, `-h`, nothing)."""
    position = 0
    while position < len(argv) and argv[position] in ROOT_SWITCHES:
        position += 1
    if position == len(argv) or argv[position].startswith("-"):
        return False, None, []
    return position > 0, argv[position], list(argv[position + 1 :])


def exit_process(code: int) -> None:
    """Exit without the interpreter's teardown of every module (~20 ms of a skip).

    By now the run is over: the job and its leftovers are gone, the session is destroyed, the
    helper threads are joined and the metrics file is renamed into place. Only the streams are
    left to flush; a broken stderr is already handled (runjob._report_broken_stream).
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
