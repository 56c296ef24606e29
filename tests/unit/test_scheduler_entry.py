"""`lockctl schedule` served without Typer (provision/cli/schedulejob.py, entry.py): a plain
invocation is parsed as Typer would parse it, anything else goes to Typer, and the scheduler's
process loads neither Typer's pydantic nor rich nor the other commands (a long-lived process
keeps what it loads: bench/scheduler.py's RSS)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.main

from provision.cli.app import app
from provision.cli.schedulejob import ScheduleArgs, recognize_schedule

ROOT = Path(__file__).resolve().parents[2]
NO_ENV: dict[str, str] = {}


@pytest.mark.parametrize(
    ("argv", "environ", "expected"),
    [
        (["--config", "c.json"], NO_ENV, ScheduleArgs(Path("c.json"))),
        (["-c", "c.json"], NO_ENV, ScheduleArgs(Path("c.json"))),
        (["--config=c.json"], NO_ENV, ScheduleArgs(Path("c.json"))),
        (["--config", "c.json", "--listen", "9100", "--allow-unsafe"], NO_ENV,
         ScheduleArgs(Path("c.json"), True, "9100")),
        (["--listen=127.0.0.1:9100", "-c", "c.json"], NO_ENV,
         ScheduleArgs(Path("c.json"), False, "127.0.0.1:9100")),
        ([], {"LOCKCTL_CONFIG": "e.json"}, ScheduleArgs(Path("e.json"))),
        (["-c", "c.json"], {"LOCKCTL_CONFIG": "e.json"}, ScheduleArgs(Path("c.json"))),
        # at the least doubt, Typer decides (and prints what it always has)
        ([], NO_ENV, None),
        ([], {"LOCKCTL_CONFIG": ""}, None),
        (["-h"], NO_ENV, None),
        (["--help"], NO_ENV, None),
        (["--config"], NO_ENV, None),
        (["--config", ""], NO_ENV, None),
        (["--config", "-c"], NO_ENV, None),
        (["-c=c.json"], NO_ENV, None),
        (["-cc.json"], NO_ENV, None),
        (["--config", "a", "--config", "b"], NO_ENV, None),
        (["--config", "a", "--allow-unsafe", "--allow-unsafe"], NO_ENV, None),
        (["--config", "a", "--allow-unsafe=yes"], NO_ENV, None),
        (["--config", "a", "extra"], NO_ENV, None),
        (["--config", "a", "--listen"], NO_ENV, None),
        (["--conf", "a"], NO_ENV, None),
    ],
)  # fmt: skip
def test_recognize_schedule(
    argv: list[str], environ: dict[str, str], expected: ScheduleArgs | None
) -> None:
    assert recognize_schedule(argv, environ) == expected


def _typer_parse(argv: list[str]) -> dict[str, Any]:
    command = typer.main.get_command(app).commands["schedule"]  # type: ignore[attr-defined]
    with command.make_context("schedule", list(argv)) as context:
        return dict(context.params)


@pytest.mark.parametrize(
    "argv",
    [
        ["--config", "c.json"],
        ["-c", "c.json", "--allow-unsafe"],
        ["--config=c.json", "--listen", "0.0.0.0:9100"],
        ["--listen=9100", "--allow-unsafe", "-c", "x y.json"],
    ],
)
def test_what_it_recognizes_typer_parses_alike(argv: list[str]) -> None:
    ours = recognize_schedule(argv, NO_ENV)
    assert ours is not None
    assert _typer_parse(argv) == {
        "config": ours.config,
        "allow_unsafe": ours.allow_unsafe,
        "listen": ours.listen,
    }


def test_the_typer_command_has_exactly_these_flags() -> None:
    command = typer.main.get_command(app).commands["schedule"]  # type: ignore[attr-defined]
    flags = {param.name: (tuple(param.opts), param.envvar) for param in command.params}
    assert flags == {
        "config": (("--config", "-c"), "LOCKCTL_CONFIG"),
        "allow_unsafe": (("--allow-unsafe",), None),
        "listen": (("--listen",), None),
    }


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


def test_the_probe_sees_typer_when_it_serves_schedule(unscheduled_config: Path) -> None:
    """The check above can fail: a repeated flag goes to the Typer command, and it is seen."""
    config = str(unscheduled_config)
    code, loaded = _probe("schedule", "--config", config, "--config", config)
    assert code == 2
    assert {"pydantic", "provision.cli.app", "provision.scheduler.service"} <= set(loaded)
