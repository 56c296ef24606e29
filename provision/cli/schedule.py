"""`lockctl schedule`: run every scheduled job of this worker's config, tick after tick."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Annotated

import typer


def schedule(
    config: Annotated[
        Path,
        typer.Option("--config", "-c", envvar="LOCKCTL_CONFIG", help="The worker's lockctl.json."),
    ],
    allow_unsafe: Annotated[
        bool,
        typer.Option("--allow-unsafe", help="Run even if the timings break the fencing bound."),
    ] = False,
    listen: Annotated[
        str | None,
        typer.Option(
            "--listen",
            metavar="HOST:PORT",
            help="Serve /metrics (Prometheus) and /healthz here; PORT alone is 127.0.0.1:PORT.",
        ),
    ] = None,
) -> None:
    """Run every job of the config that has a schedule and a command, each tick on exactly one
    replica (the tick claimed in Consul with the lock). SIGTERM: finish cleanly, exit 0;
    SIGHUP: reload the config (a bad one is refused, the old one kept)."""
    from provision.cli.signals import signals_request_stop
    from provision.runner.child import become_subreaper
    from provision.runner.stop import StopRequest
    from provision.scheduler.listen import parse_listen, serving
    from provision.scheduler.service import Scheduler, single_instance
    from provision.workers.config import load_worker_config

    address = None if listen is None else parse_listen(listen)  # refused before anything else
    worker_config = load_worker_config(config, allow_unsafe=allow_unsafe)
    with single_instance(config):
        become_subreaper()  # the jobs' orphans come back to us: none outlives its lock
        with signals_request_stop(StopRequest(), restore=False) as stop:  # we exit right after
            scheduler = Scheduler(worker_config, stop, sys.stderr, allow_unsafe=allow_unsafe)
            # bound before any job starts: a port in use is exit 6 with nothing run
            with serving(address, scheduler.snapshots, worker_config.worker, scheduler.events):
                signal.signal(signal.SIGHUP, lambda _s, _f: scheduler.request_reload())
                code = scheduler.run()
    raise typer.Exit(code)
