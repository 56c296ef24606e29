"""The layers as the interpreter sees them: commands that never talk to Consul do not load the HTTP
stack, and the pure layers import no HTTP library (lint-imports checks the import graph; this
checks what a real run loads, lazy imports included)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HTTP_MODULES = ("requests", "urllib3")

# Runs the CLI in this interpreter, then reports which of the named top-level packages it loaded.
# The console script's fast path ends in os._exit (entry.exit_process); here it raises instead.
RUN_CLI = """
import json, sys
import provision.cli.entry
from provision.cli import main
def exit_process(code):
    raise SystemExit(code)
provision.cli.entry.exit_process = exit_process
watched, argv = sys.argv[1].split(","), sys.argv[2:]
sys.argv = ["lockctl", *argv]
try:
    main()
except SystemExit as stop:
    code = stop.code or 0
else:
    code = 0
loaded = sorted(name for name in watched if name in sys.modules)
sys.stdout.flush()
print("\\nLOADED " + json.dumps({"code": code, "loaded": loaded}))
"""

IMPORT_MODULE = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
print(json.dumps(sorted(name for name in sys.argv[2].split(",") if name in sys.modules)))
"""


def _run_cli(*argv: str, watched: tuple[str, ...] = HTTP_MODULES) -> tuple[int, list[str]]:
    """Exit code and which of `watched` (top-level packages or modules) the command loaded."""
    done = subprocess.run(
        [sys.executable, "-c", RUN_CLI, ",".join(watched), *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    report = done.stdout.rpartition("\nLOADED ")[2]
    assert report, done.stderr
    record = json.loads(report)
    return record["code"], record["loaded"]


@pytest.mark.parametrize(
    "argv",
    [
        ("render", "--check"),
        ("lint", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "policies").glob("*.hcl"))),
        ("--help",),
        ("apply", "--help"),  # shows the --concurrency limits without the HTTP stack
    ],
    ids=["render-check", "lint", "help", "apply-help"],
)
def test_commands_that_do_not_talk_to_consul_do_not_load_requests(argv: tuple[str, ...]) -> None:
    code, loaded = _run_cli(*argv)
    assert code == 0
    assert loaded == []


def test_the_probe_sees_what_a_command_loads_lazily() -> None:
    """The check above can fail: render imports jinja2 inside the command, and it is seen."""
    code, loaded = _run_cli("render", "--check", watched=("jinja2", *HTTP_MODULES))
    assert code == 0
    assert loaded == ["jinja2"]


# What the CLI loads that a plain `lockctl run` must not: Typer's help renderer, the other commands.
NOT_FOR_RUN = (
    "rich",
    "pydantic",
    "jinja2",
    "hcl2",
    "provision.cli.app",
    *(f"provision.cli.{name}" for name in ("acl", "cluster", "consul_binary", "next", "options")),
    *(f"provision.cli.{name}" for name in ("policies", "status", "verify", "workers")),
    "provision.cli.schedulejob",
)


def test_run_loads_the_runner_but_not_rich_or_the_other_commands(tmp_path: Path) -> None:
    """The whole run path up to the first HTTP call (the job is refused just before it):
    the runner and requests are loaded, rich and the other commands are not. (tests/integration/
    test_run_entry.py checks a real skip, Typer and click included.)"""
    token = tmp_path / "w.token"
    token.write_text("placeholder-not-a-secret\n")
    token.chmod(0o600)
    timings = {"ttl": "15s", "lock_delay": "15s", "renew_interval": "5s", "kill_grace": "5s"}
    config = tmp_path / "lockctl.json"
    config.write_text(
        json.dumps(
            {
                "format": 1,
                "worker": "worker-1",
                "consul": {"address": "http://127.0.0.1:9", "token_file": str(token)},
                "jobs": {"j": {"lock_key": "x/.lock", **timings}},
            }
        )
    )
    argv = ("run", "--config", str(config), "--job", "j", "--", "/nonexistent/program")
    watched = ("requests", "provision.runner.plain", *NOT_FOR_RUN)
    code, loaded = _run_cli(*argv, watched=watched)
    assert code == 2  # cannot start /nonexistent/program: refused before any lock
    assert loaded == ["provision.runner.plain", "requests"]


def test_run_help_is_served_without_typer_too() -> None:
    code, loaded = _run_cli("run", "--help", watched=("typer", "click", *NOT_FOR_RUN))
    assert code == 0
    assert loaded == []


def test_the_probe_sees_the_whole_cli_when_typer_serves_a_command() -> None:
    """The checks above can fail: `status --help` goes to the Typer app, and it is seen."""
    code, loaded = _run_cli("status", "--help", watched=NOT_FOR_RUN)
    assert code == 0
    assert "provision.cli.acl" in loaded and "provision.cli.app" in loaded


@pytest.mark.parametrize(
    ("module", "not_loaded"),
    [
        ("provision.spec", (*HTTP_MODULES, "jinja2")),
        ("provision.acl.lint", (*HTTP_MODULES, "jinja2")),
        ("provision.acl.plan", (*HTTP_MODULES, "jinja2")),
        ("provision.acl.render", HTTP_MODULES),  # renders Jinja templates: jinja2 is its job
        ("provision.timings", (*HTTP_MODULES, "jinja2")),
        ("provision.durations", (*HTTP_MODULES, "jinja2")),
        ("provision.acl.concurrency", HTTP_MODULES),
    ],
)
def test_pure_layers_import_no_http_library(module: str, not_loaded: tuple[str, ...]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_MODULE, module, ",".join(not_loaded)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(done.stdout) == []
