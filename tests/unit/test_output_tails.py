"""The end of a job's output kept in its tick record: bounded, printable, secrets masked."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from provision.ledger.records import (
    OUTPUT_BUDGET,
    RECORD_MAX_BYTES,
    TickOutcome,
    TickRecord,
    decode,
)
from provision.runner.output import runner_secrets
from provision.system.tails import (
    MASKED,
    TailBuffer,
    encoded_size,
    mask_secrets,
    newest_lines_within,
    newest_within,
    output_tail,
    sanitise,
)

TOKEN = "0b5e1c6a-9d3f-4a7e-8c21-5f0e9a7b3d42"
TICK = datetime(2026, 12, 1, 2, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("plain line\n", "plain line\n"),
        ("a\tb\nc", "a\tb\nc"),  # newline and tab kept: the output's lines
        ("\x1b[2Jclear", "\\x1b[2Jclear"),  # a terminal escape made visible
        ("over\rwrite", "over\\rwrite"),
        ("\u202eevil", "\\u202eevil"),  # a bidi override
        ("nul\x00bell\x07", "nul\\x00bell\\x07"),
        ("caf\u00e9 \u2713", "caf\u00e9 \u2713"),  # printable non-ASCII is left alone
    ],
)
def test_sanitise_escapes_controls_but_newline_and_tab(text: str, expected: str) -> None:
    assert sanitise(text) == expected


@pytest.mark.parametrize(
    ("text", "secrets", "expected"),
    [
        (f"token={TOKEN}\n", [TOKEN], f"token={MASKED}\n"),
        (f"{TOKEN}{TOKEN}", [TOKEN], MASKED * 2),
        ("nothing secret", [TOKEN], "nothing secret"),
        ("root and short", ["root", ""], "root and short"),  # too short to be a secret
        ("the-long-secret-x", ["long-secret", "the-long-secret-x"], MASKED),  # longest first
    ],
)
def test_mask_secrets(text: str, secrets: list[str], expected: str) -> None:
    assert mask_secrets(text, secrets) == expected


@pytest.mark.parametrize(
    ("writes", "size", "kept", "cut"),
    [
        ([b"abc"], 8, b"abc", False),
        ([b"abcdef", b"ghij"], 8, b"cdefghij", True),
        ([b"x" * 20], 8, b"x" * 8, True),
        ([], 8, b"", False),
    ],
)
def test_tail_buffer_keeps_the_last_bytes(
    writes: list[bytes], size: int, kept: bytes, cut: bool
) -> None:
    buffer = TailBuffer(size)
    for chunk in writes:
        buffer.write(chunk)
    assert buffer.snapshot() == (kept, cut)


@pytest.mark.parametrize(
    ("raw", "cut", "expected"),
    [
        (f"id {TOKEN} done\n".encode(), False, f"id {MASKED} done\n"),
        (b"bad \xff\xfe utf-8", False, "bad \ufffd\ufffd utf-8"),
        (b"\x1b]0;title\x07ok", False, "\\x1b]0;title\\x07ok"),
        # The front of a cut stream: the end of a secret straddling the cut is dropped with as
        # many bytes as the longest secret, so its visible part never shows.
        (TOKEN[10:].encode() + b"|" + b"y" * 40 + b"\n", True, "y" * 31 + "\n"),
        (b"\x80\x81" + b"z" * 40, True, "z" * 40),  # no secret: only a cut character dropped
    ],
)
def test_output_tail(raw: bytes, cut: bool, expected: str) -> None:
    secrets = [TOKEN] if b"z" not in raw else []
    assert output_tail(raw, cut, secrets) == expected


@pytest.mark.parametrize(
    ("text", "budget", "expected"),
    [
        ("hello", 7, "hello"),  # 5 characters and the quotes
        ("hello", 6, "ello"),
        ("a\nb\nc", 6, "b\nc"),  # a newline costs 2 bytes in JSON
        ("\u00e9\u00e9\u00e9", 6, "\u00e9\u00e9"),  # 2 bytes each in UTF-8
        ('say "x"', 6, 'x"'),  # a quote costs 2 bytes
        ("anything", 2, ""),
    ],
)
def test_newest_within_keeps_the_end_that_fits(text: str, budget: int, expected: str) -> None:
    kept = newest_within(text, budget)
    assert kept == expected
    assert encoded_size(kept) <= budget


@pytest.mark.parametrize(
    ("text", "budget", "expected"),
    [
        ("one\ntwo\nthree\n", 100, "one\ntwo\nthree\n"),  # all of it fits
        ("one\ntwo\nthree\n", 13, "three\n"),  # `wo\nthree\n` cut a line: from the next one
        ("one\ntwo\nthree\n", 15, "two\nthree\n"),  # cut at a line break: kept as it is
        ("a long line with no break", 10, "no break"),  # one line: its end, nothing dropped
        ("x\n", 2, ""),
    ],
)
def test_newest_lines_within_starts_at_a_line(text: str, budget: int, expected: str) -> None:
    assert newest_lines_within(text, budget) == expected


@given(st.text(max_size=3000), st.integers(min_value=2, max_value=2000))
def test_newest_within_is_a_bounded_suffix(text: str, budget: int) -> None:
    kept = newest_within(text, budget)
    assert text.endswith(kept)
    assert encoded_size(kept) <= budget


def _record(**fields: object) -> TickRecord:
    base = TickRecord(TICK, TickOutcome.FAILED, worker="w" * 64, host="h" * 64, exit_status=3)
    return TickRecord(**{**base.__dict__, **fields})


@given(st.text(max_size=6000), st.text(max_size=6000))
def test_a_record_with_any_output_stays_under_the_cap(stdout: str, stderr: str) -> None:
    value = _record(stdout=sanitise(stdout), stderr=sanitise(stderr)).encode()
    assert len(value) <= RECORD_MAX_BYTES
    back = decode(TICK, value)
    assert back.outcome is TickOutcome.FAILED
    for sent, got in ((stdout, back.stdout), (stderr, back.stderr)):
        assert sanitise(sent).endswith(got or "")


def test_a_short_output_is_kept_whole_and_a_long_one_its_newest_part() -> None:
    long = "".join(f"line {n}\n" for n in range(2000))
    back = decode(TICK, _record(stdout="short\n", stderr=long).encode())
    assert back.stdout == "short\n"
    assert back.stderr is not None and long.endswith(back.stderr)
    assert back.stderr.endswith("line 1999\n")
    assert encoded_size(back.stderr) <= OUTPUT_BUDGET


@pytest.mark.parametrize(
    "stored",
    [
        "\x1b[2Jforged\rline",  # a writer with access to the prefix stores raw controls
        "x" * 100_000,  # or more than any runner writes
    ],
)
def test_a_stored_output_is_decoded_printable_and_bounded(stored: str) -> None:
    value = json.dumps({"format": 1, "outcome": "failed", "stdout": stored[:3000]}).encode()
    back = decode(TICK, value)
    assert back.stdout is not None
    assert "\x1b" not in back.stdout and "\r" not in back.stdout
    assert encoded_size(back.stdout) <= OUTPUT_BUDGET


def test_no_output_no_fields() -> None:
    value = _record().encode()
    assert b"stdout" not in value and b"stderr" not in value
    assert decode(TICK, value).stdout is None


def test_runner_secrets_are_the_token_and_the_key_lines(tmp_path: Path) -> None:
    key = tmp_path / "client.key"
    key.write_text("-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIBase64LineOfTheKey\n-----END-----\n")
    found = runner_secrets(TOKEN, {"CONSUL_HTTP_TOKEN": " other-token-value "}, key)
    assert found == [TOKEN, "other-token-value", "MHcCAQEEIBase64LineOfTheKey"]
    assert runner_secrets(None, {}, None) == []
