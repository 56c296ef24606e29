"""A small, positioned view of an HCL2 file, built on python-hcl2's lark tree.

`hcl2.loads` keeps the quotes on strings and drops line numbers; every error lockctl reports needs
FILE:LINE, so this module walks `hcl2.parses_to_tree` itself. Only literal values become Python
values; anything computed (interpolation, functions, operators, bare words) becomes `Unsupported`,
which callers refuse: lockctl never evaluates or escapes what a user wrote.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import hcl2
from lark import Token, Tree
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedInput, UnexpectedToken


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


def parse_hcl(text: str) -> Body:
    """Parse `text` into a `Body`, or raise `HclSyntaxError` with the parser's position.

    Text in the plain layout lockctl's own files use (see `_fast_body`) is read by a small
    scanner that gives the same `Body`; anything else, errors included, goes to python-hcl2.
    """
    _check_nesting(text)
    fast = _fast_body(text)
    return fast if fast is not None else hcl2_body(text)


def hcl2_body(text: str) -> Body:
    """`parse_hcl` by python-hcl2 alone, without the fast path (which tests compare it with)."""
    try:
        tree = hcl2.parses_to_tree(text)
        return _body(tree.children[0])
    except LarkError as exc:
        raise _syntax_error(exc, text) from None
    except RecursionError:  # the limit above should make this unreachable; never a traceback
        raise HclTooDeep(1, 1, _too_deep()) from None


def _too_deep() -> str:
    return f"nested more than {MAX_NESTING} deep (brackets and braces inside one another)"


# One lexical unit the nesting scan must see whole: a quoted string (escapes included), a
# comment, a heredoc, or one bracket. Brackets inside strings, comments and heredocs don't count.
_SCAN = re.compile(
    r'"(?:[^"\\\n]|\\.)*"?'
    r"|#[^\n]*|//[^\n]*|/\*.*?(?:\*/|\Z)"
    r"|<<-?(?P<tag>[A-Za-z_][A-Za-z0-9_-]*)\n.*?(?:^[ \t]*(?P=tag)[ \t]*$|\Z)"
    r"|[\[{(]|[\]})]",
    re.DOTALL | re.MULTILINE,
)
_OPENING = frozenset("[{(")
_CLOSING = frozenset("]})")


def _check_nesting(text: str) -> None:
    """Raise `HclTooDeep` at the first bracket that opens level MAX_NESTING + 1.

    A linear scan that needs no parser, so its cost is bounded by the file's size (itself
    bounded by the readers) whatever the text holds.
    """
    depth = 0
    for match in _SCAN.finditer(text):
        unit = match.group()
        if unit in _OPENING:
            depth += 1
            if depth > MAX_NESTING:
                line = text.count("\n", 0, match.start()) + 1
                column = match.start() - text.rfind("\n", 0, match.start())
                raise HclTooDeep(line, column, _too_deep())
        elif unit in _CLOSING:
            depth = max(depth - 1, 0)


# Readable names for the lark terminals a user is likely to be told were expected.
_TERMINALS = {
    "LBRACE": "'{'",
    "RBRACE": "'}'",
    "LSQB": "'['",
    "RSQB": "']'",
    "DBLQUOTE": "'\"'",
    "EQ": "'='",
    "COMMA": "','",
    "NAME": "a name",
    "NL_OR_COMMENT": "a new line",
    "$END": "end of file",
}


def _syntax_error(exc: LarkError, text: str) -> HclSyntaxError:
    """Turn a lark exception into one line: where, what was found, what was expected."""
    last_line = max(1, len(text.splitlines()))
    if not isinstance(exc, UnexpectedInput):
        return HclSyntaxError(1, 1, f"cannot parse: {exc}".splitlines()[0])
    line = min(max(exc.line, 1), last_line) if exc.line > 0 else last_line
    column = max(exc.column, 1)
    if isinstance(exc, UnexpectedToken):
        found = _describe_token(exc.token)
        return HclSyntaxError(line, column, f"unexpected {found}{_expected(exc.expected)}")
    if isinstance(exc, UnexpectedCharacters):
        return HclSyntaxError(line, column, f"unexpected character {exc.char!r}")
    return HclSyntaxError(line, column, "unexpected end of file")


def _describe_token(token: Token) -> str:
    if token.type == "$END":
        return "end of file"
    lines = str(token).strip().splitlines() or [str(token)]
    return repr(lines[0][:20])


def _expected(expected: set[str]) -> str:
    names = sorted(_TERMINALS.get(name, "") for name in expected)
    if not names or len(names) > 3 or "" in names:
        return ""
    return f" (expected {' or '.join(names)})"


def _body(tree: Tree[Any]) -> Body:
    attributes: list[Attribute] = []
    blocks: list[Block] = []
    for child in _trees(tree):
        if child.data == "attribute":
            attributes.append(_attribute(child))
        elif child.data == "block":
            blocks.append(_block(child))
    return Body(tuple(attributes), tuple(blocks))


def _trees(tree: Tree[Any]) -> list[Tree[Any]]:
    return [child for child in tree.children if isinstance(child, Tree)]


def _attribute(tree: Tree[Any]) -> Attribute:
    name_tree, _eq, expression = tree.children
    return Attribute(_word(name_tree), _value(expression), tree.meta.line)


def _block(tree: Tree[Any]) -> Block:
    parts = _trees(tree)
    body = parts[-1]
    words = [part for part in parts[:-1] if part.data != "new_line_or_comment"]
    labels = tuple(_label(part) for part in words[1:])
    return Block(_word(words[0]), labels, tree.meta.line, _body(body))


def _word(tree: Tree[Any]) -> str:
    """The text of an identifier, keyword or literal used as a name."""
    return "".join(str(token) for token in tree.scan_values(lambda v: isinstance(v, Token)))


def _label(tree: Tree[Any]) -> Label:
    if tree.data == "string":
        text = _string(tree)
        return Label(text if isinstance(text, str) else None, quoted=True)
    return Label(_word(tree), quoted=False)


def _value(tree: Tree[Any] | Token) -> Value:
    if not isinstance(tree, Tree) or tree.data != "expr_term":
        return Unsupported("an expression")
    inner = _trees(tree)
    if len(inner) != 1 or len(tree.children) != 1:
        return Unsupported("an expression")
    return _term(inner[0])


def _term(tree: Tree[Any]) -> Value:
    kind = tree.data
    if kind == "string":
        return _string(tree)
    if kind in ("int_lit", "float_lit"):
        text = str(tree.children[0])
        if len(text) > MAX_NUMBER_DIGITS:  # int() refuses past 4300 digits with a ValueError
            return Unsupported(f"a number of over {MAX_NUMBER_DIGITS} digits")
        return int(text) if kind == "int_lit" else float(text)
    if kind == "literal_value":
        return {"true": True, "false": False, "null": None}[str(tree.children[0])]
    if kind == "tuple":
        items = [_value(child) for child in _trees(tree) if child.data != "new_line_or_comment"]
        return tuple(items)
    return Unsupported(_UNSUPPORTED.get(str(kind), "an expression"))


_UNSUPPORTED = {
    "identifier": "a bare word (quote it)",
    "object": "an object",
    "heredoc_template": "a heredoc",
    "heredoc_template_trim": "a heredoc",
    "function_call": "a function call",
    "template_string": "a template string",
}


def _string(tree: Tree[Any]) -> str | Unsupported:
    """The literal text of a quoted string, escapes decoded; templates are unsupported."""
    pieces: list[str] = []
    for part in _trees(tree):
        (child,) = part.children
        if not isinstance(child, Token):
            return Unsupported("a string with ${...} or %{...} in it")
        if child.type in ("ESCAPED_INTERPOLATION", "ESCAPED_DIRECTIVE"):
            pieces.append(str(child)[1:])
        else:
            pieces.append(_unescape(str(child)))
    return "".join(pieces)


_ESCAPE = re.compile(r"\\(u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|.)", re.DOTALL)
_MAX_CODE_POINT = 0x10FFFF
_SIMPLE_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\"}


def _unescape(text: str) -> str:
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


# --- the fast path --------------------------------------------------------------------------
#
# python-hcl2's LALR parser builds a node per grammar level for every value: about 2 s per
# 1,000 jobs of a spec (a 10,000-job spec took over 20 s). Specs and policies are almost always
# in one plain layout, which the scanner below reads in a single regex pass: attributes and
# blocks one per line, quoted labels or bare-word labels, values that are literal strings
# without `$` or `%`, whole numbers, true/false/null and tuples of those (newlines and line
# comments allowed where HCL allows them). It accepts only text python-hcl2 parses to the same
# tree; at anything else (block comments, heredocs, operators, floats, keywords as names, a
# syntax error, ...) it gives up and the text is parsed by python-hcl2 as before, so messages
# and positions do not change. tests/unit/test_hcl_fast.py holds the two to the same results.

_FAST_TOKEN = re.compile(
    r"(?P<ws>[ \t\r]+)"
    r"|(?P<nl>\n|#[^\n]*\n|//[^\n]*\n)"
    # A tuple of plain strings on one line (a job's workers): one token, not one per string.
    r'|(?P<strs>\[[ \t]*"[^"\\\n$%]*"(?:[ \t]*,[ \t]*"[^"\\\n$%]*")*[ \t]*,?[ \t]*\])'
    r'|(?P<str>"(?:[^"\\\n$%]|\\[^\n])*")'
    r"|(?P<int>[0-9]+)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_-]*)"
    r"|(?P<p>[=\[\]{},])"
    r"|(?P<other>.)",
    re.DOTALL,
)
# Words the grammar lexes as keywords or literals, never as a plain name.
_KEYWORDS = frozenset(("if", "in", "for", "for_each", "else", "endif", "endfor"))
_LITERALS = {"true": True, "false": False, "null": None}
_NL, _STR, _STRS, _INT, _NAME, _END = "nl", "str", "strs", "int", "name", "end"
_PLAIN_STRING = re.compile(r'"([^"]*)"')


class _GiveUp(Exception):
    """The fast path does not read this text; python-hcl2 will."""


def _fast_tokens(text: str) -> list[tuple[str, str, int]]:
    """(kind, text, line) for each token but blanks; punctuation's kind is the character."""
    tokens: list[tuple[str, str, int]] = []
    append = tokens.append
    line = 1
    for match in _FAST_TOKEN.finditer(text + "\n"):  # as python-hcl2 does: a final newline
        kind = match.lastgroup
        if kind == "ws":
            continue
        if kind == "nl":
            append((_NL, "", line))
            line += 1
        elif kind == "p":
            value = match.group()
            append((value, value, line))
        elif kind == "other":
            raise _GiveUp
        else:
            append((str(kind), match.group(), line))
    append((_END, "", line))
    return tokens


def _fast_body(text: str) -> Body | None:
    """The file's `Body` when the scanner reads all of it, else None."""
    if "/*" in text:  # block comments stand for newlines anywhere: left to python-hcl2
        return None
    try:
        tokens = _fast_tokens(text)
        body, at = _FastReader(tokens).body(0, top=True)
    except (_GiveUp, IndexError, RecursionError):  # deep nesting: python-hcl2 reports it
        return None
    return body if tokens[at][0] == _END else None


class _FastReader:
    def __init__(self, tokens: list[tuple[str, str, int]]) -> None:
        self.tokens = tokens

    def _skip_newlines(self, at: int) -> int:
        tokens = self.tokens
        while tokens[at][0] == _NL:
            at += 1
        return at

    def body(self, at: int, *, top: bool) -> tuple[Body, int]:
        """Items up to the end (top) or the closing brace (not consumed)."""
        tokens = self.tokens
        closing = _END if top else "}"
        attributes: list[Attribute] = []
        blocks: list[Block] = []
        at = self._skip_newlines(at)
        while tokens[at][0] != closing:
            kind, word, line = tokens[at]
            if kind != _NAME or word in _KEYWORDS or word in _LITERALS:
                raise _GiveUp
            at += 1
            if tokens[at][0] == "=":
                value, at = self.value(at + 1)
                attributes.append(Attribute(word, value, line))
            else:
                block, at = self.block(word, line, at)
                blocks.append(block)
            # One item per line: a newline, or the end of the body, must follow.
            if tokens[at][0] == _NL:
                at = self._skip_newlines(at)
            elif tokens[at][0] != closing:
                raise _GiveUp
        return Body(tuple(attributes), tuple(blocks)), at

    def block(self, kind: str, line: int, at: int) -> tuple[Block, int]:
        tokens = self.tokens
        labels: list[Label] = []
        while tokens[at][0] != "{":
            label_kind, text, _ = tokens[at]
            if label_kind == _STR:
                labels.append(Label(_unescape(text[1:-1]), quoted=True))
            elif label_kind == _NAME and text not in _KEYWORDS and text not in _LITERALS:
                labels.append(Label(text, quoted=False))
            else:
                raise _GiveUp
            at += 1
        body, at = self.body(at + 1, top=False)
        return Block(kind, tuple(labels), line, body), at + 1

    def value(self, at: int) -> tuple[Value, int]:
        kind, text, _ = self.tokens[at]
        if kind == _STR:
            return _unescape(text[1:-1]), at + 1
        if kind == _STRS:  # no escapes in them: their text is their value
            return tuple(_PLAIN_STRING.findall(text)), at + 1
        if kind == _INT:
            if len(text) > MAX_NUMBER_DIGITS:
                raise _GiveUp
            return int(text), at + 1
        if kind == _NAME and text in _LITERALS:
            return _LITERALS[text], at + 1
        if kind == "[":
            return self.tuple(at + 1)
        raise _GiveUp

    def tuple(self, at: int) -> tuple[Value, int]:
        """After '[': elements, commas between (one after the last too), newlines anywhere."""
        tokens = self.tokens
        items: list[Value] = []
        at = self._skip_newlines(at)
        while tokens[at][0] != "]":
            item, at = self.value(at)
            items.append(item)
            at = self._skip_newlines(at)
            if tokens[at][0] == ",":
                at = self._skip_newlines(at + 1)
            elif tokens[at][0] != "]":
                raise _GiveUp
        return tuple(items), at + 1
