"""`lockctl run` as users meet it: its one parser (argparse, provision/cli/runjob.py) reads each
argv into the run it asks for, and bad input is one line naming the flag, exit 2, no traceback,
whether the console script serves it or the Typer app's pass-through command (CliRunner)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from provision.cli import app
from provision.cli.entry import split_root
from provision.cli.runjob import RunArgs, parse_run
from provision.errors import InputError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def config_env() -> Iterator[None]:
    """LOCKCTL_CONFIG=env.json for the test, restored after it."""
    saved = os.environ.get("LOCKCTL_CONFIG")
    os.environ["LOCKCTL_CONFIG"] = "env.json"
    yield
    if saved is None:
        os.environ.pop("LOCKCTL_CONFIG", None)
    else:
        os.environ["LOCKCTL_CONFIG"] = saved


def _args(command: list[str], job: str = "j", config: str = "w.json", **flags: object) -> RunArgs:
    return RunArgs(command=command, job=job, config=Path(config), **flags)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--config", "/etc/l.json", "--job", "nightly", "--", "/usr/bin/ingest", "-v"],
         _args(["/usr/bin/ingest", "-v"], "nightly", "/etc/l.json")),
        (["-c", "w.json", "-j", "j", "--", "sh", "-c", "exit 3"], _args(["sh", "-c", "exit 3"])),
        (["-cw.json", "-jj", "--", "true"], _args(["true"])),
        (["--config=w.json", "--job=j", "--wait", "--timeout", "5m", "--", "true"],
         _args(["true"], wait=True, timeout="5m")),
        # the command starts at the first word that is not an option: what follows is its own
        (["--job", "j", "--config", "w.json", "true", "--", "x"], _args(["true", "--", "x"])),
        (["-j", "j", "-c", "w.json", "true", "-c", "x"], _args(["true", "-c", "x"])),
        (["-j", "j", "-c", "w.json", "--", "--", "x"], _args(["--", "x"])),
        (["-j", "j", "-c", "w.json", "--", "-x"], _args(["-x"])),
        (["-j", "j", "-c", "w.json", "--min-hold", "2s", "--allow-unsafe", "--", "true"],
         _args(["true"], min_hold="2s", allow_unsafe=True)),
        (["-j", "j", "-c", "w.json", "--metrics-textfile", "/var/t/j.prom", "--", "true"],
         _args(["true"], metrics_textfile="/var/t/j.prom")),
        (["--job", "j", "--", "true"], _args(["true"], config="env.json")),
        (["--job", "j", "-c", "w.json", "--", "true"], _args(["true"])),  # the flag wins
        (["-j", "j", "-c", "w.json", "--key", "tenant-42", "--", "true"],
         _args(["true"], key="tenant-42")),
    ],
)  # fmt: skip
def test_each_argv_is_read_into_the_run_it_asks_for(
    argv: list[str], expected: RunArgs, config_env: None
) -> None:
    assert parse_run(argv) == expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-j", "j", "-c", "w.json", "--bogus", "--", "true"], "unrecognized arguments: --bogus"),
        (["--conf", "w.json", "-j", "j", "--", "true"], "unrecognized arguments: --conf"),
        (["-j", "j", "-c", "w.json", "--wait=yes", "--", "true"], "argument --wait: ignored"),
        (["--job", "--config", "w.json", "--", "true"], "argument --job/-j: expected one"),
        (["-c", "w.json", "--", "true"], "required: --job/-j"),
        (["-j", "j", "--", "true"], "required: --config/-c"),
    ],
)
def test_a_usage_error_names_the_flag(argv: list[str], message: str) -> None:
    saved = os.environ.pop("LOCKCTL_CONFIG", None)
    try:
        with pytest.raises(InputError) as caught:
            parse_run(argv)
    finally:
        if saved is not None:
            os.environ["LOCKCTL_CONFIG"] = saved
    assert str(caught.value).startswith("run: ") and message in str(caught.value)
    assert str(caught.value).endswith("(see lockctl run --help)")


def test_run_and_verbose_before_it_are_split_from_the_root() -> None:
    plain = ["--config", "w.json", "--job", "j", "--", "true"]
    assert split_root(["run", *plain]) == (False, "run", plain)
    assert split_root(["-v", "--verbose", "schedule", "-c", "w"]) == (True, "schedule", ["-c", "w"])
    for argv in (["--version", "run", *plain], ["-h", "run"], [], ["-v"]):
        assert split_root(argv) == (False, None, []), argv


# --- what the user sees, from the console script and from the Typer app alike -----------------

CONSOLE = [sys.executable, "-m", "provision"]
runner = CliRunner()


def _console(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "LOCKCTL_CONFIG"}
    return subprocess.run(
        [*CONSOLE, *argv], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env
    )


TIMINGS = {"ttl": "15s", "lock_delay": "15s", "renew_interval": "5s", "kill_grace": "5s"}


@pytest.fixture
def worker_config(tmp_path: Path) -> Path:
    token = tmp_path / "w.token"
    token.write_text("placeholder-not-a-secret\n")
    token.chmod(0o600)
    path = tmp_path / "lockctl.json"
    record = {
        "format": 1,
        "worker": "worker-1",
        "consul": {"address": "http://127.0.0.1:9", "token_file": str(token)},
        "jobs": {"j": {"lock_key": "x/.lock", **TIMINGS}},
    }
    path.write_text(json.dumps(record))
    return path


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--job", "j", "--timeout", "5s"], "lockctl: error: --timeout only applies with --wait\n"),
        (["--job", "j", "--min-hold", "soon"], "lockctl: error: --min-hold: "),
        (["--job", "nope"], "no job 'nope' in this worker's config (jobs: j)\n"),
        (["--job", "j", "--metrics-textfile", "{tmp}"], ": is a folder, not a file\n"),
        (["--job", "j", "--metrics-textfile", "{tmp}/no/j.prom"], "/no does not exist\n"),
        (["--job", "j", "--metrics-textfile", "{tmp}/j.txt"], "must end in .prom"),
        (["--job", "j", "--bogus"], "lockctl: error: run: unrecognized arguments: --bogus"),
        (["--wait=1"], "lockctl: error: run: argument --wait: ignored explicit argument '1'"),
        ([], "lockctl: error: run: the following arguments are required: --job/-j"),
        (["--job", "j", "--key", "../j"], "lockctl: error: --key '../j': must be 1-128"),
        (["--job", "j", "--key", "a/b"], "lockctl: error: --key 'a/b': must be 1-128"),
        (["--job", "j", "--key", "t\x1b[2J"], "lockctl: error: --key 't\\x1b[2J': must be"),
    ],
    ids=["timeout-without-wait", "bad-min-hold", "no-such-job", "metrics-folder",
         "metrics-no-parent", "metrics-not-prom", "unknown-flag", "switch-with-value",
         "no-job", "key-dots", "key-slash", "key-escape"],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2_from_both_entries(
    worker_config: Path, extra: list[str], message: str
) -> None:
    argv = ["run", "--config", str(worker_config)]
    argv += [a.replace("{tmp}", str(worker_config.parent)) for a in extra] + ["--", "true"]
    console = _console(*argv)
    assert console.returncode == 2
    assert message in console.stderr and console.stderr.count("\n") == 1
    assert "Traceback" not in console.stderr and console.stdout == ""
    typer_app = runner.invoke(app, argv)
    assert (typer_app.exit_code, typer_app.output) == (2, console.stderr)


def test_a_missing_config_file_is_exit_2(tmp_path: Path) -> None:
    done = _console("run", "-c", str(tmp_path / "none.json"), "-j", "j", "--", "true")
    assert done.returncode == 2 and done.stderr.startswith("lockctl: error: ")
    assert done.stderr.count("\n") == 1


def test_a_config_with_problems_lists_them_then_one_summary(worker_config: Path) -> None:
    record = json.loads(worker_config.read_text())
    record["jobs"]["j"] = {"lock_key": "x/.lock", "ttl": "15s"}  # three timings missing
    worker_config.write_text(json.dumps(record))
    done = _console("run", "-c", str(worker_config), "-j", "j", "--", "true")
    assert done.returncode == 2 and done.stderr.endswith(": 3 problems\n")
    assert done.stderr.count("\n") == 4


def test_a_command_that_cannot_start_is_refused_before_any_lock(worker_config: Path) -> None:
    done = _console("run", "-c", str(worker_config), "-j", "j", "--", "/nonexistent/program")
    assert (done.returncode, done.stderr) == (
        2,
        "lockctl: error: cannot start '/nonexistent/program': not found or not executable\n",
    )


def test_run_help_is_the_parsers_from_both_entries() -> None:
    console = _console("run", "--help")
    assert console.returncode == 0 and console.stderr == ""
    assert console.stdout.startswith("usage: lockctl run --job JOB --config FILE")
    for flag in ("--job", "--config", "--wait", "--timeout", "--min-hold", "--allow-unsafe"):
        assert f"  {flag} " in console.stdout, flag
    assert "--metrics-textfile FILE" in console.stdout and "$LOCKCTL_CONFIG" in console.stdout
    typer_app = runner.invoke(app, ["run", "-h"])
    assert typer_app.exit_code == 0 and typer_app.output.startswith("usage: lockctl run ")


def test_the_root_help_lists_run_and_schedule() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "Run COMMAND only if this worker holds the job's lock" in result.output
    assert "Run every job of the config that has a schedule" in result.output
