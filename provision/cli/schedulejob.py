"""`lockctl schedule` without Typer: its flags and the scheduler's life, for both parsers.

A scheduler lives for months, so what it loads at start stays in its memory: Typer 0.29
checks every parameter with pydantic (~7 MB of RSS), and the Typer app loads click and every
command's module (~2 MB more), all for three flags read once (bench/scheduler.py: 45 MB
with Typer against a target of 40). The console script (entry.py) serves a plain
`lockctl schedule --config F [--listen H:P] [--allow-unsafe]` from here; anything else (`-h`,
an unknown or repeated flag, a missing value) goes to the Typer command (schedule.py), which
ends in `run_schedule` too, so the two cannot differ in what a scheduler does.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from provision.cli.plainargs import Flag, scan_flags

if TYPE_CHECKING:
    from provision.cli.signals import ReloadRequest
    from provision.runner.stop import StopRequest

SCHEDULE_FLAGS = (
    Flag("config", ("--config", "-c"), "The worker's lockctl.json.", True, True, "LOCKCTL_CONFIG"),
    Flag("listen", ("--listen",), "Serve /metrics and /healthz on HOST:PORT.", True),
    Flag("allow_unsafe", ("--allow-unsafe",), "Run even if timings break the fencing bound", False),
)


@dataclass(frozen=True)
class ScheduleArgs:
    """What `lockctl schedule` was asked, as parsed from its flags."""

    config: Path
    allow_unsafe: bool = False
    listen: str | None = None


def recognize_schedule(argv: Sequence[str], environ: Mapping[str, str]) -> ScheduleArgs | None:
    """The arguments when `argv` (after `schedule`) is a plain, well-formed invocation that
    Typer would parse into the same values; None at the least doubt (Typer then decides)."""
    scanned = scan_flags(argv, SCHEDULE_FLAGS, environ)
    if scanned is None or scanned[1] != len(argv) or "--" in argv:  # it takes no argument
        return None
    values = scanned[0]
    listen = values.get("listen")
    return ScheduleArgs(
        Path(str(values["config"])),
        "allow_unsafe" in values,
        None if listen is None else str(listen),
    )


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
    from provision.runner.child import become_subreaper
    from provision.scheduler.listen import parse_listen, serving
    from provision.scheduler.service import Scheduler, single_instance
    from provision.workers.config import load_worker_config

    address = None if args.listen is None else parse_listen(args.listen)  # refused first
    reload.clear()  # the config is read now: a SIGHUP until here asked for just that
    worker_config = load_worker_config(args.config, allow_unsafe=args.allow_unsafe)
    with single_instance(args.config):
        become_subreaper()  # the jobs' orphans come back to us: none outlives its lock
        scheduler = Scheduler(worker_config, stop, sys.stderr, allow_unsafe=args.allow_unsafe)
        reload.forward_to(scheduler.request_reload)  # a SIGHUP since the read: reload at once
        # bound before any job starts: a port in use is exit 6 with nothing run
        with serving(address, scheduler.snapshots, worker_config.worker, scheduler.events):
            return scheduler.run()
