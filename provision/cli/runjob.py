"""`lockctl run`: its one flag parser (argparse) and the run, without Typer.

`run` is started by every worker on every tick, and most of those runs skip, so this module
imports nothing heavy at the top: the worker's config is read first, and the runner and the
Consul client (requests: most of a skip's cost) are loaded only once the job is known. It reads
where Consul is from the worker's config (lockctl.json), not from connection flags.

The console script (entry.py) serves `lockctl run` from here; the Typer app lists `run` as a
pass-through command that hands its words to the same `serve_run`.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from provision.errors import InputError, LockctlError

if TYPE_CHECKING:
    from provision.cli.parsing import CommandParser
    from provision.consul import Consul
    from provision.runner.events import EventLog
    from provision.runner.precheck import ScheduledTick
    from provision.runner.results import RunResult
    from provision.workers.config import JobConfig, WorkerConfig


SUMMARY = "Run COMMAND only if this worker holds the job's lock; skip (exit 0) if not."


@dataclass(frozen=True)
class RunArgs:
    """What `lockctl run` was asked to do, as parsed from its flags."""

    command: list[str]
    job: str
    config: Path
    wait: bool = False
    timeout: str | None = None
    min_hold: str | None = None
    allow_unsafe: bool = False
    metrics_textfile: str | None = None
    key: str | None = None  # a keyed run's key: its own lock and ledger (provision/keyed.py)


def serve_run(argv: Sequence[str], verbose: bool | None = None) -> int:
    """`lockctl run` on the words after `run`: its exit status (see run_command). `verbose`:
    the root's -v, for the logging the run sets up when it loads the Consul client; None when
    the caller set it up already (the Typer app)."""
    return run_command(parse_run(argv), verbose)


def parse_run(argv: Sequence[str]) -> RunArgs:
    """The run's arguments. Options come first; `--`, or the first word that is not an option,
    starts the command, and everything from there on is the command's. A usage error raises
    InputError; `-h` prints the help and exits 0."""
    parser = run_parser()
    namespace, unknown = parser.parse_known_args(argv)
    if unknown:  # before the missing ones: `--conf F` is a typo, not a missing --config
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    missing = [flag for flag, value in _REQUIRED.items() if getattr(namespace, value) is None]
    if missing:
        parser.error(f"the following arguments are required: {', '.join(missing)}")
    command = list(namespace.command)
    if command[:1] == ["--"]:  # argparse keeps the `--` in front of a REMAINDER
        command = command[1:]
    # No command is right for an HTTP job only, which the config says (run_command checks).
    return RunArgs(
        command=command,
        job=namespace.job,
        config=Path(namespace.config),
        wait=namespace.wait,
        timeout=namespace.timeout,
        min_hold=namespace.min_hold,
        allow_unsafe=namespace.allow_unsafe,
        metrics_textfile=namespace.metrics_textfile,
        key=namespace.key,
    )


# Checked after the parse, not by argparse: an unknown flag is named first (see parse_run).
_REQUIRED = {"--job/-j": "job", "--config/-c": "config"}


def run_parser() -> CommandParser:
    """`lockctl run`'s one parser; `lockctl completion` reads its flags too."""
    import argparse

    from provision.cli.parsing import CommandParser

    parser = CommandParser(
        "run",
        usage="%(prog)s --job JOB --config FILE [options] -- COMMAND [ARG ...]",
        description=SUMMARY,
        epilog="--config defaults to $LOCKCTL_CONFIG.",
    )
    config_from_env = os.environ.get("LOCKCTL_CONFIG") or None
    add = parser.add_argument
    add("--job", "-j", metavar="JOB", help="The job (its name in the spec).")
    add(
        "--key",
        metavar="KEY",
        help="Run the job for KEY (a tenant, a target): its own lock and ledger under the "
        "job's prefix, keys/KEY/; runs for other keys go on beside it.",
    )
    add(
        "--config", "-c", default=config_from_env, metavar="FILE", help="The worker's lockctl.json."
    )
    add("--wait", action="store_true", help="Wait for the lock instead of skipping this tick.")
    add("--timeout", metavar="DURATION", help="With --wait: give up after this duration.")
    add(
        "--min-hold",
        metavar="DURATION",
        help="Hold the lock at least this long (overrides config).",
    )
    add(
        "--allow-unsafe",
        action="store_true",
        help="Run even if the timings break the fencing bound.",
    )
    add(
        "--metrics-textfile",
        metavar="FILE",
        help="Write the job's Prometheus metrics to this *.prom file (node_exporter's textfile "
        "collector), atomically, after every run.",
    )
    add(
        "command",
        nargs=argparse.REMAINDER,
        metavar="COMMAND",
        help="The job's command, after -- (none for an HTTP job: it calls its app).",
    )
    return parser


@dataclass(frozen=True)
class _Checked:
    """The flags, checked before any lock is taken."""

    timeout: float | None
    min_hold: float | None
    metrics: Path | None
    verbose: bool | None = None  # the root's -v: logging to set up before the client loads


def run_command(args: RunArgs, verbose: bool | None = None) -> int:
    """Run the job as asked; its exit status (the job's own, or the runner's 75/76). `verbose`:
    as serve_run's.

    Expected errors raise LockctlError (the caller's error boundary prints them)."""
    checked = dataclasses.replace(_check_flags(args), verbose=verbose)
    from provision.runner.events import EventLog
    from provision.runner.precheck import await_planned_start, lock_held, scheduled_tick, tick_taken
    from provision.system.notify_rules import check_url_files
    from provision.workers.config import load_worker_config

    worker_config = load_worker_config(args.config, allow_unsafe=args.allow_unsafe)
    job_config = worker_config.job(args.job)
    if args.key is not None:
        job_config = job_config.keyed(args.key)
    _check_command(args, job_config)
    if job_config.schedule is not None:  # every replica, a skipped one too, says a bad file
        check_url_files(job_config.notifications, f"{args.config}: jobs.{args.job}")
    events = EventLog(args.job, worker_config.worker, sys.stderr, key=args.key)
    # Everything up to here is cheap (no HTTP stack loaded): a tick another worker took is
    # settled with one plain read, before the runner and the Consul client are loaded.
    began = time.monotonic()
    chosen = scheduled_tick(job_config, worker_config.worker)  # this run's tick, chosen once
    skipped = None
    if chosen is not None:
        await_planned_start(chosen)
        if worker_config.login is None:  # one that logs in reads it once logged in (_run)
            skipped = tick_taken(worker_config, job_config, chosen.tick, events)
    elif not args.wait and worker_config.login is None:  # a plain lock, tried once
        skipped = lock_held(worker_config, job_config, events)
    if skipped is None:
        return _run(args, checked, worker_config, job_config, events, chosen)
    if checked.metrics is not None:
        _write_metrics(checked.metrics, events, skipped, time.monotonic() - began)
    if events.broken:
        _report_broken_stream(events)
    return skipped.exit_code


def _check_command(args: RunArgs, job: JobConfig) -> None:
    """A command after --, except for an HTTP job, whose call is in the config."""
    if job.http is not None and args.command:
        raise InputError(
            f"run: job {args.job} is an HTTP job (it calls its app): give it no command "
            "(see lockctl run --help)"
        )
    if job.http is None and not args.command:
        raise InputError("run: no command: put the job's command after -- (see lockctl run --help)")


def _check_flags(args: RunArgs) -> _Checked:
    if args.timeout is not None and not args.wait:
        raise InputError("--timeout only applies with --wait")
    if args.key is not None:
        from provision.keyed import key_problem
        from provision.system.text import printable

        problem = key_problem(args.key)
        if problem is not None:
            raise InputError(f"--key '{printable(args.key, 140)}': {problem}")
    metrics = None
    if args.metrics_textfile is not None:
        from provision.runner.metrics import metrics_path_problem

        metrics = Path(args.metrics_textfile)
        problem = metrics_path_problem(metrics)
        if problem is not None:
            raise InputError(f"--metrics-textfile {args.metrics_textfile}: {problem}")
    return _Checked(
        _seconds(args.timeout, "--timeout"), _seconds(args.min_hold, "--min-hold"), metrics
    )


def _run(
    args: RunArgs,
    checked: _Checked,
    worker_config: WorkerConfig,
    job_config: JobConfig,
    events: EventLog,
    chosen: ScheduledTick | None,
) -> int:
    if checked.verbose is not None:  # before the client that logs its calls is loaded
        from provision.cli.boundary import configure_logging

        configure_logging(checked.verbose)
    from provision.cli.signals import signals_request_stop
    from provision.consul import AgentClock, Consul, resolve_settings
    from provision.runner.containment import become_subreaper
    from provision.runner.events import EventLog
    from provision.runner.results import RunOptions
    from provision.runner.stop import StopRequest
    from provision.sessions import agentless_node
    from provision.workers.login import open_login

    settings = resolve_settings(**worker_config.connection())
    options = RunOptions(args.wait, checked.timeout, checked.min_hold)
    events = EventLog(args.job, worker_config.worker, sys.stderr, key=args.key)
    agent_clock = AgentClock()  # every decision about the tick is judged on Consul's clock
    consul = Consul(settings, agent_clock=agent_clock)
    become_subreaper()  # the job's orphans come back to us, so none of them outlives the lock
    gc.freeze()  # what the imports made stays; the collector no longer walks it
    gc.enable()  # the console script disabled it for the imports (entry.main)
    began = time.monotonic()
    login = None
    try:
        with signals_request_stop(StopRequest(), restore=False) as stop:  # we exit right after
            login = open_login(consul, worker_config, events.emit)  # before the first call
            skipped = _taken_once_logged_in(worker_config, job_config, chosen, consul, events)
            if skipped is not None:
                if checked.metrics is not None:
                    _write_metrics(checked.metrics, events, skipped, time.monotonic() - began)
                return skipped.exit_code
            node = agentless_node(worker_config.worker, worker_config.agentless, os.environ)
            if chosen is not None:  # a scheduled job: its tick on the tick core
                from provision.runner.notified import run_notify, tell
                from provision.runner.on_core import TickAsk, run_tick_on_core

                notify = run_notify(job_config)  # its URL files read before anything runs
                command = tuple(args.command)
                ask = TickAsk(job_config, worker_config.worker, command, options, chosen.tick, node)
                result = run_tick_on_core(consul, agent_clock, ask, events, stop)
                if notify is not None:  # the tick's work is over: told before the exit
                    tell(notify, consul, result, events)
            else:  # a plain lock
                from provision.runner.plain import PlainAsk, run_plain_on_core

                command = tuple(args.command)
                plain = PlainAsk(job_config, worker_config.worker, command, options, node)
                result = run_plain_on_core(consul, agent_clock, plain, events, stop)
    except LockctlError:  # Consul unreachable, refused, ...: counted too, as outcome "error"
        if checked.metrics is not None:
            _write_metrics(checked.metrics, events, None, time.monotonic() - began)
        raise
    finally:
        if login is not None:  # the run is over (or failed): the token goes with it
            login.close()
    return _finish(checked, events, result, began)


def _finish(checked: _Checked, events: EventLog, result: RunResult, began: float) -> int:
    """The run's metrics written, a broken event stream said: its exit status."""
    if checked.metrics is not None:
        _write_metrics(checked.metrics, events, result, time.monotonic() - began)
    if events.broken:
        _report_broken_stream(events)
    return result.exit_code


def _taken_once_logged_in(
    worker_config: WorkerConfig,
    job_config: JobConfig,
    chosen: ScheduledTick | None,
    consul: Consul,
    events: EventLog,
) -> RunResult | None:
    """For a worker that logs in, the cheap read of the tick's record, with the login's token
    (run_command skipped it: without a token it could not be read)."""
    if worker_config.login is None or chosen is None:
        return None
    from provision.runner.precheck import tick_taken

    token = consul.transport.tokens.current
    return tick_taken(worker_config, job_config, chosen.tick, events, token=token)


def _write_metrics(path: Path, events: EventLog, result: RunResult | None, elapsed: float) -> None:
    """Write the metrics file; what goes wrong is a warning event, never the run's exit status."""
    from provision.runner.metrics import Owner, write_run_metrics

    owner = Owner(events.job, events.worker, events.key)
    warnings = write_run_metrics(path, owner, result, time.time(), elapsed=elapsed)
    for warning in warnings:
        events.emit("metrics-warning", path=str(path), warning=warning)


def _report_broken_stream(events: EventLog) -> None:
    """Say once, if stderr works again, how many events were lost; then make sure the exit
    status stays the job's: Python's own final flush of a broken stderr would turn it into 120."""
    import contextlib
    import os

    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(
            f"lockctl: warning: {events.dropped} lock events could not be written to stderr "
            f"({events.broken})\n"
        )
        sys.stderr.flush()
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        sys.stderr = open(devnull, "w", encoding="utf-8", closefd=False)  # noqa: SIM115


# The longest --timeout (a wait for the lock) taken: a week. --min-hold is bounded like the
# spec's min_hold (provision.timings.BOUNDS). Both are refused at the flag, before any lock is
# taken: a value no clock or sleep can hold would otherwise fail after the job ran.
MAX_WAIT_SECONDS = 7 * 86400.0


def _seconds(text: str | None, flag: str) -> float | None:
    from provision.durations import DurationSyntaxError, format_duration, parse_duration
    from provision.timings import BOUNDS

    if text is None:
        return None
    try:
        seconds = parse_duration(text).seconds
    except DurationSyntaxError as exc:
        raise InputError(f"{flag}: {exc}") from None
    if seconds < 0:
        raise InputError(f"{flag} {text}: must not be negative")
    high = BOUNDS["min_hold"][1] if flag == "--min-hold" else MAX_WAIT_SECONDS
    if seconds > high:
        raise InputError(f"{flag} {text}: must be at most {format_duration(high)}")
    return seconds
