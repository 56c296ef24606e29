"""The root Typer app and its single error boundary."""

from __future__ import annotations

import logging
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from provision import __version__
from provision.errors import EXIT_INTERRUPTED, LockctlError


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
            # Errors that collect several problems (a spec, a worker config) list each on its
            # own line, each naming its file:line, before the one-line summary.
            for problem in getattr(exc, "problems", ()):
                typer.echo(str(problem), err=True)
            typer.echo(f"lockctl: error: {exc}", err=True)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            typer.echo("lockctl: interrupted", err=True)
            raise typer.Exit(EXIT_INTERRUPTED) from None


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
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="lockctl: %(levelname)s %(name)s: %(message)s",
    )
