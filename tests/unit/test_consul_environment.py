"""The transport reads requests' environment (proxies, CA bundle) once, when it is built.

requests would scan os.environ and look for ~/.netrc on every call (`trust_env`); lockctl's own
session resolves the proxy for its agent once instead, so the lock hand-over path does not pay for
it. These tests pin that the variables still mean what they meant: a proxy from HTTP_PROXY is
used (and NO_PROXY bypasses it), and REQUESTS_CA_BUNDLE still names the CA bundle.
Everything here stays on loopback: the "proxy" is a local server that answers by itself.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from provision.consul import Consul, ConsulSettings
from provision.consul.transport import Call, Transport

AGENT = "http://127.0.3.99:8500"  # nothing listens here: only the proxy can answer
PROXY_VARIABLES = (
    "HTTP_PROXY",
    "http_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "ALL_PROXY",
    "all_proxy",
    "NO_PROXY",
    "no_proxy",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
)


class _Proxy(BaseHTTPRequestHandler):
    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:  # a forward proxy gets the absolute URL in the request line
        _Proxy.seen.append(self.path)
        body = json.dumps("127.0.3.99:8300").encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def proxy() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Proxy)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    _Proxy.seen = []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_the_session_does_not_read_the_environment_per_request() -> None:
    transport = Transport(ConsulSettings(address=AGENT))
    assert transport.session.trust_env is False


def test_http_proxy_is_resolved_once_and_used(proxy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", proxy)
    consul = Consul(ConsulSettings(address=AGENT, timeout=5.0))
    monkeypatch.delenv("HTTP_PROXY")  # read when the client was built, not per call
    assert consul.transport.session.proxies == {"http": proxy}
    consul.transport.request(Call("GET", "/v1/status/leader"))
    assert _Proxy.seen == [f"{AGENT}/v1/status/leader"]


def test_no_proxy_bypasses_the_proxy(proxy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", proxy)
    monkeypatch.setenv("NO_PROXY", "127.0.3.99")
    transport = Transport(ConsulSettings(address=AGENT))
    assert "http" not in transport.session.proxies


def test_ca_bundle_from_the_environment_unless_the_settings_name_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = tmp_path / "bundle.pem"
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(bundle))
    assert Transport(ConsulSettings(address=AGENT))._verify() == str(bundle)
    own = tmp_path / "consul-ca.pem"
    assert Transport(ConsulSettings(address=AGENT, ca_cert=own))._verify() == str(own)
    assert Transport(ConsulSettings(address=AGENT, verify_tls=False))._verify() is False
    monkeypatch.delenv("REQUESTS_CA_BUNDLE")
    assert Transport(ConsulSettings(address=AGENT))._verify() is True
