"""`lockctl render` and `lockctl lint` through the CLI's error boundary (CliRunner)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from provision.cli import policies
from provision.cli.app import ErrorBoundaryGroup

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
COPIED_EXAMPLE = (
    'path "job/singleton" {\n  policy = "write"\n}\nsession "job-lock" {\n  policy = "write"\n}\n'
)


def _app() -> typer.Typer:
    """The two commands behind the same error boundary as the real `lockctl` app."""
    app = typer.Typer(cls=ErrorBoundaryGroup, pretty_exceptions_enable=False)
    app.command("render")(policies.render)
    app.command("lint")(policies.lint)
    return app


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder laid out like a checkout: policies/locks.hcl and its rendered files."""
    shutil.copytree(ROOT / "policies", tmp_path / "policies")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_render_check_passes_on_the_committed_example(checkout: Path) -> None:
    result = runner.invoke(_app(), ["render", "--check"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "policies: up to date (7 policies)\n"


def test_render_check_fails_with_the_diff_when_stale(checkout: Path) -> None:
    (checkout / "policies" / "lock-hourly-report.hcl").write_text("# edited by hand\n")
    result = runner.invoke(_app(), ["render", "--check"])
    assert result.exit_code == 1
    assert '+key_prefix "locks/hourly-report/" {' in result.stdout
    assert "-# edited by hand" in result.stdout
    assert result.stderr == "lockctl: policies is stale: run `lockctl render`\n"
    assert (checkout / "policies" / "lock-hourly-report.hcl").read_text() == "# edited by hand\n"


def test_render_writes_and_reports(checkout: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = runner.invoke(_app(), ["render", "--out", str(out)])
    assert result.exit_code == 0
    assert f"wrote {out / 'manifest.json'}" in result.stdout
    assert sorted(p.name for p in out.iterdir()) == sorted(
        p.name for p in (checkout / "policies").iterdir() if p.name != "locks.hcl"
    )
    again = runner.invoke(_app(), ["render", "--out", str(out)])
    assert again.stdout == f"{out}: 7 policies, 8 files unchanged\n"


def test_a_bad_spec_prints_every_problem_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    spec = tmp_path / "bad.hcl"
    spec.write_text('worker "w" {}\njob "a" {\n  prefix = "/a"\n  workers = ["x"]\n}\n')
    out = tmp_path / "out"
    result = runner.invoke(_app(), ["render", "--spec", str(spec), "--out", str(out)])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f'{spec}:3: job "a".prefix: "/a" must be relative: Consul keys have no leading \'/\'',
        f'{spec}:4: job "a".workers: "x": not a declared worker (declared: w)',
        f"lockctl: error: {spec}: 2 problems",
    ]
    assert not out.exists()


def test_render_with_a_missing_templates_dir_is_an_input_error(checkout: Path) -> None:
    result = runner.invoke(_app(), ["render", "--templates-dir", "nope"])
    assert result.exit_code == 2
    assert result.stderr == "lockctl: error: --templates-dir nope: not a folder\n"


def test_lint_flags_the_widely_copied_example_twice(checkout: Path) -> None:
    Path("example.hcl").write_text(COPIED_EXAMPLE)
    result = runner.invoke(_app(), ["lint", "example.hcl"])
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert [line.split(": ")[0:3] for line in lines] == [
        ["example.hcl:1", "error", "unknown-resource"],
        ["example.hcl:4", "error", "session-not-a-node"],
    ]
    assert result.stderr == "lockctl lint: 1 file, 2 errors, 0 warnings\n"


def test_lint_of_the_committed_policies_is_clean_and_skips_the_spec(checkout: Path) -> None:
    files = sorted(str(p.relative_to(checkout)) for p in (checkout / "policies").glob("*.hcl"))
    result = runner.invoke(_app(), ["lint", *files])
    assert result.exit_code == 0
    assert result.stdout == "lockctl lint: 8 files, 0 errors, 0 warnings\n"
    assert result.stderr == "policies/locks.hcl: skipped: it is the spec, not a policy\n"


def test_lint_without_a_spec_uses_node_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("s.hcl").write_text('session "web-1" {\n  policy = "write"\n}\n')
    unchecked = runner.invoke(_app(), ["lint", "s.hcl"])
    assert unchecked.exit_code == 1 and "warning: session-not-a-node" in unchecked.stdout
    tolerant = runner.invoke(_app(), ["lint", "--errors-only", "s.hcl"])
    assert tolerant.exit_code == 0 and "warning: session-not-a-node" in tolerant.stdout
    ok = runner.invoke(_app(), ["lint", "--node", "web-1", "s.hcl"])
    assert ok.exit_code == 0 and ok.stdout == "lockctl lint: 1 file, 0 errors, 0 warnings\n"
    wrong = runner.invoke(_app(), ["lint", "--node", "worker-1", "s.hcl"])
    assert wrong.exit_code == 1 and "error: session-not-a-node" in wrong.stdout


def test_lint_of_a_missing_file_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(_app(), ["lint", "missing.hcl"])
    assert result.exit_code == 2
    assert result.stderr.startswith("lockctl: error: missing.hcl: cannot read")


CATCHUP_SPEC = """worker "worker-1" { address = "http://127.0.0.21:8500" }
job "never" {
  prefix         = "locks/never/"
  workers        = ["worker-1"]
  schedule       = "@hourly"
  start_deadline = "1h"
  catchup        = "latest"
}
job "can" {
  prefix         = "locks/can/"
  workers        = ["worker-1"]
  schedule       = "@every 10s"
  start_deadline = "30s"
  catchup        = "latest"
}
job "skips" {
  prefix   = "locks/skips/"
  workers  = ["worker-1"]
  schedule = "@every 10s"
}
"""


OVERLAP_SPEC = """worker "worker-1" { address = "http://127.0.0.21:8500" }
job "late" {
  prefix     = "locks/late/"
  workers    = ["worker-1"]
  schedule   = "@every 3s"
  kill_grace = "5s"
  overlap    = "cancel"
}
job "prompt" {
  prefix     = "locks/prompt/"
  workers    = ["worker-1"]
  schedule   = "@every 10s"
  kill_grace = "5s"
  overlap    = "cancel"
}
job "skips" {
  prefix     = "locks/skips/"
  workers    = ["worker-1"]
  schedule   = "@every 3s"
  kill_grace = "5s"
}
"""


def test_lint_warns_of_a_cancel_whose_kill_grace_is_over_the_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("locks.hcl").write_text(OVERLAP_SPEC)
    Path("s.hcl").write_text('session "worker-1" {\n  policy = "write"\n}\n')
    result = runner.invoke(_app(), ["lint", "--spec", "locks.hcl", "s.hcl"])
    assert result.exit_code == 1
    assert result.stdout == (
        'locks.hcl:2: warning: overlap: job "late": overlap = "cancel" with kill_grace 5s over '
        "the schedule's interval 3s: a run that ignores SIGTERM is still running at the next "
        'tick (fix: lower kill_grace below the interval, or set overlap = "skip")\n'
    )


def test_lint_warns_of_a_catchup_that_can_never_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("locks.hcl").write_text(CATCHUP_SPEC)
    Path("s.hcl").write_text('session "worker-1" {\n  policy = "write"\n}\n')
    result = runner.invoke(_app(), ["lint", "--spec", "locks.hcl", "s.hcl"])
    assert result.exit_code == 1
    assert result.stdout == (
        'locks.hcl:2: warning: catchup: job "never": catchup = "latest" never runs a tick: '
        "start_deadline 1h is not above the schedule's interval 1h (fix: raise start_deadline "
        'above the interval, or set catchup = "skip")\n'
    )
    assert result.stderr == "lockctl lint: 1 file, 0 errors, 1 warnings\n"
    tolerant = runner.invoke(_app(), ["lint", "--errors-only", "--spec", "locks.hcl", "s.hcl"])
    assert tolerant.exit_code == 0
