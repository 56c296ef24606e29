"""Token files: what plan checks in each (content, mode, owner, which token Consul says it is),
what is never written to one, and a token file that is not one line (bad input, at once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import responses
from typer.testing import CliRunner

from provision.acl.serialize import _describe, _holder_is_gone, _holder_record, _process_start
from provision.acl.token_files import NOT_A_SECRET, REVOKED, secret_path, token_file_state
from provision.cli.app import app
from provision.consul import Consul, ConsulSettings, RetryPolicy
from provision.consul.models import KVEntry
from provision.errors import EXIT_INPUT, InputError
from provision.system.secrets import (
    NotATokenSecret,
    Secret,
    is_token_secret,
    read_secret_file,
    write_secret_file,
)

ADDRESS = "http://consul.test:8500"
SECRET = "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"
SELF = f"{ADDRESS}/v1/acl/token/self"


@pytest.fixture
def consul() -> Consul:
    return Consul(ConsulSettings(address=ADDRESS, timeout=1), retry=RetryPolicy(deadline=0.0))


def _token_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "w1.token"
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)
    return path


@responses.activate
def test_a_file_holding_the_live_token_has_no_problem(consul: Consul, tmp_path: Path) -> None:
    responses.get(SELF, json={"AccessorID": "t1", "Description": "lockctl worker w1"})
    state = token_file_state(consul, _token_file(tmp_path, SECRET + "\n"))
    assert state is not None and state.holds == "t1" and state.problems == ()
    assert responses.calls[0].request.headers["X-Consul-Token"] == SECRET


@responses.activate
def test_a_revoked_secret_is_a_problem(consul: Consul, tmp_path: Path) -> None:
    responses.get(SELF, status=403, body="ACL not found")
    state = token_file_state(consul, _token_file(tmp_path, SECRET))
    assert state is not None and state.holds is None and state.problems == (REVOKED,)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "token file is empty"),
        ("\n  \n", "token file is empty"),
        ("<hidden>\n", NOT_A_SECRET),
        ("garbage", NOT_A_SECRET),
        (f"{SECRET}\n{SECRET}\n", NOT_A_SECRET),
        ("x" * 5000, NOT_A_SECRET),
    ],
)
def test_a_file_that_holds_no_secret_is_not_sent_to_consul(
    consul: Consul, tmp_path: Path, text: str, problem: str
) -> None:
    with responses.RequestsMock() as mocked:
        state = token_file_state(consul, _token_file(tmp_path, text))
        assert not mocked.calls
    assert state is not None and state.holds is None and state.problems == (problem,)


@responses.activate
def test_a_file_open_to_others_is_a_problem_even_with_the_right_secret(
    consul: Consul, tmp_path: Path
) -> None:
    responses.get(SELF, json={"AccessorID": "t1"})
    state = token_file_state(consul, _token_file(tmp_path, SECRET, mode=0o644))
    assert state is not None and state.holds == "t1"
    assert state.problems == ("token file mode 0644 lets group or others in (want 0600)",)


def test_a_fifo_or_a_symlink_is_not_read(consul: Consul, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.token"
    os.mkfifo(fifo)
    link = tmp_path / "link.token"
    link.symlink_to(_token_file(tmp_path, SECRET))
    with responses.RequestsMock() as mocked:
        for path in (fifo, link):
            began = time.monotonic()
            state = token_file_state(consul, path)
            assert time.monotonic() - began < 1  # a FIFO without a writer would hang a read
            assert state is not None and state.problems == ("token file is not a regular file",)
        assert not mocked.calls


def test_a_missing_file_has_no_state(consul: Consul, tmp_path: Path) -> None:
    assert token_file_state(consul, tmp_path / "none.token") is None


@pytest.mark.parametrize("name", ["../x", "/etc/x", "a/../../b", ".", "UPPER", "a b"])
def test_secret_path_refuses_names_that_leave_the_folder(tmp_path: Path, name: str) -> None:
    with pytest.raises(InputError, match="not a valid worker name"):
        secret_path(tmp_path, name)


@pytest.mark.parametrize(
    "value",
    ["<hidden>", "", "anonymous", SECRET + "\n", " " + SECRET],
    ids=["hidden", "empty", "anonymous", "trailing-newline", "leading-space"],  # no secret in IDs
)
def test_only_a_token_secret_is_ever_written(tmp_path: Path, value: str) -> None:
    assert not is_token_secret(Secret(value))
    with pytest.raises(NotATokenSecret):
        write_secret_file(tmp_path / "w1.token", Secret(value))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("text", ["abc\ndef", f"{SECRET}\n{SECRET}", "a\tb", "a\x1bb"])
def test_a_token_file_with_more_than_one_line_is_bad_input(tmp_path: Path, text: str) -> None:
    path = _token_file(tmp_path, text)
    with pytest.raises(InputError, match="must hold one line") as caught:
        read_secret_file(path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_a_token_file_with_a_newline_inside_fails_at_once_with_exit_2(tmp_path: Path) -> None:
    """It was retried 23 times as "Consul unavailable" (exit 3): the header was invalid."""
    path = _token_file(tmp_path, "abc\ndef")
    address = "http://127.0.0.1:9"  # nothing listens: a request would be exit 3 after retries
    began = time.monotonic()
    result = CliRunner().invoke(app, ["status", "--address", address, "--token-file", str(path)])
    assert result.exit_code == EXIT_INPUT, result.output
    assert time.monotonic() - began < 5
    assert result.stderr.count("\n") == 1 and str(path) in result.stderr


# --- lockctl's own lock: who holds it ------------------------------------------------------


def _entry(value: bytes) -> KVEntry:
    return KVEntry("lockctl/apply.lock", value, 0, "s1", 1, 1, 1)


def test_a_live_holder_on_this_machine_is_not_gone() -> None:
    assert not _holder_is_gone(_entry(_holder_record("apply")))


def test_a_dead_holder_on_this_machine_is_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    record = json.loads(_holder_record("apply"))
    record.update(pid=child.pid, started=_process_start(child.pid))
    child.kill()
    child.wait()
    assert _holder_is_gone(_entry(json.dumps(record).encode()))


@pytest.mark.parametrize(
    "value",
    [b"", b"not json", b"[1]", b'{"pid": 1, "machine": "elsewhere", "started": 1}'],
)
def test_a_holder_from_elsewhere_or_unreadable_is_taken_as_alive(value: bytes) -> None:
    assert not _holder_is_gone(_entry(value))


def test_the_holder_description_cannot_carry_terminal_escapes() -> None:
    value = b'{"command": "apply\\u001b]0;pwned\\u0007", "host": "h\\u001b[2Jx", "pid": 5}'
    shown = _describe(_entry(value))
    assert "\x1b" not in shown and "\x07" not in shown
    assert shown == "`lockctl apply0pwned`, pid 5 on h2Jx"
