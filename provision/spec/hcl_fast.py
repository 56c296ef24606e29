"""The fast path of `parse_hcl`: a one-pass scanner for the plain layout lockctl's own files use.

python-hcl2's LALR parser builds a node per grammar level for every value: about 2 s per
1,000 jobs of a spec (a 10,000-job spec took over 20 s). Specs and policies are almost always
in one plain layout, which the scanner below reads in a single regex pass: attributes and
blocks one per line, quoted labels or bare-word labels, values that are literal strings
without `$` or `%`, whole numbers, true/false/null and tuples of those (newlines and line
comments allowed where HCL allows them). It accepts only text python-hcl2 parses to the same
tree; at anything else (block comments, heredocs, operators, floats, keywords as names, a
syntax error, ...) it gives up and the text is parsed by python-hcl2 as before, so messages
and positions do not change. tests/unit/test_hcl_fast.py holds the two to the same results.
"""

from __future__ import annotations

import re

from provision.spec.hcl import MAX_NUMBER_DIGITS, Attribute, Block, Body, Label, Value, unescape

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


def fast_body(text: str) -> Body | None:
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
                labels.append(Label(unescape(text[1:-1]), quoted=True))
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
            return unescape(text[1:-1]), at + 1
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
