"""`lockctl break JOB`: when it destroys the holder's session and when it refuses (pure), what it
shows (untrusted text escaped), and that it destroys only the session it showed."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from provision.cli import app
from provision.consul.models import KVEntry, Session
from provision.ledger import breaking
from provision.ledger.breaking import (
    HolderView,
    break_refusal,
    describe,
    destroy_holder,
)
from provision.ledger.holder import holder_record
from provision.ledger.records import TickOutcome, TickRecord

NOW = datetime(2026, 12, 6, 3, 0, tzinfo=timezone.utc)
KEY = "locks/nightly-ingest/.lock"
SPEC = Path(__file__).resolve().parents[2] / "policies" / "locks.hcl"
LOCKCTL_NAME = "lockctl schedule on worker-1 (ttl 15s, lock-delay 15s)"


def _session(name: str = LOCKCTL_NAME, node: str = "worker-1") -> Session:
    return Session("sess-1", name, node, "15s", 15_000_000_000, "release", ("serfHealth",), 42)


def _held(serf: str | None = "passing", name: str = LOCKCTL_NAME) -> HolderView:
    claims = {"worker": "worker-1", "tick": "2026-12-06T02:00:00Z"}
    return HolderView("nightly-ingest", KEY, "sess-1", 7, _session(name), serf, claims)


FREE = HolderView("nightly-ingest", KEY, None, 6)
GONE = HolderView("nightly-ingest", KEY, "sess-1", 7)  # the key named it; its info is gone
CONSUL_LOCK = "Consul API Lock"


@pytest.mark.parametrize(
    ("view", "force", "refused", "nothing_held", "says"),
    [
        (FREE, False, True, True, "nothing to break: the lock of job nightly-ingest"),
        (FREE, True, True, True, "is free"),
        (GONE, False, True, True, "ended meanwhile"),
        (_held("passing"), False, True, False, "node worker-1 is healthy (serfHealth passing)"),
        (_held("passing"), True, False, False, ""),
        (_held("critical"), False, False, False, ""),
        (_held("warning"), False, True, False, "serfHealth warning"),
        (_held(None), False, True, False, "no serfHealth check"),
        (_held(None), True, False, False, ""),
        (_held("critical", CONSUL_LOCK), False, True, False, "not lockctl's"),
        (_held("critical", CONSUL_LOCK), True, False, False, ""),
    ],
)
def test_break_destroys_only_a_lockctl_session_on_a_failing_node_unless_forced(
    view: HolderView, force: bool, refused: bool, nothing_held: bool, says: str
) -> None:
    refusal = break_refusal(view, force)
    assert (refusal is not None) is refused
    if refusal is not None:
        assert refusal.nothing_held is nothing_held
        assert says in refusal.reason


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, {}),
        (b"not json", {}),
        (b"[1]", {}),
        (b"[" * 100_000, {}),  # nested too deep: no RecursionError
        (b'{"worker": "' + b"w" * 524_000 + b'"}', {"worker": "w" * 46 + "...(+523954 chars)"}),
        (b'{"worker": {"nested": 1}, "pid": 42}', {"pid": "42"}),
        (
            json.dumps({"worker": "w\x1b[2J", "tick": "t" * 100}).encode(),
            {"worker": "w\\x1b[2J", "tick": "t" * 50 + "...(+50 chars)"},
        ),
    ],
)
def test_the_holders_record_is_untrusted_text(
    value: bytes | None, expected: dict[str, str]
) -> None:
    assert holder_record(value) == expected


def test_what_break_shows_says_whose_word_each_line_is() -> None:
    record = TickRecord(
        datetime(2026, 12, 6, 2, 0, tzinfo=timezone.utc),
        TickOutcome.RUNNING,
        worker="worker-1",
        session="another",
    )
    claims = {
        "worker": "worker-2",  # the session is on worker-1: forged?
        "acquired_at": (NOW - timedelta(minutes=61, seconds=5)).isoformat(timespec="seconds"),
        "tick": "2026-12-06T02:00:00Z",
    }
    view = replace(
        _held("passing", name="lockctl x\x1b]0;owned\x07"),
        claims=claims,
        tick_record=record,
        also_holds=("hourly-report",),
    )
    shown = "\n".join(describe(view, NOW))
    assert "\x1b" not in shown and "\\x1b]0;owned\\x07" in shown
    assert "LockIndex 7 (the fencing token)" in shown
    assert "worker-1, serfHealth passing" in shown
    assert "made at Raft index 42" in shown and "no time" in shown
    assert "lock-delay: 15s" in shown
    assert "names worker worker-2, not node worker-1: forged?" in shown
    assert "held for:   1h01m05s, by the holder's clock" in shown
    assert "running in the ledger, claimed by worker-1 under ANOTHER session" in shown
    assert "the locks of hourly-report (freed too)" in shown


class _FakeConsul:
    """The two calls destroy_holder makes: the key read again, the destroy."""

    def __init__(self, holder: str | None) -> None:
        self.holder, self.destroyed = holder, []  # type: list[str]
        self.kv, self.session = self, self

    def get(self, key: str, **_: Any) -> tuple[KVEntry | None, None]:
        return KVEntry(key, None, 0, self.holder, 7, 1, 9), None

    def destroy(self, session_id: str) -> bool:
        self.destroyed.append(session_id)
        return True

    def info(self, session_id: str, **_: Any) -> Session | None:
        return None  # what Consul answers for a session that ended, and for one not readable


def test_a_session_this_token_may_not_read_is_a_denial_not_a_free_lock() -> None:
    """Consul filters a session the token may not read out of its answer: empty, as for one
    that ended. The key still naming it tells the two apart."""
    with pytest.raises(breaking.BreakDenied, match="break needs an operator's token") as denied:
        breaking.read_holder(_FakeConsul("sess-1"), "nightly-ingest", KEY, {})  # type: ignore[arg-type]
    assert denied.value.exit_code == 4

    class _Ended(_FakeConsul):
        def get(self, key: str, **_: Any) -> tuple[KVEntry | None, None]:
            self.reads = getattr(self, "reads", 0) + 1  # the second read: its session ended
            return KVEntry(key, None, 0, "sess-1" if self.reads == 1 else None, 7, 1, 9), None

    view = breaking.read_holder(_Ended("sess-1"), "nightly-ingest", KEY, {})  # type: ignore[arg-type]
    refusal = break_refusal(view, force=True)
    assert refusal is not None and refusal.nothing_held and "ended meanwhile" in refusal.reason


def test_break_destroys_the_session_it_showed_and_says_when_the_lock_is_free_again() -> None:
    consul = _FakeConsul("sess-1")
    broken = destroy_holder(consul, _held("critical"), NOW)  # type: ignore[arg-type]
    assert consul.destroyed == ["sess-1"]
    assert broken.claimable_at == NOW + timedelta(seconds=15)


def test_a_holder_that_changed_while_the_operator_confirmed_is_not_destroyed() -> None:
    consul = _FakeConsul("sess-2")
    with pytest.raises(breaking.BreakRefused, match="changed while you confirmed"):
        destroy_holder(consul, _held("critical"), NOW)  # type: ignore[arg-type]
    assert consul.destroyed == []


def _invoke(
    monkeypatch: pytest.MonkeyPatch, view: HolderView, *flags: str
) -> tuple[int, str, list[HolderView]]:
    """`lockctl break nightly-ingest` with the reads and the destroy replaced."""
    destroyed: list[HolderView] = []

    def destroy(_: Any, shown: HolderView) -> breaking.Broken:
        destroyed.append(shown)
        return breaking.Broken("sess-1", NOW + timedelta(seconds=15), 15.0)

    monkeypatch.setattr(breaking, "read_holder", lambda *_: view)
    monkeypatch.setattr(breaking, "destroy_holder", destroy)
    argv = ["break", "nightly-ingest", "--spec", str(SPEC), "--address", "127.0.0.1:1", *flags]
    result = CliRunner().invoke(app, argv)
    return result.exit_code, result.output, destroyed


def test_the_command_refuses_asks_or_destroys(monkeypatch: pytest.MonkeyPatch) -> None:
    code, said, destroyed = _invoke(monkeypatch, FREE)
    assert (code, destroyed) == (0, []) and said.startswith("nothing to break")

    code, said, destroyed = _invoke(monkeypatch, _held("passing"), "--yes")
    assert (code, destroyed) == (1, []) and "not broken: node worker-1 is healthy" in said

    code, said, destroyed = _invoke(monkeypatch, _held("critical"))  # stdin is no terminal
    assert (code, destroyed) == (2, []) and "confirm with --yes" in said

    code, said, destroyed = _invoke(monkeypatch, _held("passing"), "--force", "--yes")
    assert code == 0 and len(destroyed) == 1, said
    assert "forced (--force): node worker-1 is healthy (serfHealth passing)" in said
    assert "exit 76" in said and "LockIndex 7" in said
    assert "may be taken again from about 2026-12-06T03:00:15Z (LockDelay 15s)" in said
