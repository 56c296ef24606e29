"""The `lockctl` console script: a plain `lockctl run ...` without Typer, all else through it.

Every worker starts `lockctl run` on every tick and most of those runs skip, so the run path
loads neither Typer, click, rich nor the other commands' modules (~100 ms of a skip's ~260 ms).
`recognize_run` accepts only an argv that Typer would parse into the same values, built from
the same flag table (runjob.RUN_FLAGS); anything else, `--help`, an unknown or repeated flag, a
missing value, goes to the Typer app, which then prints exactly what it always has.
tests/unit/test_entry.py checks the two parsers against each other.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from provision.errors import EXIT_INTERRUPTED, LockctlError
from provision.system.streams import occupy_closed_streams

if TYPE_CHECKING:
    from provision.cli.runjob import RunArgs
    from provision.cli.schedulejob import ScheduleArgs

ROOT_SWITCHES = ("-v", "--verbose")  # the root options a plain run may come with


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point: exits with the command's status."""
    occupy_closed_streams()  # before any file or socket could take fd 0, 1 or 2
    args = list(sys.argv[1:] if argv is None else argv)
    verbose, run_args = recognize(args, os.environ)
    if run_args is None:
        schedule_args = _plain_schedule(args)
        if schedule_args is not None:  # a long-lived process: no Typer, pydantic or click
            configure_logging(schedule_args[0])
            exit_process(_schedule_with_boundary(schedule_args[1]))
        from provision.cli.app import main as typer_main

        typer_main(args)
        return
    # The run's imports make many objects and no garbage: collecting during them costs ~15 ms
    # of a skip. runjob re-enables the collector (after freezing what was imported) before the
    # job starts, so a long run is collected as usual.
    gc.disable()
    configure_logging(verbose)
    code = _run_with_boundary(run_args)
    exit_process(code)


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


def _run_with_boundary(run_args: RunArgs) -> int:
    """The same error boundary as the Typer app's (app.ErrorBoundaryGroup)."""
    from provision.cli.runjob import run_command

    try:
        return run_command(run_args)
    except LockctlError as exc:
        return report_expected_error(exc)
    except KeyboardInterrupt:
        return report_interrupted()


def _plain_schedule(argv: Sequence[str]) -> tuple[bool, ScheduleArgs] | None:
    """(-v given, the arguments) for a plain `[-v] schedule ...`, else None."""
    position = 0
    while position < len(argv) and argv[position] in ROOT_SWITCHES:
        position += 1
    if argv[position : position + 1] != ["schedule"]:
        return None
    from provision.cli.schedulejob import recognize_schedule

    found = recognize_schedule(argv[position + 1 :], os.environ)
    return None if found is None else (position > 0, found)


def _schedule_with_boundary(args: ScheduleArgs) -> int:
    from provision.cli.schedulejob import run_schedule

    try:
        return run_schedule(args)
    except LockctlError as exc:
        return report_expected_error(exc)
    except KeyboardInterrupt:
        return report_interrupted()


def report_expected_error(exc: LockctlError) -> int:
    """Print an expected error (each collected problem, then one summary line); its exit code.

    Errors that collect several problems (a spec, a worker config) list each on its own line,
    each naming its file:line, before the one-line summary. Written with click's echo (loaded
    only on this path), so both entries print errors byte for byte alike.
    """
    import typer

    for problem in getattr(exc, "problems", ()):
        typer.echo(str(problem), err=True)
    typer.echo(f"lockctl: error: {exc}", err=True)
    return exc.exit_code


def report_interrupted() -> int:
    import typer

    typer.echo("lockctl: interrupted", err=True)
    return EXIT_INTERRUPTED


def configure_logging(verbose: bool) -> None:
    """`-v` logs each Consul call; otherwise only warnings, in lockctl's format."""
    import logging

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="lockctl: %(levelname)s %(name)s: %(message)s",
    )


def recognize(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[bool, RunArgs | None]:
    """(-v given, the run's arguments) for `[-v] run ...`; (False, None) for anything else."""
    position = 0
    while position < len(argv) and argv[position] in ROOT_SWITCHES:
        position += 1
    if argv[position : position + 1] != ["run"]:
        return False, None
    return position > 0, recognize_run(argv[position + 1 :], environ)


def recognize_run(argv: Sequence[str], environ: Mapping[str, str]) -> RunArgs | None:
    """The run's arguments when `argv` (after `run`) is a plain, well-formed invocation that
    Typer would parse into the same values; None at the least doubt (Typer then decides).

    As Typer's run command (allow_interspersed_args off): options come first, `--` or the first
    word that is not an option starts the command, and everything from there on is the command.
    """
    from provision.cli.plainargs import scan_flags
    from provision.cli.runjob import RUN_FLAGS, RunArgs

    scanned = scan_flags(argv, RUN_FLAGS, environ)
    if scanned is None:
        return None
    values, position = scanned
    command = list(argv[position:])
    if not command:
        return None
    config = values.pop("config")
    assert isinstance(config, str)
    return RunArgs(command=command, config=Path(config), **values)  # type: ignore[arg-type]
