"""The CLI's shell: version, help, and the one error boundary with its exit codes."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from provision import __version__
from provision.cli import app
from provision.cli.app import ErrorBoundaryGroup
from provision.consul.errors import (
    ConsulHTTPError,
    ConsulUnavailable,
)
from provision.errors import InputError, LocalEnvironmentError, LockctlError

runner = CliRunner()


def test_version_and_help() -> None:
    assert runner.invoke(app, ["--version"]).output == f"lockctl {__version__}\n"
    for flag in ("-h", "--help"):
        result = runner.invoke(app, [flag])
        assert result.exit_code == 0
        assert "cluster" in result.output and "install-consul" in result.output


def test_python_dash_m_provision_runs_the_cli() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "provision", "--version"], capture_output=True, text=True, check=True
    )
    assert done.stdout == f"lockctl {__version__}\n"


def test_unknown_command_is_a_usage_error() -> None:
    result = runner.invoke(app, ["no-such-command"])
    assert result.exit_code == 2


def _raiser(error: BaseException) -> typer.Typer:
    probe = typer.Typer(cls=ErrorBoundaryGroup)

    @probe.command()
    def fail() -> None:
        raise error

    @probe.command()
    def other() -> None:
        """A second command, so `fail` is a subcommand as the real ones are."""

    return probe


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (InputError("locks.hcl:3: ttl: must be at least 10s"), 2),
        (ConsulUnavailable("consul: GET /v1/status/leader: cannot connect"), 3),
        (ConsulHTTPError.from_status("consul: PUT /v1/kv/x: 403", status=403, body=""), 4),
        (ConsulHTTPError.from_status("consul: GET /v1/acl/x: 404", status=404, body=""), 5),
        (ConsulHTTPError.from_status("consul: PUT /v1/x: 500", status=500, body=""), 5),
        (LocalEnvironmentError("no consul binary"), 6),
        (LockctlError("a check failed"), 1),
        (KeyboardInterrupt(), 130),
    ],
)
def test_expected_errors_are_one_line_with_their_exit_code(error: BaseException, code: int) -> None:
    result = runner.invoke(_raiser(error), ["fail"])
    assert result.exit_code == code
    assert result.output.startswith("lockctl: ")
    assert result.output.count("\n") == 1
    assert "Traceback" not in result.output


def test_unexpected_errors_keep_their_traceback() -> None:
    result = runner.invoke(_raiser(RuntimeError("a bug")), ["fail"])
    assert isinstance(result.exception, RuntimeError)
