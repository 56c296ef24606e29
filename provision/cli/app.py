"""The root Typer app, its single error boundary, and every command registered on it.

Loaded for every command but a plain `lockctl run`, which entry.py serves without Typer;
`run --help` and a malformed `run` come here like everything else.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from provision import __version__
from provision.cli.entry import configure_logging, report_expected_error, report_interrupted
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
    check,
    cluster,
    consul_binary,
    history,
    next,
    policies,
    run,
    schedule,
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
app.command("run", context_settings={"allow_interspersed_args": False})(run.run)
app.command("schedule")(schedule.schedule)
app.command("status")(status.status)
app.command("next")(next.next_ticks)
app.command("history")(history.history)
app.command("check")(check.check)
app.command("verify")(verify.verify)
