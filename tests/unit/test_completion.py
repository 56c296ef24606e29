"""`lockctl completion bash|zsh`: the scripts complete every command and flag in a real shell.

bash: the script is sourced in `bash --norc --noprofile`, COMP_WORDS and COMP_CWORD are set as
bash sets them on TAB, `_lockctl` is called, and COMPREPLY is read back. zsh (when installed):
the script's syntax, its registration with compinit both ways (sourced, and autoloaded from
$fpath), and the shared core walking the same command lines under completion's options.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import typer
from typer.core import TyperGroup, TyperOption

from provision.cli import app, runjob, schedulejob

TIMEOUT = 60


def _script(shell: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "provision", "completion", shell],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=True,
    )
    assert done.stderr == ""
    return done.stdout


@pytest.fixture(scope="module")
def bash_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("completion") / "lockctl.bash"
    path.write_text(_script("bash"))
    return path


def _bash_complete(
    script: Path, lines: Sequence[Sequence[str]], cwd: Path | None = None
) -> list[list[str]]:
    """COMPREPLY for each command line (its words, the last one being completed), from one bash
    process."""
    driver = [f"source {shlex.quote(str(script))}"]
    for number, words in enumerate(lines):
        quoted = " ".join(shlex.quote(word) for word in ["lockctl", *words])
        driver += [
            f"COMP_WORDS=({quoted}); COMP_CWORD={len(words)}; COMPREPLY=(); _lockctl",
            f"printf 'Q{number}\\t%s\\n' \"${{COMPREPLY[@]}}\"",
        ]
    done = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", "\n".join(driver)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    replies: list[list[str]] = [[] for _ in lines]
    for line in done.stdout.splitlines():
        tag, _, item = line.partition("\t")
        if item:
            replies[int(tag.removeprefix("Q"))].append(item)
    return replies


def _typer_commands() -> dict[tuple[str, ...], set[str]]:
    """Every visible command of the Typer app (its words after `lockctl`) and its flags, as
    Typer parses them; `run` and `schedule` with their argparse parsers' flags."""
    root = typer.main.get_command(app)
    found: dict[tuple[str, ...], set[str]] = {}

    def walk(words: tuple[str, ...], command: typer.core.TyperCommand | TyperGroup) -> None:
        flags = {"-h", "--help"}
        for param in command.params:
            if isinstance(param, TyperOption) and not param.hidden:
                flags |= {*param.opts, *param.secondary_opts}
        found[words] = flags
        if isinstance(command, TyperGroup):
            for name, sub in command.commands.items():
                if not sub.hidden:
                    walk((*words, name), sub)  # type: ignore[arg-type]

    walk((), root)
    for name, parser in (("run", runjob.run_parser()), ("schedule", schedulejob.schedule_parser())):
        found[(name,)] = {flag for action in parser._actions for flag in action.option_strings}
    return found


def test_every_command_and_every_flag_completes_in_bash(bash_script: Path) -> None:
    registered = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", f"source {bash_script}; complete -p lockctl"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=True,
    )
    assert registered.stdout.strip() == "complete -F _lockctl lockctl"
    commands = _typer_commands()
    assert {("run",), ("schedule",), ("completion",), ("cluster", "up")} <= set(commands)
    lines = [[*words, "-"] for words in commands]
    for words, reply in zip(commands, _bash_complete(bash_script, lines), strict=True):
        assert set(reply) == commands[words], words
    (top,) = _bash_complete(bash_script, [[""]])
    assert set(top) == {words[0] for words in commands if len(words) == 1}


def test_run_and_schedule_flags_and_values(bash_script: Path, tmp_path: Path) -> None:
    (tmp_path / "lockctl.json").write_text("{}")
    replies = _bash_complete(
        bash_script,
        [
            ["run", "--"],
            ["run", "--job", "nightly", "--c"],
            ["run", "--config", "lock"],
            ["run", "--config", "=", "lock"],  # `--config=lock`: bash splits at `=`
            ["-v", "run", "--w"],
            ["run", "--job", "nightly", "--wait", "--", "ech"],
            ["run", "--job", "nightly", "--", "echo", "--c"],
            ["schedule", "--"],
            ["schedule", "--listen", ""],
            ["cluster", ""],
            ["cluster", "up", "--s"],
            ["completion", ""],
            ["next", "nightly", "--c"],
            ["plan", "--tls-"],
            ["c"],
        ],
        cwd=tmp_path,
    )
    run_flags = {
        "--config",
        "--job",
        "--wait",
        "--timeout",
        "--min-hold",
        "--allow-unsafe",
        "--key",
    }
    assert run_flags | {"--metrics-textfile", "--help"} == set(replies[0])
    assert replies[1] == ["--config"]
    assert replies[2] == ["lockctl.json"] == replies[3]
    assert replies[4] == ["--wait"]
    assert "echo" in replies[5]
    assert replies[6] == []  # the job's own arguments: no lockctl flag, no such file here
    schedule_flags = {"--config", "--allow-unsafe", "--listen", "--max-concurrent-runs", "--help"}
    assert set(replies[7]) == schedule_flags
    assert replies[8] == []  # HOST:PORT: nothing to offer
    assert set(replies[9]) == {"up", "down", "status", "env"}
    assert set(replies[10]) == {"--state-dir", "--subnet", "--servers"}
    assert set(replies[11]) == {"bash", "zsh"}
    assert replies[12] == ["--count"]
    assert set(replies[13]) == {"--tls-skip-verify", "--tls-verify"}
    assert set(replies[14]) == {"cluster", "check", "completion"}


# The options zsh's completion system runs its functions with (_comp_options in
# Completion/compinit), the ones that change how plain shell code behaves.
ZSH_COMPLETION_OPTIONS = "setopt extendedglob nullglob rcexpandparam unset; unsetopt shwordsplit"


@pytest.fixture(scope="module")
def zsh_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # scripts/install-test-packages installs zsh: without it this is a set-up fault, not a skip
    assert shutil.which("zsh") is not None, "zsh is not installed (make test-packages)"
    folder = tmp_path_factory.mktemp("zfunc")
    path = folder / "_lockctl"
    path.write_text(_script("zsh"))
    return path


def _zsh(command: str, cwd: Path | None = None) -> str:
    done = subprocess.run(
        ["zsh", "-f", "-c", command],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return done.stdout


def test_zsh_registers_the_completion_sourced_and_from_fpath(
    zsh_script: Path, tmp_path: Path
) -> None:
    assert subprocess.run(["zsh", "-n", str(zsh_script)], timeout=TIMEOUT).returncode == 0
    compinit = f"autoload -Uz compinit; compinit -u -d {shlex.quote(str(tmp_path / 'dump'))}"
    sourced = _zsh(f"{compinit}; source {shlex.quote(str(zsh_script))}; print -r $_comps[lockctl]")
    assert sourced.strip() == "_lockctl"
    fpath = f"fpath=({shlex.quote(str(zsh_script.parent))} $fpath)"
    autoloaded = _zsh(f"{fpath}; {compinit}2; print -r $_comps[lockctl]")
    assert autoloaded.strip() == "_lockctl"


def test_zsh_walks_command_lines_as_bash_does(zsh_script: Path) -> None:
    queries = [
        ["--c", "run", "--job", "nightly"],
        ["", "cluster"],
        ["", "run", "--config"],
        ["", "run", "--job", "nightly", "--"],
        ["", "run", "--job", "nightly", "--", "echo"],
        ["--s", "cluster", "up"],
        ["", "completion"],
    ]
    calls = [
        f"_lockctl_candidates {' '.join(shlex.quote(w) for w in q)}; print -r -- '%%'"
        for q in queries
    ]
    quoted = shlex.quote(str(zsh_script))
    out = _zsh(f"compdef() {{ :; }}; {ZSH_COMPLETION_OPTIONS}; source {quoted}; {'; '.join(calls)}")
    answers = [block.split("\n") for block in out.split("%%\n")[:-1]]
    words = [[line.split(":")[0] for line in answer if line] for answer in answers]
    assert {"--config", "-c"} <= set(words[0]) and "--job" in words[0]
    assert words[1] == ["up", "down", "status", "env"]
    assert words[2] == ["@files"]
    assert words[3] == ["@command"]
    assert words[4] == ["@files"]
    assert {"--state-dir", "--subnet", "--workers"} <= set(words[5])
    assert words[6] == ["bash", "zsh"]
