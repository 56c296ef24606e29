"""The console script's fast path for `lockctl run` (provision/cli/entry.py) agrees with the Typer
command it stands in for: the same flags, flag by flag; the same parse of every argv it accepts
(and Typer gets every argv it does not); the same messages and exit codes for bad input."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main
from hypothesis import given, settings
from hypothesis import strategies as st

from provision.cli.app import app
from provision.cli.entry import recognize, recognize_run
from provision.cli.runjob import RUN_FLAGS, RunArgs

ROOT = Path(__file__).resolve().parents[2]


def _typer_run_command() -> Any:
    return typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]


def test_the_table_and_the_typer_command_agree_flag_by_flag() -> None:
    params = {param.name: param for param in _typer_run_command().params}
    assert set(params) == {"command"} | {flag.field for flag in RUN_FLAGS}
    for flag in RUN_FLAGS:
        param = params[flag.field]
        assert tuple(param.opts) == flag.names, flag.field
        assert param.secondary_opts == [], flag.field  # no --no-wait: the table has none
        assert param.is_flag == (not flag.takes_value), flag.field
        assert param.required == flag.required, flag.field
        assert param.envvar == flag.envvar, flag.field
        assert param.help == flag.help, flag.field
        assert not param.multiple, flag.field
        assert param.nargs == 1, flag.field
    command = params["command"]
    assert command.required and command.nargs == -1
    fields = {field.name for field in dataclasses.fields(RunArgs)}
    assert fields == set(params)


@pytest.fixture
def environ() -> Iterator[dict[str, str]]:
    saved = os.environ.get("LOCKCTL_CONFIG")
    yield os.environ  # type: ignore[misc]
    if saved is None:
        os.environ.pop("LOCKCTL_CONFIG", None)
    else:
        os.environ["LOCKCTL_CONFIG"] = saved


def _typer_parse(argv: list[str]) -> dict[str, Any] | None:
    """What Typer's run command makes of `argv` (its parameters), or None if it refuses."""
    try:
        context = _typer_run_command().make_context("run", list(argv))
    except BaseException:  # usage errors, --help's exit: Typer does not run the job
        return None
    params = dict(context.params)
    params["command"] = list(params["command"])
    return params


def _agree(argv: list[str], config_env: str | None) -> RunArgs | None:
    if config_env is None:
        os.environ.pop("LOCKCTL_CONFIG", None)
    else:
        os.environ["LOCKCTL_CONFIG"] = config_env
    mine = recognize_run(argv, os.environ)
    if mine is not None:
        theirs = _typer_parse(argv)
        assert theirs is not None, f"fast path accepted what Typer refuses: {argv}"
        assert dataclasses.asdict(mine) == theirs, argv
    return mine


PLAIN = [
    ["--config", "/etc/lockctl/lockctl.json", "--job", "nightly", "--", "/usr/bin/ingest", "-v"],
    ["-c", "w.json", "-j", "nightly", "--", "sh", "-c", "exit 3"],
    ["--config=w.json", "--job=nightly", "--wait", "--timeout", "5m", "--", "true"],
    ["--job", "nightly", "--config", "w.json", "true", "--", "x"],  # the command starts at `true`
    ["--job", "j", "--config", "w.json", "--min-hold", "2s", "--allow-unsafe", "--", "true"],
    ["--job", "j", "--config", "w.json", "--metrics-textfile", "/var/lib/t/j.prom", "--", "true"],
    ["--job", "j", "--", "true"],  # config from LOCKCTL_CONFIG
]


@pytest.mark.parametrize("argv", PLAIN)
def test_plain_runs_take_the_fast_path_and_parse_as_typer_does(
    argv: list[str], environ: dict[str, str]
) -> None:
    assert _agree(argv, "env.json") is not None


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["-h", "--job", "j", "--", "true"],
        ["--job", "j", "--config", "w.json", "--help", "--", "true"],
        ["--job", "j", "--config", "w.json", "--bogus", "--", "true"],
        ["--job", "j", "--config", "w.json"],  # no command
        ["--job", "j", "--job", "k", "--config", "w.json", "--", "true"],  # repeated
        ["--job", "--config", "w.json", "--", "true"],  # a value that looks like a flag
        ["--job", "j", "--config", "w.json", "--wait=yes", "--", "true"],
        ["-jj", "--config", "w.json", "--", "true"],
        ["--job", "j", "--config", "", "--", "true"],
        ["--job"],
    ],
)
def test_anything_else_goes_to_typer(argv: list[str], environ: dict[str, str]) -> None:
    assert _agree(argv, "env.json") is None


def test_without_config_flag_or_environment_typer_reports_it(environ: dict[str, str]) -> None:
    for value in (None, ""):
        assert _agree(["--job", "j", "--", "true"], value) is None


# Pieces of argv: well-formed options (so that many draws are accepted and compared) and each
# kind of doubt the fast path must hand to Typer.
PIECES = [
    *([name, "v"] if flag.takes_value else [name] for flag in RUN_FLAGS for name in flag.names),
    *([f"{flag.names[0]}=v"] for flag in RUN_FLAGS),
    *([name] for flag in RUN_FLAGS for name in flag.names if flag.takes_value),  # no value
    *([word] for word in ("--", "-", "-h", "--help", "--no-wait", "--bogus", "-jx", "-v", "")),
    *([word] for word in ("true", "x=y", "--job=", "--config=-c")),
]


@settings(max_examples=600, deadline=None)
@given(
    pieces=st.lists(st.sampled_from(PIECES), max_size=8),
    command=st.lists(st.sampled_from(["true", "--", "-x", "--job", ""]), max_size=3),
    config_env=st.sampled_from([None, "", "env.json", " "]),
)
def test_any_argv_the_fast_path_accepts_typer_parses_the_same(
    pieces: list[list[str]], command: list[str], config_env: str | None
) -> None:
    argv = [word for piece in pieces for word in piece] + command
    saved = os.environ.get("LOCKCTL_CONFIG")
    try:
        _agree(argv, config_env)
    finally:
        if saved is None:
            os.environ.pop("LOCKCTL_CONFIG", None)
        else:
            os.environ["LOCKCTL_CONFIG"] = saved


def test_only_run_and_verbose_before_it_are_served_without_typer() -> None:
    plain = ["--config", "w.json", "--job", "j", "--", "true"]
    assert recognize(["run", *plain], {})[0] is False
    verbose, args = recognize(["-v", "--verbose", "run", *plain], {})
    assert verbose and args is not None and args.job == "j"
    for argv in (["status"], ["--version", "run", *plain], ["-h", "run"], [], ["runx"]):
        assert recognize(argv, {}) == (False, None), argv


# --- the same messages and exit codes, whichever entry handles the run -------------------------

FAST = [sys.executable, "-m", "provision"]
TYPER_ONLY = [sys.executable, "-c", "from provision.cli.app import main; main()"]


def _both(*argv: str) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    env = {k: v for k, v in os.environ.items() if k != "LOCKCTL_CONFIG"}
    done = [
        subprocess.run(
            [*entry, *argv], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env
        )
        for entry in (FAST, TYPER_ONLY)
    ]
    return done[0], done[1]


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
    ],
    ids=["timeout-without-wait", "bad-min-hold", "no-such-job", "metrics-folder",
         "metrics-no-parent", "metrics-not-prom"],
)  # fmt: skip
def test_bad_input_reads_the_same_from_both_entries(
    worker_config: Path, extra: list[str], message: str
) -> None:
    argv = [a.replace("{tmp}", str(worker_config.parent)) for a in extra]
    fast, typer_only = _both("run", "--config", str(worker_config), *argv, "--", "true")
    assert (fast.returncode, fast.stdout, fast.stderr) == (
        typer_only.returncode,
        typer_only.stdout,
        typer_only.stderr,
    )
    assert fast.returncode == 2
    assert message in fast.stderr and fast.stderr.count("\n") == 1
    assert "Traceback" not in fast.stderr


def test_a_missing_config_file_reads_the_same_from_both_entries(tmp_path: Path) -> None:
    fast, typer_only = _both("run", "-c", str(tmp_path / "none.json"), "-j", "j", "--", "true")
    assert (fast.returncode, fast.stderr) == (typer_only.returncode, typer_only.stderr)
    assert fast.returncode == 2 and fast.stderr.startswith("lockctl: error: ")


def test_a_config_with_problems_reads_the_same_from_both_entries(worker_config: Path) -> None:
    record = json.loads(worker_config.read_text())
    record["jobs"]["j"] = {"lock_key": "x/.lock", "ttl": "15s"}  # three timings missing
    worker_config.write_text(json.dumps(record))
    fast, typer_only = _both("run", "-c", str(worker_config), "-j", "j", "--", "true")
    assert (fast.returncode, fast.stderr) == (typer_only.returncode, typer_only.stderr)
    assert fast.returncode == 2 and fast.stderr.endswith(": 3 problems\n")


def test_a_command_that_cannot_start_reads_the_same_from_both_entries(worker_config: Path) -> None:
    argv = ("run", "-c", str(worker_config), "-j", "j", "--", "/nonexistent/program")
    fast, typer_only = _both(*argv)
    assert (fast.returncode, fast.stderr) == (typer_only.returncode, typer_only.stderr)
    assert (
        fast.stderr
        == "lockctl: error: cannot start '/nonexistent/program': not found or not executable\n"
    )


def test_run_help_and_bad_flags_are_typers(tmp_path: Path) -> None:
    fast, typer_only = _both("run", "--help")
    assert fast.returncode == 0 and fast.stdout == typer_only.stdout
    assert "--metrics-textfile" in fast.stdout
    fast, typer_only = _both("run", "--bogus")
    assert fast.returncode == 2 and (fast.stdout, fast.stderr) == (
        typer_only.stdout,
        typer_only.stderr,
    )
    assert "No such option: --bogus" in fast.stderr
