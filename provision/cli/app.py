"""The root Typer app, its single error boundary, and every command registered on it.

Loaded for every command but `run` and `schedule`, which the console script (entry.py) serves
without Typer. Here they are pass-through commands: listed in `lockctl --help`, their words
handed untouched to their one parser (argparse, in runjob.py and schedulejob.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

from provision import __version__
from provision.cli.boundary import configure_logging, report_expected_error, report_interrupted
from provision.errors import LockctlError


class ErrorBoundaryGroup(TyperGroup):
    """Turns every expected error into one line on stderr and its exit code.

    Subcommands are invoked inside this group's `invoke`, so this one place covers them all, and
    it works the same under `typer.testing.CliRunner`. Unexpected exceptions keep their traceback:
    they are bugs.
    """

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except LockctlError as exc:
            raise typer.Exit(report_expected_error(exc)) from None
        except KeyboardInterrupt:
            raise typer.Exit(report_interrupted()) from None


class PassThroughCommand(TyperCommand):
    """A command whose words click leaves alone (`--`, `-h` and unknown flags included): its
    callback parses them itself."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        words = list(args)
        ctx.args = words
        return words


def _pass_through(name: str, summary: str, serve: Callable[[Sequence[str]], int]) -> None:
    def command(ctx: typer.Context) -> None:
        raise typer.Exit(serve(ctx.args))

    app.command(name, cls=PassThroughCommand, help=summary, add_help_option=False)(command)


app = typer.Typer(
    cls=ErrorBoundaryGroup,
    help="Run a job on exactly one of N workers, behind a Consul session lock with "
    "least-privilege ACLs.",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"lockctl {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_show_version, is_eager=True, help="Show the version."),
    ] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Log each Consul call to stderr.")
    ] = False,
) -> None:
    """lockctl: singleton jobs behind Consul session locks."""
    configure_logging(verbose)


def main(argv: list[str] | None = None) -> None:
    """The whole CLI on `argv` (default: the process's arguments)."""
    app(args=argv, prog_name="lockctl")


# The commands, registered last: their modules import nothing from this one.
from provision.cli import (  # noqa: E402
    acl,
    backfill,
    check,
    cluster,
    completion,
    consul_binary,
    control,
    history,
    next,
    policies,
    runjob,
    schedulejob,
    status,
    verify,
    workers,
)

app.add_typer(cluster.app, name="cluster")
app.command("install-consul")(consul_binary.install_consul)
app.command("render")(policies.render)
app.command("lint")(policies.lint)
app.command("bootstrap")(acl.bootstrap)
app.command("plan")(acl.plan)
app.command("apply")(acl.apply)
app.command("rotate")(acl.rotate)
app.command("worker-config")(workers.worker_config)
_pass_through("run", runjob.SUMMARY, runjob.serve_run)
_pass_through("schedule", schedulejob.SUMMARY, schedulejob.serve_schedule)
app.command("status")(status.status)
app.command("next")(next.next_ticks)
app.command("history")(history.history)
app.command("check")(check.check)
app.command("verify")(verify.verify)
app.command("pause")(control.pause)
app.command("resume")(control.resume)
app.command("trigger")(control.trigger)
app.command("backfill")(backfill.backfill)
app.command("break")(control.break_lock)
app.command("abort")(control.abort)
app.command("completion")(completion.completion)
