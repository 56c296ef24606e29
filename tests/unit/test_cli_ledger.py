"""`lockctl history` and `lockctl check` before Consul: flags refused at the flag, and check's
own exit convention (UNKNOWN, 3, on stdout) for what keeps it from judging."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from provision.cli import app

runner = CliRunner()
SPEC = """worker "worker-1" {
  address = "http://127.0.0.1:1"
}
job "plain" {
  prefix  = "locks/plain/"
  workers = ["worker-1"]
}
job "hourly" {
  prefix   = "locks/hourly/"
  workers  = ["worker-1"]
  schedule = "@hourly"
}
"""


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "locks.hcl"
    path.write_text(SPEC)
    return path


@pytest.mark.parametrize("since", ["yesterday", "-1h", "2026-13-01", "\x1b[2J" * 100])
def test_history_refuses_a_bad_since_in_one_line_before_reading_anything(since: str) -> None:
    result = runner.invoke(app, ["history", "--spec", "/nonexistent.hcl", "--since", since])
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("lockctl: error: --since: ") and "\x1b" not in line
    assert len(line) < 250


@pytest.mark.parametrize("limit", ["0", "10001", "many"])
def test_history_refuses_a_limit_outside_what_a_ledger_keeps_before_reading_anything(
    limit: str,
) -> None:
    result = runner.invoke(app, ["history", "--spec", "/nonexistent.hcl", "--limit", limit])
    assert result.exit_code == 2 and "--limit" in result.output


def test_history_names_an_unknown_job_and_a_job_without_schedule(spec: Path) -> None:
    result = runner.invoke(app, ["history", "--spec", str(spec), "--job", "nope"])
    assert result.exit_code == 2 and "--job 'nope': no such job" in result.output
    result = runner.invoke(app, ["history", "--spec", str(spec), "--job", "plain"])
    assert result.exit_code == 2 and f"{spec}:4: job 'plain' has no schedule" in result.output


def test_check_is_unknown_when_the_spec_does_not_load(tmp_path: Path) -> None:
    result = runner.invoke(app, ["check", "--spec", str(tmp_path / "missing.hcl")])
    assert result.exit_code == 3
    assert result.stdout.startswith("UNKNOWN: ")


def test_check_is_unknown_when_consul_is_unreachable(spec: Path) -> None:
    flags = ["--address", "http://127.0.0.1:1", "--timeout", "1"]
    result = runner.invoke(
        app, ["check", "--spec", str(spec), *flags], env={"CONSUL_HTTP_TOKEN": ""}
    )
    assert result.exit_code == 3, result.output
    assert result.stdout.startswith("UNKNOWN: consul: ") and len(result.stdout.splitlines()) == 1


def test_check_is_unknown_when_no_job_has_a_schedule(spec: Path) -> None:
    result = runner.invoke(app, ["check", "--spec", str(spec), "--job", "plain"])
    assert result.exit_code == 3 and result.stdout.startswith("UNKNOWN: ")
