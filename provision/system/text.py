"""Text from outside lockctl (Consul's answers, a lock holder's record) made safe to show.

Anyone with write on a job's lock key can put anything in its value, and an error body is
whatever the far end sent. Printed raw, an ESC starts a terminal escape sequence (colours,
clear-screen, a window title), a CR overwrites the line, a bidi override reverses what follows,
and 100 KB floods the screen. `printable` is the one place that makes such text harmless: every
character Python does not call printable becomes a visible escape, and the result is bounded.
Rich markup (`[red]`) is a separate matter: print such text as a `rich.text.Text`, never as a
markup string (provision/cli/output.py `cell`).
"""

from __future__ import annotations

DEFAULT_LIMIT = 200  # characters: a name, a short excerpt, one table cell
MIN_LIMIT = 24  # room for the truncation marker and a little text
NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: str, limit: int = DEFAULT_LIMIT) -> str:
    """`text` with every control or invisible character escaped, at most `limit` characters.

    Escaped: C0 and C1 controls, DEL (ESC and CR among them), Unicode format characters (the
    bidi overrides and isolates U+202A-202E and U+2066-2069, zero-width characters), line and
    paragraph separators, lone surrogates, non-ASCII spaces, private-use and unassigned code
    points: whatever `str.isprintable` refuses. They show as `\\x1b`, `\\u202e`, `\\n`. Longer
    text is cut and ends with a marker saying how many characters were left out.
    """
    limit = max(limit, MIN_LIMIT)
    if len(text) <= limit and text.isprintable():
        return text  # the common case: a plain name or message, unchanged
    pieces: list[str] = []
    length = 0
    for index, char in enumerate(text):
        piece = _escape(char)
        if length + len(piece) > limit:
            return _cut(pieces, length, len(text) - index, limit)
        pieces.append(piece)
        length += len(piece)
    return "".join(pieces)


def _escape(char: str) -> str:
    if char.isprintable():
        return char
    if char in NAMED_ESCAPES:
        return NAMED_ESCAPES[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _cut(pieces: list[str], length: int, left_out: int, limit: int) -> str:
    """Drop pieces from the end until the kept text plus the marker fits in `limit`."""
    while True:
        marker = f"...(+{left_out} chars)"
        if length + len(marker) <= limit or not pieces:
            return "".join(pieces) + marker
        length -= len(pieces.pop())
        left_out += 1
