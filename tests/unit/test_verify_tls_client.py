"""Plain HTTP to a port that serves HTTPS only: Go's TLS server answers 400 "Client sent an HTTP
request to an HTTPS server." The client says what to do (use https://), as bad input (exit 2),
on one line with the body escaped. The real agent's answer is in tests/integration/
test_verify_tls.py; `responses` fakes the hostile variant a real agent never sends."""

from __future__ import annotations

import re

import pytest
import responses
from typer.testing import CliRunner

from provision.cli import app
from provision.consul import Consul, ConsulSettings
from provision.consul.errors import ConsulHTTPError, SpeaksHttps
from provision.errors import EXIT_INPUT

ADDRESS = "http://127.0.0.1:8501"
REFUSAL = "Client sent an HTTP request to an HTTPS server.\n"
runner = CliRunner()


@responses.activate
def test_plain_http_to_an_https_port_says_use_https() -> None:
    responses.get(f"{ADDRESS}/v1/status/leader", body=REFUSAL, status=400)
    with pytest.raises(SpeaksHttps) as caught:
        Consul(ConsulSettings(address=ADDRESS)).status.leader()
    message = str(caught.value)
    assert message == (
        "consul: GET /v1/status/leader on http://127.0.0.1:8501: 400 Client sent an HTTP "
        "request to an HTTPS server.: this address speaks HTTPS: use https://127.0.0.1:8501"
    )
    assert caught.value.exit_code == EXIT_INPUT
    assert not isinstance(caught.value, ConsulHTTPError)  # not an answer of Consul's API


@responses.activate
def test_other_400s_stay_api_errors() -> None:
    responses.get(f"{ADDRESS}/v1/status/leader", body="Bad request: no", status=400)
    with pytest.raises(ConsulHTTPError) as caught:
        Consul(ConsulSettings(address=ADDRESS)).status.leader()
    assert caught.value.status == 400 and caught.value.exit_code == 5


@responses.activate
def test_the_cli_exits_2_with_one_escaped_line() -> None:
    hostile = "Client sent an HTTP request to an HTTPS server.\x1b]0;owned\x07\n\u202eevil"
    responses.get(re.compile(re.escape(ADDRESS) + "/.*"), body=hostile, status=400)
    result = runner.invoke(app, ["status", "--address", ADDRESS], env={"CONSUL_HTTP_TOKEN": ""})
    assert result.exit_code == EXIT_INPUT, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("lockctl: error: consul: GET ")
    assert lines[0].endswith("this address speaks HTTPS: use https://127.0.0.1:8501")
    assert "\x1b" not in result.output and "\u202e" not in result.output
    assert "\\x1b]0;owned\\x07" in result.output
