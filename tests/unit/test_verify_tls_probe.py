"""The probes of provision/consul/probe.py against small servers in threads: a plain-HTTP one, and
TLS ones that require a client certificate or do not, with certificates made by `consul tls`
(the binary the suite uses: CONSUL_BIN, PATH or the cache `make` fills). What a real 1.8.7 agent
answers is in tests/integration/test_verify_tls.py; these pin each outcome the judgements rely
on."""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from provision.cluster.consul_binary import install_consul
from provision.consul import ConsulSettings
from provision.consul.probe import (
    ANSWERED,
    CLOSED,
    ERROR,
    TLS_REFUSED,
    UNREACHABLE,
    UNTRUSTED,
    probe_tls,
)

ANSWER = b'HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\n"ok"'


@dataclass(frozen=True)
class Material:
    ca: Path
    server: tuple[Path, Path]
    client: tuple[Path, Path]
    other_ca: Path


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> Material:
    consul = str(install_consul().path)
    folder = tmp_path_factory.mktemp("tls")
    other = tmp_path_factory.mktemp("other")
    for argv, cwd in [
        (["tls", "ca", "create"], folder),
        (["tls", "cert", "create", "-server", "-additional-ipaddress=127.0.0.1"], folder),
        (["tls", "cert", "create", "-client"], folder),
        (["tls", "ca", "create"], other),
    ]:
        subprocess.run([consul, *argv], cwd=cwd, check=True, capture_output=True)
    return Material(
        folder / "consul-agent-ca.pem",
        (folder / "dc1-server-consul-0.pem", folder / "dc1-server-consul-0-key.pem"),
        (folder / "dc1-client-consul-0.pem", folder / "dc1-client-consul-0-key.pem"),
        other / "consul-agent-ca.pem",
    )


def _serve(listener: socket.socket, context: ssl.SSLContext | None) -> None:
    """Answer each connection once (over TLS when `context` is given) until the listener closes."""
    while True:
        try:
            raw, _ = listener.accept()
        except OSError:
            return
        try:
            conn = context.wrap_socket(raw, server_side=True) if context else raw
            with conn:
                conn.settimeout(2)
                conn.recv(4096)
                conn.sendall(ANSWER)
        except OSError:
            raw.close()  # the client refused, or was refused: next


@pytest.fixture
def serve(material: Material) -> Iterator[object]:
    listeners: list[socket.socket] = []

    def start(mode: str) -> str:
        listener = socket.create_server(("127.0.0.1", 0))
        listeners.append(listener)
        context = None
        if mode != "plain":
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*map(str, material.server))
            if mode == "verify-incoming":
                context.verify_mode = ssl.CERT_REQUIRED
                context.load_verify_locations(str(material.ca))
        threading.Thread(target=_serve, args=(listener, context), daemon=True).start()
        scheme = "http" if mode == "plain" else "https"
        return f"{scheme}://127.0.0.1:{listener.getsockname()[1]}"

    yield start
    for listener in listeners:
        listener.close()


def _settings(material: Material, **changes: object) -> ConsulSettings:
    fields: dict[str, object] = {
        "ca_cert": material.ca,
        "client_cert": material.client[0],
        "client_key": material.client[1],
        "timeout": 3.0,
    }
    fields.update(changes)
    return ConsulSettings(**fields)  # type: ignore[arg-type]


def test_plain_http(serve: object, material: Material) -> None:
    address = serve("plain")  # type: ignore[operator]
    probe = probe_tls(_settings(material), address)
    assert (probe.plain_http.kind, probe.plain_http.status) == (ANSWERED, 200)
    assert probe.plain_http.detail == '"ok"'
    assert probe.verified is None and probe.without_cert is None and not probe.https


def test_https_with_verify_incoming(serve: object, material: Material) -> None:
    probe = probe_tls(_settings(material), serve("verify-incoming"))  # type: ignore[operator]
    assert probe.plain_http.kind in (CLOSED, ANSWERED) and probe.plain_http.status != 200
    assert probe.verified is not None and probe.verified.handshake_done
    assert (probe.verified.kind, probe.verified.status) == (ANSWERED, 200)
    assert probe.peer.startswith("server.dc1.consul [") and "IP Address:127.0.0.1" in probe.peer
    assert probe.without_cert is not None and probe.without_cert.kind in (TLS_REFUSED, CLOSED)
    assert probe.ca == str(material.ca) and probe.client_pair


def test_https_without_verify_incoming_answers_a_client_without_a_certificate(
    serve: object, material: Material
) -> None:
    probe = probe_tls(_settings(material), serve("tls"))  # type: ignore[operator]
    assert probe.without_cert is not None
    assert (probe.without_cert.kind, probe.without_cert.status) == (ANSWERED, 200)


def test_a_certificate_from_another_ca_is_untrusted(serve: object, material: Material) -> None:
    settings = _settings(material, ca_cert=material.other_ca)
    probe = probe_tls(settings, serve("verify-incoming"))  # type: ignore[operator]
    assert probe.verified is not None and probe.verified.kind == UNTRUSTED
    assert probe.verified.detail in (  # OpenSSL's words: as the chain it was sent allows
        "unable to get local issuer certificate",
        "self-signed certificate in certificate chain",
    )
    assert not probe.verified.handshake_done and probe.peer == ""


def test_the_system_cas_do_not_know_the_agent(serve: object, material: Material) -> None:
    settings = _settings(material, ca_cert=None, client_cert=None, client_key=None)
    probe = probe_tls(settings, serve("verify-incoming"))  # type: ignore[operator]
    assert probe.ca == "the system CAs" and not probe.client_pair
    assert probe.verified is not None and probe.verified.kind == UNTRUSTED


def test_unreadable_tls_files_and_a_closed_port(material: Material, tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
    settings = _settings(material, ca_cert=tmp_path / "missing.pem")
    probe = probe_tls(settings, f"https://127.0.0.1:{port}")
    assert probe.plain_http.kind == UNREACHABLE
    assert probe.verified is not None and probe.verified.kind == ERROR
    assert "cannot load the TLS files" in probe.verified.detail
    assert probe.without_cert is not None and probe.without_cert.kind == UNREACHABLE
