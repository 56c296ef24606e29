"""The positioned values an HCL file is read into, and the errors of reading one.

Only literal values become Python values; anything computed (interpolation, functions,
operators, bare words) becomes `Unsupported`, which callers refuse: lockctl never evaluates or
escapes what a user wrote. `hcl_parse.parse_hcl` builds them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Unsupported:
    """A value lockctl does not evaluate; `what` names it for the error message."""

    what: str


Value = str | int | float | bool | None | tuple["Value", ...] | Unsupported


@dataclass(frozen=True)
class Attribute:
    """`name = value` on `line`."""

    name: str
    value: Value
    line: int


@dataclass(frozen=True)
class Label:
    """A block label; `quoted` is False for a bare word, `text` None when it is computed."""

    text: str | None
    quoted: bool


@dataclass(frozen=True)
class Block:
    """`type "label" { ... }` starting on `line`."""

    type: str
    labels: tuple[Label, ...]
    line: int
    body: Body


@dataclass(frozen=True)
class Body:
    """The attributes and blocks of a file or a block, in source order."""

    attributes: tuple[Attribute, ...]
    blocks: tuple[Block, ...]


MAX_NESTING = 32  # brackets and braces inside one another; a spec or a policy needs 3
MAX_NUMBER_DIGITS = 100  # a number literal longer than this is no count or size anyone means


class HclSyntaxError(Exception):
    """The text is not HCL; `line` and `column` come from the parser."""

    def __init__(self, line: int, column: int, message: str) -> None:
        super().__init__(f"{line}:{column}: {message}")
        self.line = line
        self.column = column
        self.message = message


class HclTooDeep(HclSyntaxError):
    """Brackets or braces nested deeper than `MAX_NESTING`: refused before the parser (and the
    walk below, both recursive) could exhaust Python's stack."""


_ESCAPE = re.compile(r"\\(u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|.)", re.DOTALL)
_MAX_CODE_POINT = 0x10FFFF
_SIMPLE_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\"}


def unescape(text: str) -> str:
    """Decode HCL string escapes, so a `\\n` is checked as the newline Consul would see."""
    if "\\" not in text:
        return text

    def replace(match: re.Match[str]) -> str:
        code = match.group(1)
        if code[0] in "uU" and len(code) > 1:
            point = int(code[1:], 16)
            return chr(point) if point <= _MAX_CODE_POINT else match.group(0)
        return _SIMPLE_ESCAPES.get(code, match.group(0))

    return _ESCAPE.sub(replace, text)
