"""`lockctl completion bash|zsh`: a completion script for every command and flag, generated
from the Typer app's commands and from `run`'s and `schedule`'s argparse parsers.

The script is static: pressing TAB runs a few shell functions and never starts Python, so
completion is instant and a skipped `lockctl run` stays free of Typer. One core function,
`_lockctl_candidates`, is written in the shell language bash and zsh share (positional words,
`case`, `[ ]`), so both shells walk the command line the same way; each shell has a thin
wrapper that turns its lines into COMPREPLY (bash) or `_describe` and `_files` (zsh).
"""

from __future__ import annotations

import argparse
import re
import shlex
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperArgument, TyperGroup, TyperOption

from provision import __version__
from provision.cli import runjob, schedulejob

# What a flag's value or a command's operands complete to, besides a list of choices.
FILES = "@files"  # file and folder names
ANY = "@any"  # free text (a job, a duration, an address): nothing to offer
PROGRAM = "@command"  # `run`: a program, then its arguments (files)
SUMMARY_WIDTH = 80  # zsh shows it beside the flag: about one screen line

# The commands served by their own argparse parser (entry.py), not by Typer's.
ARGPARSE_COMMANDS: Mapping[str, Callable[[], argparse.ArgumentParser]] = {
    "run": runjob.run_parser,
    "schedule": schedulejob.schedule_parser,
}


class Shell(str, Enum):
    """The shells `lockctl completion` writes for."""

    bash = "bash"
    zsh = "zsh"


@dataclass(frozen=True)
class Flag:
    """One flag and its other spellings (`--config`, `-c`; `--tls-skip-verify`, `--tls-verify`)."""

    names: tuple[str, ...]
    summary: str
    values: tuple[str, ...] | None  # None: takes no value; else choices, FILES or ANY


@dataclass(frozen=True)
class CommandWords:
    """A command as completion sees it: its words after `lockctl`, its flags, its subcommands
    (name, summary) and what its operands are (choices, FILES, PROGRAM; empty: nothing to
    offer)."""

    words: tuple[str, ...]
    flags: tuple[Flag, ...]
    subcommands: tuple[tuple[str, str], ...] = ()
    operands: tuple[str, ...] = ()


def completion(
    ctx: typer.Context,
    shell: Annotated[Shell, typer.Argument(help="The shell the script is for.")],
) -> None:
    """Print a bash or zsh completion script for every command and flag.

    bash: `source <(lockctl completion bash)` in ~/.bashrc, or save it as
    /etc/bash_completion.d/lockctl. zsh: `lockctl completion zsh > ~/.zfunc/_lockctl` with
    ~/.zfunc on fpath before compinit, or `source <(lockctl completion zsh)` after compinit.
    """
    commands = collect_commands(ctx, ARGPARSE_COMMANDS)
    typer.echo(render_script(shell, commands), nl=False)


def render_script(shell: Shell, commands: Iterable[CommandWords]) -> str:
    """The whole script for `shell`: the shared core, then that shell's wrapper."""
    core = _core(list(commands))
    if shell is Shell.bash:
        return BASH_HEAD.format(version=__version__) + core + BASH_WRAPPER
    return ZSH_HEAD.format(version=__version__) + core + ZSH_WRAPPER


# --- the commands, from Typer and argparse ----------------------------------------------------


def collect_commands(
    ctx: typer.Context, parsers: Mapping[str, Callable[[], argparse.ArgumentParser]]
) -> list[CommandWords]:
    """Every command reachable from the root of `ctx`, the root included, hidden ones left
    out; `parsers` serve the commands Typer only passes words to."""
    found: list[CommandWords] = []

    def walk(words: tuple[str, ...], command: Any) -> None:
        if len(words) == 1 and words[0] in parsers:
            found.append(from_argparse(words, parsers[words[0]]()))
            return
        visible = {}
        if isinstance(command, TyperGroup):
            visible = {n: c for n, c in command.commands.items() if not c.hidden}
        flags, operands = _typer_params(command, ctx)
        subcommands = tuple((name, first_line(_help_of(c))) for name, c in visible.items())
        found.append(CommandWords(words, flags, subcommands, operands))
        for name, sub in visible.items():
            walk((*words, name), sub)

    walk((), ctx.find_root().command)
    return found


def _help_of(command: Any) -> str:
    return str(command.short_help or command.help or "")


def _typer_params(command: Any, ctx: typer.Context) -> tuple[tuple[Flag, ...], tuple[str, ...]]:
    flags: list[Flag] = []
    operands: tuple[str, ...] = ()
    for param in command.get_params(ctx):
        if getattr(param, "hidden", False):
            continue
        # the first operand's values stand for all (lint's FILE..., next's JOB)
        if isinstance(param, TyperArgument) and not operands:
            operands = _typer_values(param)
        elif isinstance(param, TyperOption):
            names = (*param.opts, *param.secondary_opts)
            values = None if param.is_flag or param.count else _typer_values(param)
            flags.append(Flag(names, first_line(param.help or ""), values))
    return tuple(flags), operands


def _typer_values(param: TyperOption | TyperArgument) -> tuple[str, ...]:
    choices = param.type_descriptor.choices
    if choices is not None:
        return tuple(str(getattr(c, "value", c)) for c in choices)
    return (FILES,) if _is_path(param) else (ANY,)


def _is_path(param: TyperOption | TyperArgument) -> bool:
    described = param.type_descriptor
    inner = typing.get_args(described.annotation)  # list[Path], Path | None
    return described.is_path or described.is_file or Path in inner


def from_argparse(words: tuple[str, ...], parser: argparse.ArgumentParser) -> CommandWords:
    """A command whose flags argparse parses (`run`, `schedule`)."""
    flags: list[Flag] = []
    operands: tuple[str, ...] = ()
    for action in parser._actions:  # argparse offers no public list of its arguments
        if not action.option_strings:
            operands = (PROGRAM,) if action.nargs == argparse.REMAINDER else (FILES,)
            continue
        values: tuple[str, ...] | None = None
        if action.nargs != 0:
            values = tuple(map(str, action.choices or ())) or (
                (FILES,) if action.metavar in ("FILE", "DIR") else (ANY,)
            )
        flags.append(Flag(tuple(action.option_strings), first_line(action.help or ""), values))
    return CommandWords(words, tuple(flags), (), operands)


def first_line(help_text: str) -> str:
    """A help text's first sentence, on one line, as short as a completion menu needs."""
    text = " ".join(help_text.split("\n\n")[0].split()).replace("\\[", "[")
    sentence = re.split(r"(?<=[a-z)][.])\s", text, maxsplit=1)[0].rstrip(".")
    if len(sentence) <= SUMMARY_WIDTH:
        return sentence
    return sentence[: SUMMARY_WIDTH - 3].rsplit(" ", 1)[0] + "..."


# --- the script ---------------------------------------------------------------------------------


def _core(commands: list[CommandWords]) -> str:
    subcommands, flags, values, operands = [], [], [], []
    for command in commands:
        key = shlex.quote(" ".join(command.words))
        if command.subcommands:
            lines = [f"{name}:{summary}" for name, summary in command.subcommands]
            subcommands.append(_case_arm(key, _printf(lines)))
        flag_lines = [f"{name}:{flag.summary}" for flag in command.flags for name in flag.names]
        flags.append(_case_arm(key, _printf(flag_lines)))
        for flag in command.flags:
            if flag.values is not None:
                names = "|".join(shlex.quote(" ".join((*command.words, n))) for n in flag.names)
                values.append(_case_arm(names, _printf([_value_line(v) for v in flag.values])))
        if command.operands:
            lines = [_value_line(v) for v in command.operands]
            operands.append(_case_arm(key, _printf(lines)))
    return CORE.format(
        subcommands="\n".join(subcommands),
        flags="\n".join(flags),
        values="\n".join(values),
        operands="\n".join(operands),
    )


def _value_line(value: str) -> str:
    return value if value in (FILES, ANY, PROGRAM) else f"{value}:"  # a choice: no summary


def _case_arm(pattern: str, body: str) -> str:
    return f"    {pattern}) {body} ;;"


def _printf(lines: list[str]) -> str:
    return "printf '%s\\n' " + " ".join(shlex.quote(line) for line in lines)


# The shared core. Lines are `word:summary` (`_describe`'s format; bash keeps the word) or one
# of the markers FILES, ANY, PROGRAM. Variable names avoid zsh's special ones (path, status,
# words): a `local path` would empty zsh's command search path.
CORE = r"""
_lockctl_subcommands() {{  # $1: a command's words; its subcommands. Status 1: it has none
  case "$1" in
{subcommands}
    *) return 1 ;;
  esac
}}

_lockctl_flags() {{  # $1: a command's words; its flags. Status 1: not a command
  case "$1" in
{flags}
    *) return 1 ;;
  esac
}}

_lockctl_values() {{  # $1: a command's words and a flag; what its value may be. Status 1: no value
  case "$1" in
{values}
    *) return 1 ;;
  esac
}}

_lockctl_operands() {{  # $1: a command's words; what its operands are, if anything to offer
  case "$1" in
{operands}
    *) return 0 ;;
  esac
}}

_lockctl_candidates() {{
  # $1: the word being completed; the rest: the words between `lockctl` and it.
  local cur="$1" at='' word='' deeper='' expect='' ended='' operands=0 kind=''
  shift
  for word in "$@"; do
    deeper="${{at:+$at }}$word"  # the command these words name, if they name one
    if [ -n "$expect" ]; then
      expect=''
    elif [ -z "$ended" ] && [ "$word" = -- ]; then
      ended=1
    elif [ -z "$ended" ] && [ "${{word#-}}" != "$word" ]; then
      case "$word" in
        *=*) ;;
        *) _lockctl_values "$deeper" >/dev/null && expect="$word" ;;
      esac
    elif [ -z "$ended" ] && [ "$operands" -eq 0 ] && _lockctl_flags "$deeper" >/dev/null; then
      at="$deeper"
    else
      operands=$((operands + 1))
      # run's first operand starts the job's command: every word after it is the command's
      [ "$(_lockctl_operands "$at")" = @command ] && ended=1
    fi
  done
  if [ -n "$expect" ]; then
    _lockctl_values "${{at:+$at }}$expect"
    return 0
  fi
  kind="$(_lockctl_operands "$at")"
  if [ "$kind" = @command ] && [ -n "$ended" ]; then
    if [ "$operands" -eq 0 ]; then echo @command; else echo @files; fi
    return 0
  fi
  case "$cur" in
    -*) [ -z "$ended" ] && _lockctl_flags "$at"; return 0 ;;
  esac
  if [ -z "$ended" ] && [ "$operands" -eq 0 ] && _lockctl_subcommands "$at"; then
    return 0
  fi
  if [ "$kind" = @command ]; then
    if [ -n "$cur" ]; then echo @command; else _lockctl_flags "$at"; fi
  elif [ -n "$kind" ]; then
    printf '%s\n' "$kind"
  fi
  return 0
}}
"""

BASH_HEAD = """\
# bash completion for lockctl {version}, written by `lockctl completion bash`.
# Load it with `source <(lockctl completion bash)` (e.g. in ~/.bashrc), or save it as
# /etc/bash_completion.d/lockctl (bash-completion loads it on the first TAB after `lockctl`).
"""

BASH_WRAPPER = r"""
_lockctl() {
  local cur="${COMP_WORDS[COMP_CWORD]}" line i
  local -a before=() names=()
  # `--flag=value`: bash splits at `=`; the value is completed as the flag's
  for ((i = 1; i < COMP_CWORD; i++)); do
    [[ ${COMP_WORDS[i]} == = ]] || before+=("${COMP_WORDS[i]}")
  done
  [[ $cur == = ]] && cur=''
  COMPREPLY=()
  while IFS= read -r line; do
    case $line in
      @files)
        compopt -o filenames 2>/dev/null
        mapfile -t -O "${#COMPREPLY[@]}" COMPREPLY < <(compgen -f -- "$cur") ;;
      @command)
        mapfile -t -O "${#COMPREPLY[@]}" COMPREPLY < <(compgen -c -- "$cur") ;;
      @any | '') ;;
      *) names+=("${line%%:*}") ;;
    esac
  done < <(_lockctl_candidates "$cur" "${before[@]}")
  if ((${#names[@]})); then
    mapfile -t -O "${#COMPREPLY[@]}" COMPREPLY < <(compgen -W "${names[*]}" -- "$cur")
  fi
  return 0
}
complete -F _lockctl lockctl
"""

ZSH_HEAD = """\
#compdef lockctl
# zsh completion for lockctl {version}, written by `lockctl completion zsh`.
# Save it as _lockctl in a folder on $fpath (before compinit runs), or load it with
# `source <(lockctl completion zsh)` after compinit.
"""

ZSH_WRAPPER = r"""
_lockctl() {
  local cur="${words[CURRENT]}" line ret=1
  local -a before described
  before=("${(@)words[2,CURRENT-1]}")
  if [[ $cur == -*=* ]]; then  # `--flag=value`: complete the value as the flag's
    before+=("${cur%%=*}")
    compset -P '*='
    cur="${cur#*=}"
  fi
  for line in "${(@f)$(_lockctl_candidates "$cur" "${before[@]}")}"; do
    case $line in
      @files) _files && ret=0 ;;
      @command) _command_names -e && ret=0 ;;
      @any | '') ;;
      *) described+=("$line") ;;
    esac
  done
  if (( ${#described} )); then
    _describe -t lockctl lockctl described && ret=0
  fi
  return ret
}

# Autoloaded from $fpath this file is _lockctl's body: define, then complete; sourced: register.
if [ "${funcstack[1]}" = _lockctl ]; then
  _lockctl "$@"
else
  compdef _lockctl lockctl
fi
"""
