"""A command's flags as one frozen dataclass (options.flags_command, options.with_flags): Typer
sees one option per field, with its help and default; the command receives one instance.

The toy command below stands for verify, history and worker-config; the last tests pin those
three, whose flags moved into VerifyFlags, HistoryFlags and WorkerConfigFlags."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import pytest
import typer
from typer.testing import CliRunner

from provision.cli import app, options
from provision.cli.history import HistoryFlags
from provision.cli.verify import VerifyFlags
from provision.cli.workers import WorkerConfigFlags

runner = CliRunner()

Out = Annotated[Path, typer.Option("--out", help="Where the toy writes.")]
Count = Annotated[int, typer.Option("--count", "-n", min=1, help="How many toys.")]
Names = Annotated[list[str] | None, typer.Option("--name", help="A toy's name (repeatable).")]
Loud = Annotated[bool, typer.Option("--loud", help="Shout.")]
Colour = Annotated[str, typer.Option("--colour", envvar="TOY_COLOUR", help="Its colour.")]


@dataclass(frozen=True)
class ToyFlags:
    out: Out
    count: Count = 3
    names: Names = None
    loud: Loud = False
    colour: Colour = "red"


def _toy_app() -> tuple[typer.Typer, list[Any]]:
    """An app whose one command records what it received."""
    seen: list[Any] = []
    toy = typer.Typer(add_completion=False)

    @toy.command()
    @options.flags_command(ToyFlags)
    def make(flags: ToyFlags, ctx: typer.Context) -> None:
        """Make toys."""
        seen.append((flags, ctx.get_parameter_source("colour").name))  # type: ignore[union-attr]

    @toy.command()
    def other() -> None:  # a second command, so `make` is named on the command line
        """Nothing."""

    return toy, seen


@pytest.mark.parametrize(
    ("argv", "expected", "colour_from"),
    [
        (["--out", "o"], ToyFlags(Path("o")), "DEFAULT"),
        (
            ["--out", "o", "-n", "5", "--name", "a", "--name", "b", "--loud"],
            ToyFlags(Path("o"), 5, ["a", "b"], True),
            "DEFAULT",
        ),
        (["--colour", "blue", "--out", "o"], ToyFlags(Path("o"), colour="blue"), "COMMANDLINE"),
    ],
)
def test_the_command_receives_one_instance_of_its_flags(
    argv: list[str], expected: ToyFlags, colour_from: str
) -> None:
    toy, seen = _toy_app()
    result = runner.invoke(toy, ["make", *argv])
    assert result.exit_code == 0, result.output
    assert seen == [(expected, colour_from)]


def test_an_environment_variable_fills_its_field() -> None:
    toy, seen = _toy_app()
    result = runner.invoke(toy, ["make", "--out", "o"], env={"TOY_COLOUR": "green"})
    assert result.exit_code == 0, result.output
    assert seen == [(ToyFlags(Path("o"), colour="green"), "ENVIRONMENT")]


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["make"], "Missing option '--out'"),  # a field without a default is required
        (["make", "--out", "o", "--count", "0"], "Invalid value for '--count'"),
        (["make", "--out", "o", "--count", "many"], "Invalid value for '--count'"),
        (["make", "--out", "o", "--shiny"], "No such option: --shiny"),
    ],
)
def test_bad_input_is_a_usage_error_naming_the_flag(argv: list[str], names: str) -> None:
    toy, seen = _toy_app()
    result = runner.invoke(toy, argv)
    assert result.exit_code == 2
    assert names in result.output
    assert "Traceback" not in result.output and seen == []


def test_help_lists_each_field_with_its_help_and_default_in_field_order() -> None:
    toy, _ = _toy_app()
    result = runner.invoke(toy, ["make", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    lines = result.output.splitlines()
    flags = ("--out", "--count", "--name", "--loud", "--colour", "--help")
    rows = [next(i for i, line in enumerate(lines) if f" {flag} " in line) for flag in flags]
    assert rows == sorted(rows)
    helps = ("Where the toy writes.", "How many toys.", "A toy's name", "Shout.", "Its colour.")
    for row, text in zip(rows, helps, strict=False):
        assert text in lines[row]
    assert "[required]" in lines[rows[0]] + lines[rows[0] + 1]
    assert "[default: 3]" in lines[rows[1]] and "[default: red]" in lines[rows[4]]


def _command(group: type[Any]) -> Any:
    @options.flags_command(group)
    def body(flags: Any, ctx: typer.Context) -> None:
        """A command."""

    return body


def test_the_signature_is_the_fields_then_the_command_s_own_parameters() -> None:
    signature = inspect.signature(_command(ToyFlags))
    keyword = inspect.Parameter.KEYWORD_ONLY
    fields = dataclasses.fields(ToyFlags)
    assert [p.name for p in signature.parameters.values()] == [f.name for f in fields] + ["ctx"]
    assert all(p.kind is keyword for p in signature.parameters.values())
    assert signature.parameters["out"].default is inspect.Parameter.empty
    assert [p.default for p in list(signature.parameters.values())[1:5]] == [
        3,
        None,
        False,
        "red",
    ]


def test_a_field_named_like_a_parameter_of_the_command_fails_at_import() -> None:
    @dataclass(frozen=True)
    class Clash:
        ctx: Loud = False

    with pytest.raises(ValueError, match="duplicate parameter name"):
        _command(Clash)


def test_connection_flags_come_after_the_command_s_own() -> None:
    seen: list[Any] = []

    @options.flags_command(ToyFlags)
    @options.consul_command
    def body(connection: options.Connection, flags: ToyFlags) -> None:
        seen.append((connection, flags))

    names = list(inspect.signature(body).parameters)
    own = [f.name for f in dataclasses.fields(ToyFlags)]
    assert names == own + [f.name for f in dataclasses.fields(options.Connection)]
    toy = typer.Typer(add_completion=False)
    toy.command()(body)
    result = runner.invoke(toy, ["--out", "o", "--address", "127.0.5.9:8500", "--timeout", "2"])
    assert result.exit_code == 0, result.output
    connection = options.Connection(address="127.0.5.9:8500", timeout=2.0)
    assert seen == [(connection, ToyFlags(Path("o")))]


# --- the commands that take their flags as one dataclass --------------------------------------


def _params(command: str) -> list[Any]:
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    return list(group.commands[command].params)


@pytest.mark.parametrize(
    ("command", "flags", "first_flags"),
    [
        ("verify", VerifyFlags, ["--spec", "--secrets-dir", "--templates-dir", "--inventory"]),
        ("history", HistoryFlags, ["--spec", "--job", "--since", "--limit", "--json", "--tick"]),
        ("worker-config", WorkerConfigFlags, ["--out", "--worker", "--all", "--spec"]),
    ],
)
def test_each_field_is_an_option_with_its_default_before_the_connection_flags(
    command: str, flags: type[Any], first_flags: list[str]
) -> None:
    params = _params(command)
    fields = dataclasses.fields(flags)
    own = params[: len(fields)]
    assert [p.name for p in own] == [f.name for f in fields]
    assert [p.opts[0] for p in own[: len(first_flags)]] == first_flags
    for param, field in zip(own, fields, strict=True):
        expected = None if field.default is dataclasses.MISSING else field.default
        assert (param.name, param.default, param.required) == (
            field.name,
            expected,
            field.default is dataclasses.MISSING,
        )
    rest = {p.name for p in params[len(fields) :]}
    connection = {f.name for f in dataclasses.fields(options.Connection)}
    assert rest == (connection if command != "worker-config" else set())
