"""verify's tls-http and gossip-encrypted on real Consul 1.8.7: red on a plain-HTTP cluster with
the message that says what to turn on, green on a `cluster up --tls` cluster, and on a TLS
cluster one of whose agents lacks verify_incoming, tls-http red naming that agent (and
gossip-encrypted still green). Also the client's own word for plain HTTP to the HTTPS port.

The plain cluster is the session cluster while it runs plain HTTP, else one of our own; the TLS
cluster is our own. Both of our own run on the lifecycle subnet (LOCKCTL_TEST_LIFECYCLE_SUBNET),
one after the other: each is class-scoped.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from provision.cli import app
from provision.cluster.layout import ClusterLayout
from provision.cluster.local import ClusterShape, cluster_down, cluster_env, cluster_up
from provision.errors import EXIT_FAILED, EXIT_INPUT
from provision.system.processes import stop_pidfile
from provision.system.secrets import read_secret_file
from provision.system.templates import CHECKOUT_TEMPLATES
from tests.conftest import LiveCluster
from tests.subnets import LIFECYCLE_SUBNET

TRANSPORT = ["--only", "tls-http", "--only", "gossip-encrypted"]
PEM_BODY = re.compile(r"-----BEGIN [A-Z ]+-----\n(.*?)\n-----END", re.S)
runner = CliRunner()


@dataclass
class Target:
    """A cluster to verify: its layout, a spec naming its workers, the environment to reach it."""

    layout: ClusterLayout
    spec_file: Path
    env: dict[str, str]

    def verify(self, *args: str) -> tuple[int, str]:
        result = runner.invoke(app, ["verify", "--spec", str(self.spec_file), *args], env=self.env)
        return result.exit_code, result.output

    def checks(self) -> dict[str, dict[str, Any]]:
        code, output = self.verify(*TRANSPORT, "--json")
        assert code in (0, EXIT_FAILED), output
        return {check["name"]: check for check in json.loads(output)["checks"]}


def _target(layout: ClusterLayout, folder: Path) -> Target:
    spec_file = folder / "locks.hcl"
    workers = "".join(
        f'worker "{agent.name}" {{\n  address = "{agent.http_address}"\n}}\n'
        for agent in layout.workers
    )
    names = ", ".join(f'"{agent.name}"' for agent in layout.workers)
    spec_file.write_text(f'{workers}job "tls" {{\n  prefix  = "tls/"\n  workers = [{names}]\n}}\n')
    env = dict(cluster_env(layout.state_dir).exports)  # the consul CLI's own variables
    env["CONSUL_HTTP_TOKEN"] = ""
    return Target(layout, spec_file, env)


def _secrets(layout: ClusterLayout) -> list[str]:
    found = [read_secret_file(layout.management_token_file).reveal()]
    if layout.tls:
        found.append(layout.gossip_key_file.read_text().strip())
        for path in layout.tls_dir.glob("*-key.pem"):
            body = PEM_BODY.search(path.read_text())
            assert body is not None
            found += [line for line in body.group(1).splitlines() if len(line) > 16]
    return found


@pytest.fixture(scope="class")
def plain(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Target]:
    folder = tmp_path_factory.mktemp("verify-plain")
    live: LiveCluster = request.getfixturevalue("live_cluster")
    if not live.layout.tls:
        yield _target(live.layout, folder)
        return
    state = folder / "state"  # the session cluster runs TLS: a plain one of our own
    up = cluster_up(state, ClusterShape(subnet=LIFECYCLE_SUBNET, workers=2, tls=False))
    try:
        yield _target(up.status.layout, folder)
    finally:
        cluster_down(state)


class TestPlainCluster:
    def test_both_checks_are_red_saying_what_to_turn_on(self, plain: Target) -> None:
        checks = plain.checks()
        assert checks["tls-http"]["status"] == "fail"
        agents = [f"{a.name}'s agent at {a.http_address}" for a in plain.layout.workers]
        agents.append(f"the management agent at {plain.layout.servers[0].http_address}")
        assert checks["tls-http"]["summary"] == (  # one remedy, said once for all
            f"{', '.join(agents)}: plain HTTP; serve HTTPS only (ports {{ http = -1, https = "
            "8501 }, ca_file, cert_file, key_file, verify_incoming = true) and give its https:// "
            "address"
        )
        assert checks["gossip-encrypted"]["status"] == "fail"
        workers = [f"{a.name}'s agent ({a.name}) at {a.http_address}" for a in plain.layout.workers]
        server = f"the management agent (server-1) at {plain.layout.servers[0].http_address}"
        assert checks["gossip-encrypted"]["summary"] == (
            f'{", ".join([*workers, server])}: gossip not encrypted; set encrypt = "<key from '
            "consul keygen>\" in every agent's config, the same key"
        )
        evidence = "\n".join(map(str, checks["gossip-encrypted"]["evidence"]))
        assert f"{workers[0]}: serf_lan.encrypted=false EncryptVerifyIncoming=True" in evidence
        assert f"{server}: serf_lan.encrypted=false serf_wan.encrypted=false" in evidence
        assert "server-2 (server, alive), server-3 (server, alive)\n" in evidence + "\n"

    def test_the_table_and_junit_say_failed(self, plain: Target, tmp_path: Path) -> None:
        junit = tmp_path / "verify.xml"
        code, output = plain.verify(*TRANSPORT, "--junit", str(junit))
        assert code == EXIT_FAILED, output
        assert "FAILED: tls-http, gossip-encrypted" in output
        assert "gossip-encrypted evidence:" in output  # failed checks show their evidence
        suite = ET.parse(junit).getroot()
        assert suite.get("failures") == "2"
        for secret in _secrets(plain.layout):
            assert secret not in output and secret not in junit.read_text()


@pytest.fixture(scope="class")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    folder = tmp_path_factory.mktemp("verify-tls")
    state = folder / "state"
    up = cluster_up(state, ClusterShape(subnet=LIFECYCLE_SUBNET, workers=2, tls=True))
    try:
        yield _target(up.status.layout, folder)
    finally:
        cluster_down(state)


class TestTlsCluster:
    def test_both_checks_are_green(self, tls: Target) -> None:
        checks = tls.checks()
        assert checks["tls-http"]["status"] == "pass", checks["tls-http"]
        assert checks["gossip-encrypted"]["status"] == "pass", checks["gossip-encrypted"]
        assert checks["tls-http"]["summary"] == (
            f"3 agents refuse plain HTTP; their certificates verify against "
            f"{tls.layout.ca_cert_file}; a client without a certificate is refused"
        )
        evidence = "\n".join(str(line) for line in checks["tls-http"]["evidence"])
        for agent in tls.layout.workers:
            where = f"{agent.name}'s agent at {agent.http_address}"
            assert f"{where}: plain HTTP -> 400 Client sent an HTTP request to an HTTPS" in evidence
            assert f"{where}: certificate client.dc1.consul [" in evidence
            assert f"IP Address:{agent.address}" in evidence
            assert f"{where}: TLS without a client certificate -> " in evidence
        gossip = "\n".join(str(line) for line in checks["gossip-encrypted"]["evidence"])
        assert "the management agent (server-1) at" in gossip
        assert "serf_lan.encrypted=true serf_wan.encrypted=true" in gossip
        assert "not asked (verify has no HTTP address for them): server-2 (server, alive), " in (
            gossip
        )
        assert str(checks["gossip-encrypted"]["summary"]).startswith(
            "gossip encrypted (LAN, and WAN on servers) on the 3 agents asked; 2 other members"
        )

    def test_the_table_shows_them_and_no_secret(self, tls: Target) -> None:
        code, output = tls.verify(*TRANSPORT, "--evidence")
        assert code == 0, output
        assert "all checks passed" in output
        for secret in _secrets(tls.layout):
            assert secret not in output

    def test_plain_http_to_the_https_port_says_use_https(self, tls: Target) -> None:
        server = tls.layout.servers[0].address
        env = {**tls.env, "CONSUL_HTTP_ADDR": f"http://{server}:8501"}
        result = runner.invoke(app, ["status", "--spec", str(tls.spec_file)], env=env)
        assert result.exit_code == EXIT_INPUT, result.output
        assert result.output.count("\n") == 1
        assert result.output.endswith(
            f"400 Client sent an HTTP request to an HTTPS server.: this address speaks HTTPS: "
            f"use https://{server}:8501\n"
        )

    def test_an_agent_without_verify_incoming_turns_tls_http_red(
        self, tls: Target, tmp_path: Path
    ) -> None:
        """worker-2 restarted from templates whose agents set verify_incoming = false."""
        templates = tmp_path / "templates"
        for source in CHECKOUT_TEMPLATES.rglob("*.j2"):
            target = templates / source.relative_to(CHECKOUT_TEMPLATES)
            target.parent.mkdir(parents=True, exist_ok=True)
            text = source.read_text()
            target.write_text(re.sub(r"(verify_incoming\s*=) true", r"\1 false", text))
        assert (
            "verify_incoming        = false" in (templates / "consul/encryption.hcl.j2").read_text()
        )
        layout = tls.layout
        worker = layout.workers[1]
        assert stop_pidfile(layout.pidfile(worker), str(layout.config_file(worker)))
        cluster_up(layout.state_dir, templates_dir=templates)  # starts worker-2 alone, re-rendered
        checks = tls.checks()
        assert checks["gossip-encrypted"]["status"] == "pass", checks["gossip-encrypted"]
        assert checks["tls-http"]["status"] == "fail"
        problems = str(checks["tls-http"]["summary"]).split("; set verify_incoming")
        assert problems[0] == (
            f"{worker.name}'s agent at {worker.http_address}: a client without a certificate got "
            "an answer (200)"
        )
        assert len(problems) == 2  # that agent alone
