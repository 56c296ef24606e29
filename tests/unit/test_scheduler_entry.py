"""`lockctl schedule` as users meet it: its one parser (argparse, provision/cli/schedulejob.py)
reads each argv into the scheduler it asks for, bad input is one line naming the flag (exit 2),
and the scheduler's process loads neither Typer's pydantic nor rich nor the other commands (a
long-lived process keeps what it loads: bench/scheduler.py's RSS)."""

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
from provision.cli.schedulejob import ScheduleArgs, parse_schedule
from provision.errors import InputError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def config_env(request: pytest.FixtureRequest) -> Iterator[None]:
    """LOCKCTL_CONFIG as the test's `environ` parameter says (unset when absent)."""
    saved = os.environ.pop("LOCKCTL_CONFIG", None)
    value = request.node.callspec.params["environ"].get("LOCKCTL_CONFIG")
    if value is not None:
        os.environ["LOCKCTL_CONFIG"] = value
    yield
    os.environ.pop("LOCKCTL_CONFIG", None)
    if saved is not None:
        os.environ["LOCKCTL_CONFIG"] = saved


NO_ENV: dict[str, str] = {}


@pytest.mark.parametrize(
    ("argv", "environ", "expected"),
    [
        (["--config", "c.json"], NO_ENV, ScheduleArgs(Path("c.json"))),
        (["-c", "c.json"], NO_ENV, ScheduleArgs(Path("c.json"))),
        (["--config=c.json"], NO_ENV, ScheduleArgs(Path("c.json"))),
        (["-cc.json"], NO_ENV, ScheduleArgs(Path("c.json"))),
        (["--config", "c.json", "--listen", "9100", "--allow-unsafe"], NO_ENV,
         ScheduleArgs(Path("c.json"), True, "9100")),
        (["--listen=127.0.0.1:9100", "-c", "c.json"], NO_ENV,
         ScheduleArgs(Path("c.json"), False, "127.0.0.1:9100")),
        ([], {"LOCKCTL_CONFIG": "e.json"}, ScheduleArgs(Path("e.json"))),
        (["-c", "c.json", "--max-concurrent-runs", "2"], NO_ENV,
         ScheduleArgs(Path("c.json"), max_concurrent_runs=2)),
        (["-c", "c.json"], {"LOCKCTL_CONFIG": "e.json"}, ScheduleArgs(Path("c.json"))),
    ],
)  # fmt: skip
def test_each_argv_is_read_into_the_scheduler_it_asks_for(
    argv: list[str], environ: dict[str, str], expected: ScheduleArgs, config_env: None
) -> None:
    assert parse_schedule(argv) == expected


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        ([], NO_ENV, "the following arguments are required: --config/-c"),
        ([], {"LOCKCTL_CONFIG": ""}, "the following arguments are required: --config/-c"),
        (["--config"], NO_ENV, "argument --config/-c: expected one argument"),
        (
            ["--config", "a", "--allow-unsafe=yes"],
            NO_ENV,
            "argument --allow-unsafe: ignored explicit argument 'yes'",
        ),
        (["--config", "a", "extra"], NO_ENV, "unrecognized arguments: extra"),
        (["--config", "a", "--listen"], NO_ENV, "argument --listen: expected one argument"),
        (["--conf", "a"], NO_ENV, "unrecognized arguments: --conf a"),
        (
            ["-c", "a", "--max-concurrent-runs", "0"],
            NO_ENV,
            "argument --max-concurrent-runs: 0 is below 1",
        ),
        (
            ["-c", "a", "--max-concurrent-runs", "two"],
            NO_ENV,
            "argument --max-concurrent-runs: must be a whole number, 1 or more, not 'two'",
        ),
    ],
)
def test_a_usage_error_names_the_flag(
    argv: list[str], environ: dict[str, str], message: str, config_env: None
) -> None:
    with pytest.raises(InputError) as caught:
        parse_schedule(argv)
    assert str(caught.value) == f"schedule: {message} (see lockctl schedule --help)"


def _console(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "LOCKCTL_CONFIG"}
    return subprocess.run(
        [sys.executable, "-m", "provision", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_a_usage_error_is_one_line_and_exit_2_from_both_entries() -> None:
    console = _console("schedule", "--config", "c.json", "--bogus")
    expected = "lockctl: error: schedule: unrecognized arguments: --bogus"
    assert console.returncode == 2 and console.stderr.startswith(expected)
    assert console.stderr.count("\n") == 1 and "Traceback" not in console.stderr
    typer_app = CliRunner().invoke(app, ["schedule", "--config", "c.json", "--bogus"])
    assert (typer_app.exit_code, typer_app.output) == (2, console.stderr)


def test_schedule_help_is_the_parsers() -> None:
    console = _console("schedule", "-h")
    assert console.returncode == 0
    assert console.stdout.startswith("usage: lockctl schedule [-h] [--config FILE]")
    assert "--listen HOST:PORT" in console.stdout and "--allow-unsafe" in console.stdout


# Runs the console script's main in a fresh interpreter (exit_process raises instead of
# os._exit), then says which of the watched modules it loaded.
PROBE = """
import json, sys
import provision.cli.entry
def exit_process(code):
    raise SystemExit(code)
provision.cli.entry.exit_process = exit_process
watched = sys.argv[1].split(",")
try:
    provision.cli.entry.main(sys.argv[2:])
except SystemExit as stop:
    code = stop.code or 0
print("\\nLOADED " + json.dumps([code, sorted(m for m in watched if m in sys.modules)]))
"""
WATCHED = (
    "pydantic",
    "rich",
    "provision.cli.app",
    "provision.cli.acl",
    "provision.scheduler.service",
)


def _probe(*argv: str) -> tuple[int, list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(WATCHED), *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    report = done.stdout.rpartition("\nLOADED ")[2]
    assert report, done.stderr
    code, loaded = json.loads(report)
    return code, loaded


@pytest.fixture
def unscheduled_config(tmp_path: Path) -> Path:
    """A worker config with no scheduled job: the scheduler loads, then refuses (exit 2)."""
    token = tmp_path / "w.token"
    token.write_text("placeholder-not-a-secret\n")
    token.chmod(0o600)
    timings = {"ttl": "15s", "lock_delay": "15s", "renew_interval": "5s", "kill_grace": "5s"}
    config = tmp_path / "lockctl.json"
    consul = {"address": "http://127.0.0.1:9", "token_file": str(token)}
    jobs = {"j": {"lock_key": "x/.lock", **timings}}
    config.write_text(
        json.dumps({"format": 1, "worker": "worker-1", "consul": consul, "jobs": jobs})
    )
    return config


def test_a_plain_schedule_loads_the_scheduler_but_not_typers_pydantic_or_rich(
    unscheduled_config: Path,
) -> None:
    code, loaded = _probe("schedule", "--config", str(unscheduled_config))
    assert code == 2  # nothing to schedule: refused after the scheduler's modules loaded
    assert loaded == ["provision.scheduler.service"]


def test_the_probe_sees_typer_when_it_serves_a_command() -> None:
    """The check above can fail: `status --help` goes to the Typer app, and it is seen."""
    code, loaded = _probe("status", "--help")
    assert code == 0
    assert {"pydantic", "provision.cli.app"} <= set(loaded)
