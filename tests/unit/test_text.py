"""printable(): text from Consul never reaches a terminal raw, and never unbounded."""

from __future__ import annotations

import base64
import json
import unicodedata
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import responses
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from provision.cli.app import app
from provision.cli.verify import _print as print_verify_report
from provision.consul import NO_RETRY, Consul, ConsulSettings
from provision.consul.errors import ConsulServerError
from provision.ledger.holder import CLAIM_LIMIT, Holder, holder_record
from provision.system.text import MIN_LIMIT, printable
from provision.verify import CheckResult, VerifyReport
from provision.verify.report import junit_xml

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


# --- where Consul's text is printed -----------------------------------------------------------


@responses.activate
def test_a_hostile_error_body_reaches_the_error_line_escaped_and_short() -> None:
    address = "http://127.0.0.1:1"
    body = "No cluster leader\x1b]0;pwned\x07\x1b[2J\r\u202e" + "z" * 100_000
    responses.get(f"{address}/v1/status/leader", status=500, body=body)
    consul = Consul(ConsulSettings(address=address), retry=NO_RETRY)
    with pytest.raises(ConsulServerError) as caught:
        consul.status.leader()
    message = str(caught.value)
    assert _raw_controls(message) == [] and len(message) < 300
    assert "No cluster leader\\x1b]0;pwned\\x07\\x1b[2J \\u202ez" in message


@pytest.mark.parametrize(
    "value",
    [
        b"[" * 100_000,
        b"\xff\xfe",
        b"not json",
        b"[1, 2]",
        b'"worker-1"',
        b'{"pid": 1' + b"0" * 5000 + b"}",
    ],
)
def test_a_holder_record_that_is_not_one_is_empty(value: bytes) -> None:
    assert holder_record(value) == {}


def test_a_holder_record_keeps_its_known_fields_printable_and_short() -> None:
    value = json.dumps(
        {"worker": "w\x1b[31m", "host": "h" * 100_000, "pid": 7, "extra": "\x1b" * 10, "job": None}
    ).encode()
    record = holder_record(value)
    assert list(record) == ["worker", "host", "pid"]
    assert record["worker"] == "w\\x1b[31m" and record["pid"] == "7"
    assert len(record["host"]) <= CLAIM_LIMIT


@pytest.mark.parametrize(
    ("holder", "reason"),
    [
        (Holder("s", "worker-1", "worker-1"), "held by node worker-1 (Consul's session info)"),
        (
            Holder("s", "worker-2", "worker-1\x1b[2J"),
            "held by node worker-2 (Consul's session info); "
            "its record claims worker worker-1\\x1b[2J: forged?",
        ),
        (
            Holder("s", None, "worker-1\r"),
            "held by another session; its record claims worker worker-1\\r (unverified)",
        ),
        (Holder("s", "worker-1", None), "held by node worker-1 (Consul's session info)"),
        (Holder(None, None, None), "held by another session"),
    ],
)
def test_the_skipped_reason_says_what_consul_vouches_for(holder: Holder, reason: str) -> None:
    assert holder.reason == reason
    fields = holder.event_fields()
    assert fields["reason"] == reason
    assert fields["forged"] is (True if holder.forged else None)
    assert all(_raw_controls(str(v)) == [] for v in fields.values())


HOSTILE_RECORD = {
    "worker": "worker-1\x1b]0;pwned\x07[bold red]RED[/]\r\u202eevil",
    "host": "[link=https://example.invalid]h[/link]",
    "pid": 1,
    "acquired_at": "t" * 100_000,
}


@responses.activate
@pytest.mark.parametrize("as_json", [False, True])
def test_status_shows_a_hostile_record_escaped_literal_and_flagged(
    tmp_path: Path, as_json: bool
) -> None:
    spec = tmp_path / "locks.hcl"
    spec.write_text(
        'worker "worker-1" {\n  address = "http://127.0.0.1:1"\n}\n'
        'job "j" {\n  prefix = "locks/j/"\n  workers = ["worker-1"]\n}\n'
    )
    address = "http://127.0.0.1:1"
    value = base64.b64encode(json.dumps(HOSTILE_RECORD).encode()).decode()
    entry = {"Key": "locks/j/.lock", "Value": value, "Session": "s-1", "LockIndex": 3}
    responses.get(f"{address}/v1/kv/locks/j/.lock", json=[entry])
    responses.get(f"{address}/v1/session/info/s-1", json=[{"ID": "s-1", "Node": "worker-2"}])
    note = {"format": 1, "by": "ops\x1b[2J", "reason": "[red]x[/]\r\u202e" * 50, "at": "x"}
    paused = base64.b64encode(json.dumps(note).encode()).decode()
    paused_url = f"{address}/v1/kv/lockctl/control/j/paused"
    trigger_url = f"{address}/v1/kv/lockctl/control/j/trigger"
    backfill_url = f"{address}/v1/kv/lockctl/control/j/backfill"
    # a hostile backfill value is no note lockctl wrote: never pending, never printed
    responses.get(backfill_url, json=[{"Key": "lockctl/control/j/backfill", "Value": paused}])
    if as_json:  # hostile pause and trigger notes too (in the table, columns more would wrap)
        responses.get(paused_url, json=[{"Key": "lockctl/control/j/paused", "Value": paused}])
        responses.get(trigger_url, json=[{"Key": "lockctl/control/j/trigger", "Value": paused}])
        responses.get(f"{address}/v1/kv/locks/j/trigger-taken", status=404)
    else:
        responses.get(paused_url, status=404)
        responses.get(trigger_url, status=404)
    # a keyed job's keys: a folder whose name is no key is never listed (in the table, the
    # column would wrap the rest: none there)
    hostile_keys = ["locks/j/keys/t\x1b[2J/", "locks/j/keys/ok-1/", "locks/j/keys/[red]x[/]/"]
    keys_url = f"{address}/v1/kv/locks/j/keys/"
    if as_json:
        responses.get(keys_url, json=hostile_keys)
    else:
        responses.get(keys_url, status=404)
    args = ["status", "--spec", str(spec), "--address", address, *(["--json"] if as_json else [])]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert _raw_controls(result.stdout.replace("\n", "")) == []
    assert len(result.stdout) < 5000
    if as_json:
        (state,) = json.loads(result.stdout)
        assert state["node"] == "worker-2" and state["claim_matches_node"] is False
        assert state["paused"].startswith("by ops\\x1b[2J: [red]x[/]\\r\\u202e")
        assert state["trigger_pending"] == state["paused"]  # a note without an id: pending
        assert (state["keys_seen"], state["keys_seen_count"]) == (["ok-1"], 1)
        assert (
            state["claims"]["worker"] == "worker-1\\x1b]0;pwned\\x07[bold red]RED[/]\\r\\u202eevil"
        )
    else:  # markup shown as written, escapes visible, the forged claim called out
        assert "worker-1\\x1b]0;pwned\\x07[bold red]RED[/]\\r\\u202eevil" in result.stdout
        assert "[link=https://example.invalid]h[/link]" in result.stdout
        assert "forged? claims worker-1" in result.stdout


HOSTILE_ANSWER = "1.8.7\x1b]0;pwned\x07[red]x[/]\r\u202e" + "v" * 100_000


def _hostile_report() -> VerifyReport:
    result = CheckResult(
        "version", "fail", f"agents run Consul {HOSTILE_ANSWER}", (HOSTILE_ANSWER,), ("w\x1b",), 0.1
    )
    return VerifyReport((result,), 0.1, 0)


def test_verify_table_and_evidence_show_consul_answers_escaped_literal_and_short(
    capsys: pytest.CaptureFixture[str],
) -> None:
    print_verify_report(_hostile_report(), evidence=True)
    out = capsys.readouterr().out
    assert _raw_controls(out.replace("\n", "")) == []
    assert "1.8.7\\x1b]0;pwned\\x07[red]x[/]\\r\\u202ev" in out  # evidence: on one line
    assert "[red]x[/]" in out.split("evidence:")[0]  # in the table too, as written
    assert len(out) < 10_000


def test_junit_xml_holds_consul_answers_escaped_and_parses() -> None:
    xml = junit_xml(_hostile_report())
    assert _raw_controls(xml.replace("\n", "")) == [] and len(xml) < 10_000
    case = ET.fromstring(xml).find("testcase")
    assert case is not None
    failure = case.find("failure")
    assert failure is not None and failure.text is not None
    assert failure.text.startswith("1.8.7\\x1b]0;pwned\\x07[red]x[/]\\r\\u202ev")
