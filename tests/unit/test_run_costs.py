"""What each run of a scheduler's job costs lockctl, cut without changing what it promises: the
command checked once per run (before any lock), the TLS key read only when it changes, tick
names cached by their instant, events written as json.dumps would."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from provision.consul import ConsulSettings, answers
from provision.consul.answers import answer_date
from provision.errors import InputError
from provision.ledger.records import tick_name
from provision.runner import on_core, output
from provision.runner.events import EventLog

ARMOUR = "-----BEGIN EC PRIVATE KEY-----\n{}\n-----END EC PRIVATE KEY-----\n"
KEY = ARMOUR.format("MHcCAQEEIBase64LineOfTheKey")
ROTATED = ARMOUR.format("MHcCAQEEIAnotherKeyLine42")


def _consul(settings: ConsulSettings) -> Any:
    """What prepare_body reads of the client: its settings and token."""
    tokens = SimpleNamespace(current=None)
    return SimpleNamespace(settings=settings, transport=SimpleNamespace(tokens=tokens))


def _ask(command: list[str]) -> Any:
    """What prepare_body reads of a run's ask: the job's http (none), the command."""
    return SimpleNamespace(job=SimpleNamespace(http=None), command=tuple(command), tick=None)


def test_a_command_that_cannot_start_is_refused_before_the_run_prepares_anything() -> None:
    with pytest.raises(InputError, match="cannot start '/nonexistent/job'"):
        on_core.prepare_body(_consul(ConsulSettings()), _ask(["/nonexistent/job"]))


def test_the_first_attempt_trusts_that_check_and_each_retry_checks_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[bool] = []
    monkeypatch.setattr(on_core, "Child", lambda *args, checked: made.append(checked))
    prepare = on_core.prepare_body(_consul(ConsulSettings()), _ask(["/bin/sh", "-c", "true"]))
    for _ in range(3):
        prepare()
    assert made == [True, False, False]


def _counting_open(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    opened: list[str] = []
    real: Callable[..., Any] = open

    def counting(path: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(os.fspath(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(output, "open", counting, raising=False)  # the module's `open`
    return opened


def _replace(path: Path, text: str) -> None:
    """As a rotation does: a new file renamed over the old one (another inode)."""
    fresh = path.with_suffix(".new")
    fresh.write_text(text)
    fresh.rename(path)


@pytest.mark.parametrize(
    ("change", "expected", "reads"),
    [
        (lambda key: None, ("MHcCAQEEIBase64LineOfTheKey",), 1),  # unchanged: not read again
        (lambda key: _replace(key, ROTATED), ("MHcCAQEEIAnotherKeyLine42",), 2),
        (lambda key: key.write_text(ROTATED + "\n"), ("MHcCAQEEIAnotherKeyLine42", ""), 2),
        (lambda key: os.utime(key, ns=(1, 1)), ("MHcCAQEEIBase64LineOfTheKey",), 2),  # a touch
        (lambda key: key.unlink(), (), 1),  # gone: nothing to mask, nothing read
    ],
)
def test_the_key_is_read_again_only_when_the_file_changed(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    change: Callable[[Path], None],
    expected: tuple[str, ...],
    reads: int,
) -> None:
    key = tmp_path / "client.key"
    key.write_text(KEY)
    opened = _counting_open(monkeypatch)
    assert output.key_lines(key) == ("MHcCAQEEIBase64LineOfTheKey",)
    assert output.key_lines(key) == ("MHcCAQEEIBase64LineOfTheKey",)
    assert opened == [str(key)]  # the second call only looked (a stat)
    change(key)
    assert output.key_lines(key) == expected
    assert len(opened) == reads


def test_a_rotated_key_is_masked_from_the_next_run_on(tmp_path: Path) -> None:
    key = tmp_path / "client.key"
    key.write_text(KEY)
    assert "MHcCAQEEIBase64LineOfTheKey" in output.runner_secrets(None, {}, key)
    _replace(key, ROTATED)
    found = output.runner_secrets(None, {}, key)
    assert "MHcCAQEEIAnotherKeyLine42" in found and "MHcCAQEEIBase64LineOfTheKey" not in found


PARIS = ZoneInfo("Europe/Paris")
REPEATED = datetime(2026, 10, 25, 2, 30, tzinfo=PARIS)  # 02:30 happens twice that night


@pytest.mark.parametrize(
    ("tick", "name"),
    [
        (datetime(2026, 12, 5, 1, 0, tzinfo=timezone.utc), "2026-12-05T01:00:00Z"),
        (datetime(2026, 12, 5, 2, 0, tzinfo=PARIS), "2026-12-05T01:00:00Z"),  # the same instant
        (REPEATED, "2026-10-25T00:30:00Z"),
        (REPEATED.replace(fold=1), "2026-10-25T01:30:00Z"),  # equal to the one above, an hour on
        (datetime(1960, 1, 1, tzinfo=timezone.utc), "1960-01-01T00:00:00Z"),
    ],
)
def test_tick_names_are_cached_by_the_instant_not_the_datetime(tick: datetime, name: str) -> None:
    assert tick_name(REPEATED) == "2026-10-25T00:30:00Z"  # cached first, whatever the order
    assert tick_name(tick) == name
    assert tick_name(tick) == tick.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_an_event_line_is_what_json_dumps_wrote() -> None:
    stream = io.StringIO()
    fields = {"tick": "2026-12-05T01:00:00Z", "path": Path("/x"), "ms": 1.5, "ok": True}
    EventLog("nightly", "worker-1", stream).emit("acquired", session=None, **fields)
    line = stream.getvalue()
    record = json.loads(line)
    expected = {"time": record["time"], "event": "acquired", "job": "nightly"}
    expected |= {"worker": "worker-1", **fields}
    assert line == json.dumps(expected, separators=(",", ":"), default=str) + "\n"


ANSWERED = datetime(2026, 12, 5, 1, 28, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("date", "expected"),
    [
        ("Sat, 05 Dec 2026 01:28:01 GMT", ANSWERED),
        ("Sat, 05 Dec 2026 02:28:01 +0100", ANSWERED),
        ("Sat, 05 Dec 2026 01:28:01 -0000", None),  # no zone said: not a clock to learn from
        ("not a date", None),
        ("", None),
        ("Sat, 05 Dec 2026 01:28:01 GMT" + " " * 100, ANSWERED),  # parsed, too long to keep
    ],
)
def test_an_answers_date_is_parsed_once_per_value(date: str, expected: datetime | None) -> None:
    answers._cached_date.cache_clear()
    assert answer_date({"Date": date}) == expected
    assert answer_date({"Date": date}) == expected  # the second time from the cache
    info = answers._cached_date.cache_info()
    kept = 0 < len(date) <= answers.DATE_MAX
    assert (info.currsize, info.hits) == ((1, 1) if kept else (0, 0))
