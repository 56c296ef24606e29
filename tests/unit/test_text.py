"""printable(): text from Consul never reaches a terminal raw, and never unbounded."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from provision.system.text import MIN_LIMIT, printable

HOSTILE = (
    "worker-1\x1b[2J\x1b[H"  # clear screen, cursor home
    "\x1b]0;pwned\x07"  # OSC: the window title
    "[bold red]red[/]"  # Rich markup: printable, left as it is (Text shows it literally)
    "\rforged"  # CR: overwrite the line
    "\u202eevil\u202c"  # bidi override and pop
    "\u2066iso\u2069"  # bidi isolate
    "\x9b31m"  # C1 CSI
    "\x7f\x00\ud800\u2028"  # DEL, NUL, a lone surrogate, a line separator
)


def _raw_controls(text: str) -> list[str]:
    return [c for c in text if unicodedata.category(c) in {"Cc", "Cf", "Cs", "Zl", "Zp"}]


def test_plain_text_is_unchanged() -> None:
    assert printable("worker-1") == "worker-1"
    assert printable("held by [red]x[/] — ünïcode ok") == "held by [red]x[/] — ünïcode ok"


def test_every_control_character_becomes_a_visible_escape() -> None:
    shown = printable(HOSTILE, 1000)
    assert _raw_controls(shown) == []
    assert shown == (
        "worker-1\\x1b[2J\\x1b[H\\x1b]0;pwned\\x07[bold red]red[/]\\rforged"
        "\\u202eevil\\u202c\\u2066iso\\u2069\\x9b31m\\x7f\\x00\\ud800\\u2028"
    )
    assert shown.encode("utf-8")  # a lone surrogate would not even encode raw


@pytest.mark.parametrize(
    ("char", "escape"),
    [
        ("\x1b", "\\x1b"),
        ("\r", "\\r"),
        ("\n", "\\n"),
        ("\t", "\\t"),
        ("\x7f", "\\x7f"),
        ("\x85", "\\x85"),
        ("\u00a0", "\\xa0"),  # a space that is not one: a look-alike
        ("\u200b", "\\u200b"),
        ("\u061c", "\\u061c"),
        ("\U000e0001", "\\U000e0001"),
    ]
    + [(chr(c), f"\\u{c:04x}") for c in [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]],
)
def test_each_unsafe_character(char: str, escape: str) -> None:
    assert printable(f"a{char}b") == f"a{escape}b"


def test_long_text_is_cut_with_a_marker_within_the_limit() -> None:
    shown = printable("x" * 100_000, 80)
    assert len(shown) <= 80
    assert shown.startswith("x" * 50)
    assert shown.endswith(f"...(+{100_000 - shown.index('.')} chars)")


def test_escapes_count_toward_the_limit() -> None:
    shown = printable("\x1b" * 1000, 60)
    assert len(shown) <= 60 and _raw_controls(shown) == []
    assert shown.startswith("\\x1b\\x1b") and "(+" in shown


def test_a_tiny_limit_still_says_what_was_cut() -> None:
    assert len(printable("y" * 500, 1)) <= MIN_LIMIT


@given(st.text(), st.integers(min_value=0, max_value=300))
def test_never_a_raw_control_and_always_bounded(text: str, limit: int) -> None:
    shown = printable(text, limit)
    assert _raw_controls(shown) == []
    assert len(shown) <= max(limit, MIN_LIMIT)
    if len(text) <= limit and text.isprintable():
        assert shown == text
