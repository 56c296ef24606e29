"""A token Consul refuses is re-read from its file, and a new one tried once (consul/tokens.py):
what `lockctl rotate` needs from a process that read the old token (no Consul: `responses`)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import responses

from provision.consul import (
    Consul,
    ConsulSettings,
    GivenSettings,
    PermissionDenied,
    resolve_settings,
)
from provision.consul.tokens import TokenSource, newer_token
from provision.system.secrets import Secret

OLD = "0f9e7a52-1111-4222-8333-44445555aaaa"
NEW = "c0ffee00-dead-4bee-8f00-000000000042"
THIRD = "d00dfeed-0000-4000-8000-000000000003"
ADDRESS = "http://127.0.0.1:8500"
RENEW = f"{ADDRESS}/v1/session/renew/s-1"
SESSION = [{"ID": "s-1", "Name": "n", "Node": "worker-1", "TTL": "15s", "LockDelay": 0}]


def _s(value: str | None) -> Secret | None:
    return None if value is None else Secret(value)


@pytest.mark.parametrize(
    ("refused", "current", "on_file", "retry"),
    [
        (OLD, OLD, NEW, True),  # rotated: the file holds the new one
        (OLD, OLD, OLD, False),  # the same token: the refusal stands (a missing right)
        (OLD, OLD, None, False),  # the file cannot be read now: keep what we have
        (OLD, NEW, THIRD, False),  # another call switched already: it retries that one
        (None, None, NEW, True),  # no token before, one now
    ],
)
def test_newer_token_only_when_the_file_holds_another_and_nobody_switched(
    refused: str | None, current: str | None, on_file: str | None, retry: bool
) -> None:
    assert newer_token(_s(refused), _s(current), _s(on_file)) is retry


def _client(tmp_path: Path) -> tuple[Consul, Path]:
    token_file = tmp_path / "worker-1.token"
    token_file.write_text(OLD + "\n")
    given = GivenSettings(address=ADDRESS, token_file=token_file)
    return Consul(resolve_settings(given, env={})), token_file


def _refuse_old(mocked: responses.RequestsMock) -> None:
    def answer(request: object) -> tuple[int, dict[str, str], str]:
        sent = request.headers.get("X-Consul-Token")  # type: ignore[attr-defined]
        if sent == NEW:
            return 200, {}, '[{"ID": "s-1", "Node": "worker-1", "TTL": "15s"}]'
        return 403, {}, f"ACL not found (token {sent})"  # a body echoing it must not leak it

    mocked.add_callback(responses.PUT, RENEW, callback=answer)


def test_a_refused_token_is_reread_from_its_file_and_the_call_sent_once_more(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    consul, token_file = _client(tmp_path)
    caplog.set_level(logging.DEBUG)
    with responses.RequestsMock() as mocked:
        _refuse_old(mocked)
        with pytest.raises(PermissionDenied) as refused:  # the file still holds the old one
            consul.session.renew("s-1")
        assert len(mocked.calls) == 1  # not retried: nothing new to try
        token_file.write_text(NEW + "\n")  # what rotate writes, before it deletes the old one
        assert consul.session.renew("s-1").id == "s-1"
        assert [c.request.headers["X-Consul-Token"] for c in mocked.calls] == [OLD, OLD, NEW]
        consul.with_retry(consul.retry).session.renew("s-1")  # a derived client: the new one
        assert mocked.calls[-1].request.headers["X-Consul-Token"] == NEW
    text = str(refused.value) + caplog.text
    assert OLD not in text and NEW not in text, text


def test_a_refused_token_with_no_file_or_a_per_call_token_is_not_retried(tmp_path: Path) -> None:
    consul = Consul(
        resolve_settings(GivenSettings(address=ADDRESS), env={"CONSUL_HTTP_TOKEN": OLD})
    )
    consul_with_file, token_file = _client(tmp_path)
    token_file.write_text(NEW + "\n")
    with responses.RequestsMock() as mocked:
        _refuse_old(mocked)
        with pytest.raises(PermissionDenied):
            consul.session.renew("s-1")  # the token came from the environment: no file
        mocked.add(responses.GET, f"{ADDRESS}/v1/agent/self", status=403, body="ACL not found")
        with pytest.raises(PermissionDenied):  # a token the caller chose is the caller's
            consul_with_file.agent.self(token=Secret(OLD))
        assert len(mocked.calls) == 2


def test_token_source_refresh_reads_the_file_once_for_many_refused_calls(tmp_path: Path) -> None:
    token_file = tmp_path / "t"
    token_file.write_text(NEW)
    source = TokenSource(Secret(OLD), token_file)
    assert source.refresh(Secret(OLD)) == Secret(NEW)
    token_file.write_text(THIRD)
    # a call refused with the old token after the switch retries the current one, no re-read
    assert source.refresh(Secret(OLD)) == Secret(NEW)
    assert source.current == Secret(NEW)
    token_file.unlink()
    assert source.refresh(Secret(NEW)) is None  # gone: the refusal stands


def test_use_token_switches_every_client_sharing_the_source(tmp_path: Path) -> None:
    consul, _ = _client(tmp_path)
    derived = consul.with_retry(consul.retry)
    consul.use_token(Secret(NEW))  # a reload read the same file again
    with responses.RequestsMock() as mocked:
        _refuse_old(mocked)
        derived.session.renew("s-1")
        assert [c.request.headers["X-Consul-Token"] for c in mocked.calls] == [NEW]


@pytest.mark.parametrize(
    "swap",
    [
        lambda s: dataclasses.replace(s, token=None),  # verify's probe without a token
        lambda s: dataclasses.replace(s, token=Secret(THIRD)),  # another worker's token
        lambda s: ConsulSettings(address=ADDRESS, token=Secret(THIRD), token_file=s.token_file),
    ],
)
def test_a_token_put_in_place_of_the_files_is_never_retried_with_the_files(
    tmp_path: Path, swap: Callable[[ConsulSettings], ConsulSettings]
) -> None:
    """A copy of the settings with another token keeps the token file's path (verify probes
    with no token, or with another worker's, over the management settings): a 403 to it must
    stay a 403, never become a call with the file's token (it would pass every 403 check)."""
    consul, token_file = _client(tmp_path)
    token_file.write_text(NEW + "\n")  # the file's token would be accepted
    probe = Consul(swap(consul.settings))
    with responses.RequestsMock() as mocked:
        _refuse_old(mocked)
        with pytest.raises(PermissionDenied):
            probe.session.renew("s-1")
        with pytest.raises(PermissionDenied):
            consul.with_settings(token=None).session.renew("s-1")
        assert all(c.request.headers.get("X-Consul-Token") != NEW for c in mocked.calls)
        assert len(mocked.calls) == 2
