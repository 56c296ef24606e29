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
RUN_CLI = """
import json, sys
from provision.cli import main
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
