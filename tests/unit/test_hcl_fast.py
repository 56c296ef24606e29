"""The HCL fast path (spec.hcl_fast.fast_body) against python-hcl2: whatever text it reads,
python-hcl2 reads too, to the same Body (values, labels, line numbers); anything else is left to
python-hcl2, so errors keep their messages and positions."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from provision.spec.hcl import Attribute, Block, Body, HclSyntaxError, Label
from provision.spec.hcl_fast import fast_body
from provision.spec.hcl_parse import hcl2_body, parse_hcl

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted(
    [
        *(ROOT / "tests" / "golden" / "spec").glob("*.hcl"),
        *(ROOT / "policies").glob("*.hcl"),
        *(ROOT / "tests" / "golden").rglob("*.hcl"),
    ]
)


def _same_as_hcl2(text: str) -> Body | None:
    """The fast path's answer, after checking python-hcl2 agrees with it."""
    fast = fast_body(text)
    if fast is not None:
        assert hcl2_body(text) == fast, text
    return fast


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_repository_files_read_the_same(path: Path) -> None:
    text = path.read_bytes().decode("utf-8", errors="replace").removeprefix("\ufeff")
    _same_as_hcl2(text)


def test_the_plain_layout_takes_the_fast_path() -> None:
    text = (
        "# a comment\n"
        "defaults {\n"
        '  ttl = "15s" // trailing\n'
        "}\n\n"
        'worker "w-1" {}\n'
        'job "a" {\n'
        '  prefix   = "locks/a/"\n'
        '  workers  = ["w-1", # first\n    "w-2",\n  ]\n'
        "  history_limit = 007\n"
        "  flag = true\n"
        '  nested = [[1, 2], [], "x\\ty\\u00e9\\"q\\\\"]\n'
        "}\n"
        "bare label {\r\n  x = null }"
    )
    expected = Body(
        (),
        (
            Block("defaults", (), 2, Body((Attribute("ttl", "15s", 3),), ())),
            Block("worker", (Label("w-1", quoted=True),), 6, Body((), ())),
            Block(
                "job",
                (Label("a", quoted=True),),
                7,
                Body(
                    (
                        Attribute("prefix", "locks/a/", 8),
                        Attribute("workers", ("w-1", "w-2"), 9),
                        Attribute("history_limit", 7, 12),
                        Attribute("flag", True, 13),
                        Attribute("nested", ((1, 2), (), 'x\tyé"q\\'), 14),
                    ),
                    (),
                ),
            ),
            Block(
                "bare", (Label("label", quoted=False),), 16, Body((Attribute("x", None, 17),), ())
            ),
        ),
    )
    assert _same_as_hcl2(text) == expected
    assert parse_hcl(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        'a = "${var.x}"\n',  # a template
        'a = "50%"\n',
        "a = 1.5\n",
        "a = -1\n",
        "a = 1 + 2\n",
        'a = "x"\n  + "y"\n',  # python-hcl2 continues an expression on the next line
        "a = foo\n",
        "a = upper(x)\n",
        "a = <<EOT\nx\nEOT\n",
        "/* block */ a = 1\n",
        "a = 1 b = 2\n",
        'job "a"\n{\n}\n',
        "in = 1\n",
        "true = 1\n",
        'a = "line\nbreak"\n',
        "a = [1,,2]\n",
        "a = \n1\n",
        "a = { b = 1 }\n",
        "a = 1\n}\n",
        'job "a" {\n',
        "a = 1" + "0" * 101 + "\n",
        "a\f= 1\n",
    ],
)
def test_anything_else_goes_to_python_hcl2(text: str) -> None:
    assert fast_body(text) is None
    try:
        expected: Body | str = hcl2_body(text)
    except HclSyntaxError as exc:
        expected = str(exc)
    try:
        got: Body | str = parse_hcl(text)
    except HclSyntaxError as exc:
        got = str(exc)
    assert got == expected


# Pieces of HCL, plain and odd, glued at random: whatever the fast path reads must read the same.
PIECES = [
    "\n",
    "\r\n",
    " ",
    "\t",
    "# c\n",
    "// c\n",
    "/* c */",
    "=",
    " = ",
    "==",
    "{",
    "}",
    "[",
    "]",
    ",",
    '"',
    '"s"',
    '"a\\nb"',
    '"\\u00e9"',
    '"é"',
    '"$"',
    '"%{x}"',
    '"${x}"',
    "1",
    "007",
    "1.5",
    "-1",
    "true",
    "null",
    "false",
    "in",
    "x",
    "job",
    'job "a" {',
    "}\n",
    "a = ",
    '"w1", ',
    "+",
    ".",
    "?",
    ":",
    "(",
    ")",
    "<<E\nx\nE\n",
    "\\",
    "\x00",
]


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(st.sampled_from(PIECES), max_size=30))
def test_random_text_reads_the_same_or_is_left_to_python_hcl2(pieces: list[str]) -> None:
    _same_as_hcl2("".join(pieces))


def test_generated_specs_read_the_same() -> None:
    rng = random.Random(11)
    for _ in range(40):
        lines = []
        for n in range(rng.randint(1, 6)):
            workers = ", ".join(f'"w{k}"' for k in range(rng.randint(0, 4)))
            sep = rng.choice(["\n", "\r\n", "  # note\n", "\n\n"])
            trailing = rng.choice(["", ",", ",\n"]) if workers else ""
            lines.append(
                f'job "j{n}" {{{sep}  prefix = "locks/j{n}/"{sep}'
                f"  workers = [{workers}{trailing}]{sep}  history_limit = {rng.randint(1, 999)}"
                f"{sep}}}{sep}"
            )
        text = "".join(lines)
        assert _same_as_hcl2(text) is not None
