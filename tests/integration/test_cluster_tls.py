"""`cluster up --tls` on real Consul 1.8.7: HTTPS only, certificates verified both ways,
gossip encrypted, keys private and never shown, and the `consul` CLI working from `cluster env`.

One TLS cluster for the module, started through the CLI (so its output can be searched for
secrets), on the lifecycle subnet (LOCKCTL_TEST_LIFECYCLE_SUBNET), stopped at the end.
"""

from __future__ import annotations

import http.client
import os
import re
import shlex
import socket
import ssl
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from provision.cli import app
from provision.cluster.consul_binary import install_consul
from provision.cluster.layout import CLI_CERT_NAME, ClusterLayout, load_layout
from provision.cluster.local import cluster_down
from provision.cluster.tls import consul_settings
from provision.consul import Consul
from provision.consul.errors import ConsulUnavailable
from provision.consul.quick import quick_get
from provision.errors import EXIT_ENVIRONMENT
from provision.system.processes import read_pid
from provision.system.secrets import Secret, read_secret_file
from tests.subnets import LIFECYCLE_SUBNET

runner = CliRunner()
PEM_BODY = re.compile(r"-----BEGIN [A-Z ]+-----\n(.*?)\n-----END", re.S)


@dataclass
class TlsCluster:
    state_dir: Path
    layout: ClusterLayout
    up_output: str
    management_token: Secret

    def management(self, name: str = "server-1") -> Consul:
        agent = next(a for a in self.layout.agents if a.name == name)
        settings = consul_settings(
            self.layout, address=agent.http_address, token=self.management_token
        )
        return Consul(settings)

    def secrets(self) -> list[str]:
        """The gossip key, the body of every private key, and the management token."""
        keys = [self.layout.gossip_key_file.read_text().strip(), self.management_token.reveal()]
        for path in self.layout.tls_dir.glob("*-key.pem"):
            keys += [line for line in _pem_body(path).splitlines() if len(line) > 16]
        return keys


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsCluster]:
    state_dir = tmp_path_factory.mktemp("tls") / "state"
    argv = ["cluster", "up", "--tls", "--state-dir", str(state_dir), "--subnet", LIFECYCLE_SUBNET]
    result = runner.invoke(app, argv)
    try:
        assert result.exit_code == 0, result.output
        layout = load_layout(state_dir)
        assert layout is not None
        token = read_secret_file(layout.management_token_file)
        yield TlsCluster(state_dir, layout, result.output, token)
    finally:
        cluster_down(state_dir)
    assert not state_dir.exists(), "down removes the TLS material with everything else"


def test_up_says_tls_and_every_agent_answers_https(tls_cluster: TlsCluster) -> None:
    assert "TLS: HTTPS only, certificates verified both ways, gossip encrypted" in (
        tls_cluster.up_output
    )
    assert "healthy: yes" in tls_cluster.up_output
    for agent in tls_cluster.layout.agents:
        assert agent.http_address == f"https://{agent.address}:8501"
        assert tls_cluster.management(agent.name).status.leader()
    status = runner.invoke(app, ["cluster", "status", "--state-dir", str(tls_cluster.state_dir)])
    assert status.exit_code == 0, status.output
    assert "healthy: yes" in status.output and f"{LIFECYCLE_SUBNET}.11:8501" in status.output


def test_plain_http_is_refused(tls_cluster: TlsCluster) -> None:
    server = tls_cluster.layout.servers[0].address
    with pytest.raises(ConnectionRefusedError):  # the HTTP port is off
        socket.create_connection((server, 8500), timeout=3).close()
    plain = http.client.HTTPConnection(server, 8501, timeout=3)  # HTTP to the HTTPS port
    plain.request("GET", "/v1/status/leader")
    answer = plain.getresponse()
    assert (answer.status, answer.read()) == (
        400,
        b"Client sent an HTTP request to an HTTPS server.\n",
    )


def test_a_client_without_a_certificate_is_refused(tls_cluster: TlsCluster) -> None:
    layout = tls_cluster.layout
    context = ssl.create_default_context(cafile=str(layout.ca_cert_file))
    for agent in layout.agents:
        # TLS 1.3: the handshake completes on our side; the refusal is the first read.
        with (
            socket.create_connection((agent.address, 8501), timeout=3) as raw,
            pytest.raises(ssl.SSLError, match="BAD_CERTIFICATE"),
            context.wrap_socket(raw, server_hostname=agent.address) as tls,
        ):
            tls.sendall(b"GET /v1/status/leader HTTP/1.1\r\nHost: x\r\n\r\n")
            tls.recv(100)
    without_cert = tls_cluster.management().with_settings(client_cert=None, client_key=None)
    with pytest.raises(ConsulUnavailable, match="TLS failure"):
        without_cert.status.leader()


def test_the_agents_certificate_verifies_against_the_ca_only(tls_cluster: TlsCluster) -> None:
    untrusting = tls_cluster.management().with_settings(ca_cert=None)  # system CAs
    with pytest.raises(ConsulUnavailable, match="TLS failure"):
        untrusting.status.leader()


def test_the_quick_read_works_over_https_with_the_pair(tls_cluster: TlsCluster) -> None:
    """`lockctl run`'s cheap skip (http.client, not requests) speaks the same TLS."""
    management = tls_cluster.management("worker-1")
    management.kv.put("locks/tls-quick/probe", b"quick")
    try:
        entry = quick_get(management.settings, "locks/tls-quick/probe")
        assert entry is not None and entry.value == b"quick"
        no_pair = management.with_settings(client_cert=None, client_key=None).settings
        assert quick_get(no_pair, "locks/tls-quick/probe") is None  # refused: the full path
    finally:
        management.kv.delete("locks/tls-quick/probe")


def test_keys_are_0600_in_a_0700_folder(tls_cluster: TlsCluster) -> None:
    layout = tls_cluster.layout
    assert _mode(layout.state_dir) == 0o700 and _mode(layout.tls_dir) == 0o700
    keys = sorted(p.name for p in layout.tls_dir.glob("*-key.pem"))
    assert keys == sorted(f"{n}-key.pem" for n in ["ca", CLI_CERT_NAME, *_names(layout)])
    for path in [*layout.tls_dir.glob("*-key.pem"), layout.gossip_key_file]:
        assert _mode(path) == 0o600, path
    for agent in layout.agents:  # the config holds the gossip key
        assert _mode(layout.config_file(agent)) == 0o600
    assert sorted(p.name for p in layout.tls_dir.iterdir()) == sorted(
        p.name for p in layout.tls_files()
    )


def test_no_key_in_any_output_log_or_argv(tls_cluster: TlsCluster) -> None:
    layout, state = tls_cluster.layout, str(tls_cluster.state_dir)
    texts = {"up": tls_cluster.up_output}
    for command in (["status"], ["status", "--json"], ["env"]):
        texts[" ".join(command)] = runner.invoke(
            app, ["cluster", *command, "--state-dir", state]
        ).output
    texts["cluster.json"] = (layout.state_dir / "cluster.json").read_text()
    for agent in layout.agents:
        texts[f"{agent.name} log"] = layout.log_file(agent).read_text()
        pid = read_pid(layout.pidfile(agent))
        texts[f"{agent.name} argv"] = Path(f"/proc/{pid}/cmdline").read_text()
    secrets = tls_cluster.secrets()
    assert len(secrets) > 8
    for name, text in texts.items():
        for secret in secrets:
            assert secret not in text, f"a secret in {name}"


def test_cluster_env_drives_the_real_consul_cli(tls_cluster: TlsCluster) -> None:
    state = str(tls_cluster.state_dir)
    exports = runner.invoke(app, ["cluster", "env", "--state-dir", state]).output
    server = tls_cluster.layout.servers[0].address
    assert f"export CONSUL_HTTP_ADDR=https://{server}:8501" in exports
    for name, file in (("CONSUL_CACERT", "ca.pem"), ("CONSUL_CLIENT_CERT", "lockctl.pem")):
        assert f"export {name}={tls_cluster.layout.tls_dir / file}" in exports
    assert f"export CONSUL_CLIENT_KEY={tls_cluster.layout.tls_dir / 'lockctl-key.pem'}" in exports
    members = _consul_cli(exports, "members")
    assert members.returncode == 0, members.stderr
    assert sorted(line.split()[0] for line in members.stdout.splitlines()[1:]) == sorted(
        _names(tls_cluster.layout)
    )
    put = _consul_cli(exports, "kv put locks/tls-cli/probe over-https")
    assert put.returncode == 0 and "Success!" in put.stdout, put.stderr
    got = _consul_cli(exports, "kv get locks/tls-cli/probe")
    assert got.stdout.strip() == "over-https"
    _consul_cli(exports, "kv delete locks/tls-cli/probe")
    # The certificate pair is what lets the CLI in: without it, the agent refuses.
    refused = _consul_cli(exports + "unset CONSUL_CLIENT_CERT CONSUL_CLIENT_KEY\n", "members")
    # (its error varies with timing: "remote error: tls: bad certificate" or a broken pipe)
    assert refused.returncode == 1 and "Error retrieving members" in refused.stderr
    for output in (members, put, got, refused):
        for secret in tls_cluster.secrets():
            assert secret not in output.stdout + output.stderr


def test_gossip_is_encrypted_on_every_agent(tls_cluster: TlsCluster) -> None:
    for agent in tls_cluster.layout.agents:
        self_info = tls_cluster.management(agent.name).agent.self()
        assert self_info["Stats"]["serf_lan"]["encrypted"] == "true", agent.name
        debug = self_info["DebugConfig"]
        assert (debug["VerifyIncoming"], debug["VerifyOutgoing"]) == (True, True)
        assert debug["VerifyServerHostname"] is True
        assert (debug["HTTPPort"], debug["HTTPSPort"]) == (-1, 8501)
        if agent.server:
            assert self_info["Stats"]["serf_wan"]["encrypted"] == "true"


def test_up_again_keeps_the_material_and_refuses_to_drop_tls(tls_cluster: TlsCluster) -> None:
    state = str(tls_cluster.state_dir)
    before = {p.name: p.read_bytes() for p in tls_cluster.layout.tls_dir.iterdir()}
    again = runner.invoke(app, ["cluster", "up", "--state-dir", state])  # as recorded: TLS, subnet
    assert again.exit_code == 0, again.output
    assert "started: none" in again.output
    assert {p.name: p.read_bytes() for p in tls_cluster.layout.tls_dir.iterdir()} == before
    plain = runner.invoke(app, ["cluster", "up", "--no-tls", "--state-dir", state])
    assert plain.exit_code == EXIT_ENVIRONMENT
    assert "holds a different cluster" in plain.output and "TLS" in plain.output


@pytest.mark.skipif(os.geteuid() != 0, reason="--netns needs root")
def test_a_namespace_cluster_with_tls(tmp_path: Path) -> None:
    state = tmp_path / "ns"
    up = runner.invoke(
        app, ["cluster", "up", "--tls", "--netns", "--workers", "1", "--state-dir", str(state)]
    )
    try:
        assert up.exit_code == 0, up.output
        exports = runner.invoke(app, ["cluster", "env", "--state-dir", str(state)]).output
        layout = load_layout(state)
        assert layout is not None and layout.driver_netns is not None
        assert f"export CONSUL_HTTP_ADDR=https://{layout.servers[0].address}:8501" in exports
        members = _consul_cli(exports, "members", netns=layout.driver_netns)
        assert members.returncode == 0, members.stderr
        assert len(members.stdout.splitlines()) == 1 + len(layout.agents)
    finally:
        cluster_down(state)


def _consul_cli(
    exports: str, args: str, netns: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The real `consul` CLI, in a shell that evaluated `cluster env`'s output."""
    consul = shlex.quote(str(install_consul().path))
    prefix = f"ip netns exec {shlex.quote(netns)} " if netns else ""
    script = f"{exports}\n{prefix}{consul} {args}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONSUL_")}
    return subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def _pem_body(path: Path) -> str:
    match = PEM_BODY.search(path.read_text())
    assert match is not None, path
    return match.group(1)


def _names(layout: ClusterLayout) -> list[str]:
    return [agent.name for agent in layout.agents]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)
