"""parse_hcl: an HCL2 file read into positioned values, on python-hcl2's lark tree.

`hcl2.loads` keeps the quotes on strings and drops line numbers; every error lockctl reports needs
FILE:LINE, so this module walks `hcl2.parses_to_tree` itself (plain-layout text takes the faster
scanner in `hcl_fast`, to the same result).
"""

from __future__ import annotations

import re
from typing import Any

import hcl2
from lark import Token, Tree
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from provision.spec.hcl import (
    MAX_NESTING,
    MAX_NUMBER_DIGITS,
    Attribute,
    Block,
    Body,
    HclSyntaxError,
    HclTooDeep,
    Label,
    Unsupported,
    Value,
    unescape,
)
from provision.spec.hcl_fast import fast_body


def parse_hcl(text: str) -> Body:
    """Parse `text` into a `Body`, or raise `HclSyntaxError` with the parser's position.

    Text in the plain layout lockctl's own files use (see `hcl_fast`) is read by a small
    scanner that gives the same `Body`; anything else, errors included, goes to python-hcl2.
    """
    _check_nesting(text)
    fast = fast_body(text)
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
            pieces.append(unescape(str(child)))
    return "".join(pieces)
