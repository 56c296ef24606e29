"""The one error boundary, shared by the console script (entry.py) and the Typer app (app.py):
an expected error is one line on stderr and its exit code; logging as `-v` asks.

Standard library only: `lockctl run` and `lockctl schedule` come through here without Typer.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from provision.errors import EXIT_INTERRUPTED, LockctlError


def serve(command: Callable[[Sequence[str]], int], argv: Sequence[str]) -> int:
    """Run `command` on `argv`; its exit code, or that of the expected error it raised."""
    try:
        return command(argv)
    except LockctlError as exc:
        return report_expected_error(exc)
    except KeyboardInterrupt:
        return report_interrupted()


def report_expected_error(exc: LockctlError) -> int:
    """Print an expected error (each collected problem, then one summary line); its exit code.

    Errors that collect several problems (a spec, a worker config) list each on its own line,
    each naming its file:line, before the one-line summary."""
    for problem in getattr(exc, "problems", ()):
        _say(str(problem))
    _say(f"lockctl: error: {exc}")
    return exc.exit_code


def report_interrupted() -> int:
    _say("lockctl: interrupted")
    return EXIT_INTERRUPTED


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def configure_logging(verbose: bool) -> None:
    """`-v` logs each Consul call; otherwise only warnings, in lockctl's format."""
    import logging

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="lockctl: %(levelname)s %(name)s: %(message)s",
    )
