"""`lockctl backfill`'s flag errors: one line naming the flag, exit 2, before Consul is asked
(the address given is one nothing listens on)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from provision.cli.app import app
from provision.errors import EXIT_INPUT

SPEC = """worker "w1" {
  address = "http://127.0.0.1:8500"
}
job "report" {
  prefix = "jobs/report/"
  workers = ["w1"]
  schedule = "@every 1h"
  command = ["/bin/true"]
}
"""
FROM, TO = "2026-12-07T01:00:00Z", "2026-12-07T03:00:00Z"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--from", "yesterday", "--to", TO], "--from 'yesterday' is not an instant such as "),
        (["--from", FROM, "--to", "2026-12-07T03:00:00"], "--to '2026-12-07T03:00:00' is not an"),
        (["--from", TO, "--to", FROM], "--from 2026-12-07T03:00:00.000Z is not before --to "),
        (["--from", FROM, "--to", FROM], "--from 2026-12-07T01:00:00.000Z is not before --to "),
        (["--from", FROM, "--to", TO, "--reason", " "], "--reason is empty"),
        (["--from", FROM, "--to", TO, "--datacenter", "dc9"], "--datacenter dc9: "),
    ],
)
def test_a_bad_flag_is_one_line_naming_it_and_exit_2(
    tmp_path: Path, argv: list[str], said: str
) -> None:
    spec = tmp_path / "locks.hcl"
    spec.write_text(SPEC)
    flags = ["--spec", str(spec), "--address", "127.0.0.1:1"]
    result = CliRunner().invoke(app, ["backfill", "report", *argv, *flags])
    lines = result.output.strip().splitlines()
    assert result.exit_code == EXIT_INPUT, result.output
    assert len(lines) == 1 and lines[0].startswith(f"lockctl: error: {said}"), lines


def test_a_job_not_in_the_spec_is_refused_before_consul(tmp_path: Path) -> None:
    spec = tmp_path / "locks.hcl"
    spec.write_text(SPEC)
    flags = ["--spec", str(spec), "--address", "127.0.0.1:1", "--from", FROM, "--to", TO]
    result = CliRunner().invoke(app, ["backfill", "reprot", *flags])
    assert result.exit_code == EXIT_INPUT
    assert result.output.strip() == f"lockctl: error: job 'reprot' is not in {spec}"
