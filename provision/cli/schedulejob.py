"""`lockctl schedule`: its one flag parser (argparse) and the scheduler's life, without Typer.

A scheduler lives for months, so what it loads at start stays in its memory: Typer 0.29
checks every parameter with pydantic (~7 MB of RSS), and the Typer app loads click and every
command's module (~2 MB more), all for three flags read once (bench/scheduler.py). The console
script (entry.py) serves `lockctl schedule` from here; the Typer app lists `schedule` as a
pass-through command that hands its words to the same `serve_schedule`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from provision.cli.parsing import CommandParser
    from provision.cli.signals import ReloadRequest
    from provision.runner.stop import StopRequest

SUMMARY = "Run every job of the config that has a schedule, each tick on one replica."
DESCRIPTION = (
    "Run every job of the config that has a schedule and a command, each tick on exactly one "
    "replica (the tick claimed in Consul with the lock). SIGTERM: finish cleanly, exit 0; "
    "SIGHUP: reload the config (a bad one is refused, the old one kept)."
)


@dataclass(frozen=True)
class ScheduleArgs:
    """What `lockctl schedule` was asked, as parsed from its flags."""

    config: Path
    allow_unsafe: bool = False
    listen: str | None = None
    max_concurrent_runs: int | None = None  # over the config's: the most runs at once here


def serve_schedule(argv: Sequence[str]) -> int:
    """`lockctl schedule` on the words after `schedule`: 0 after a clean stop (run_schedule)."""
    return run_schedule(parse_schedule(argv))


def parse_schedule(argv: Sequence[str]) -> ScheduleArgs:
    """The scheduler's arguments; a usage error raises InputError, `-h` prints the help and
    exits 0."""
    parser = schedule_parser()
    namespace = parser.parse_args(argv)
    if namespace.config is None:
        parser.error("the following arguments are required: --config/-c")
    return ScheduleArgs(
        Path(namespace.config),
        namespace.allow_unsafe,
        namespace.listen,
        namespace.max_concurrent_runs,
    )


def schedule_parser() -> CommandParser:
    """`lockctl schedule`'s one parser; `lockctl completion` reads its flags too."""
    from provision.cli.parsing import CommandParser

    parser = CommandParser(
        "schedule", description=DESCRIPTION, epilog="--config defaults to $LOCKCTL_CONFIG."
    )
    add = parser.add_argument
    config_from_env = os.environ.get("LOCKCTL_CONFIG") or None
    add(
        "--config", "-c", default=config_from_env, metavar="FILE", help="The worker's lockctl.json."
    )
    add(
        "--allow-unsafe",
        action="store_true",
        help="Run even if the timings break the fencing bound.",
    )
    add(
        "--listen",
        metavar="HOST:PORT",
        help="Serve /metrics (Prometheus) and /healthz here; PORT alone is 127.0.0.1:PORT.",
    )
    add(
        "--max-concurrent-runs",
        type=_capacity,
        metavar="N",
        help="Run at most N jobs at once here; a tick beyond is left to the next replica "
        "(over the config's max_concurrent_runs).",
    )
    return parser


def _capacity(text: str) -> int:
    """--max-concurrent-runs' value: a whole number, 1 or more (argparse names the flag)."""
    import argparse

    from provision.timings import capacity_problem

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{capacity_problem(text)}, not {text[:40]!r}") from None
    problem = capacity_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return value


def run_schedule(args: ScheduleArgs) -> int:
    """Run the scheduler until a stop signal; 0 after a clean stop. Expected errors raise
    LockctlError (the caller's error boundary prints them).

    The signal handlers come first, before the config is read, the config file locked or
    anything announced: from then on SIGTERM and SIGINT request a stop and SIGHUP a reload,
    however early they come. A SIGHUP before the config is read is met by that read; one
    after it is passed to the scheduler once it exists, which reloads as soon as it runs."""
    from provision.cli.signals import ReloadRequest, signals_request_stop
    from provision.runner.stop import StopRequest

    reload = ReloadRequest()
    with signals_request_stop(StopRequest(), restore=False, reload=reload) as stop:
        # we exit right after: a signal after the block is ignored, not a death by signal
        return _schedule(args, stop, reload)


def _schedule(args: ScheduleArgs, stop: StopRequest, reload: ReloadRequest) -> int:
    from provision.runner.containment import become_subreaper
    from provision.scheduler.listen import parse_listen
    from provision.scheduler.on_core import run_on_core
    from provision.scheduler.service import single_instance
    from provision.workers.config import load_worker_config

    address = None if args.listen is None else parse_listen(args.listen)  # refused first
    reload.clear()  # the config is read now: a SIGHUP until here asked for just that
    worker_config = load_worker_config(args.config, allow_unsafe=args.allow_unsafe)
    with single_instance(args.config):
        become_subreaper()  # the jobs' orphans come back to us: none outlives its lock
        return run_on_core(
            worker_config,
            stop,
            reload.forward_to,
            address,
            args.allow_unsafe,
            args.max_concurrent_runs,
        )
