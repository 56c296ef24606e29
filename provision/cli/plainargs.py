"""Reading a plain invocation without Typer, from a flag table: what `lockctl run` and `lockctl
schedule` are started with on every tick and in every replica (entry.py, schedulejob.py).

`scan_flags` accepts only what Typer would read into the same values; at the least doubt (an
unknown or repeated flag, `-h`, a missing value or one that starts with `-`, a switch given a
value) it answers None and Typer decides, so the two parsers never differ in a value."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Flag:
    """One option: its names (long first), help, and how it parses."""

    field: str  # the args field (and the Typer parameter) it sets
    names: tuple[str, ...]
    help: str
    takes_value: bool  # False: a switch, True when given
    required: bool = False
    envvar: str | None = None


def scan_flags(
    argv: Sequence[str], flags: Sequence[Flag], environ: Mapping[str, str]
) -> tuple[dict[str, object], int] | None:
    """The options' values and where they end: after `--`, or at the first word that is not an
    option (Typer's allow_interspersed_args off). Unset flags take their environment variable;
    None when a required one is still missing."""
    by_name = {name: flag for flag in flags for name in flag.names}
    values: dict[str, object] = {}
    position = 0
    while position < len(argv):
        word = argv[position]
        if word == "--":
            position += 1
            break
        if not word.startswith("-") or word == "-":
            break
        name, has_inline, inline = word.partition("=")
        flag = by_name.get(name if name.startswith("--") else word)
        if flag is None or flag.field in values:  # unknown (-h, -jX, ...) or repeated
            return None
        if not flag.takes_value:
            if has_inline:
                return None
            values[flag.field] = True
            position += 1
            continue
        if has_inline:
            value, position = inline, position + 1
        elif position + 1 < len(argv):
            value, position = argv[position + 1], position + 2
        else:
            return None
        if not value or value.startswith("-"):  # Typer's reading of these is not ours to guess
            return None
        values[flag.field] = value
    for flag in flags:
        if flag.envvar and flag.field not in values and environ.get(flag.envvar):
            values[flag.field] = environ[flag.envvar]
    if any(flag.required and flag.field not in values for flag in flags):
        return None
    return values, position
