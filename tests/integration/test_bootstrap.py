"""`lockctl bootstrap` on a fresh, never-bootstrapped server and on the (bootstrapped) live cluster.

The fresh cluster is one server started from lockctl's own templates on a spare address of the
test subnet (.41, .42: the live cluster uses .11-.13 and .21-.22), without bootstrapping.
"""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from provision.cli import acl
from provision.cli.app import ErrorBoundaryGroup
from provision.consul import Consul, ConsulSettings
from provision.errors import EXIT_INPUT
from provision.system.secrets import read_secret_file
from tests.conftest import LiveCluster
from tests.integration.private_consul import FreshServer

runner = CliRunner()


def _app() -> typer.Typer:
    app = typer.Typer(cls=ErrorBoundaryGroup, pretty_exceptions_enable=False)
    app.command("bootstrap")(acl.bootstrap)
    app.command("plan")(acl.plan)  # two commands: a group, so the name is an argument
    return app


@pytest.fixture
def fresh_server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[FreshServer]:
    server = FreshServer(tmp_path / "fresh", request.param)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("fresh_server", [41], indirect=True)
def test_bootstrap_a_fresh_cluster_then_again(fresh_server: FreshServer, tmp_path: Path) -> None:
    token_file = tmp_path / "out" / "management.token"
    agent = f"{fresh_server.agent.name}={fresh_server.address}"
    args = ["bootstrap", "--management-token-file", str(token_file), "--address"]
    result = runner.invoke(_app(), [*args, fresh_server.address, "--agent", agent])
    assert result.exit_code == 0, result.output
    assert "ACLs bootstrapped" in result.stdout
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    secret = read_secret_file(token_file)
    assert secret.reveal() not in result.output
    management = Consul(ConsulSettings(address=fresh_server.address, token=secret))
    before = (
        sorted(p.name for p in management.acl.list_policies()),
        sorted(t.accessor_id for t in management.acl.list_tokens()),
    )
    assert f"agent-{fresh_server.agent.name}" in before[0]
    again = runner.invoke(_app(), [*args, fresh_server.address])
    assert again.exit_code == 0, again.output
    assert "already bootstrapped: nothing changed" in again.stdout
    other_file = tmp_path / "other.token"
    third = runner.invoke(
        _app(), ["bootstrap", "--management-token-file", str(other_file), "--address",
                 fresh_server.address],
    )  # fmt: skip
    assert third.exit_code == 0 and "nothing changed" in third.stdout
    assert not other_file.exists()
    after = (
        sorted(p.name for p in management.acl.list_policies()),
        sorted(t.accessor_id for t in management.acl.list_tokens()),
    )
    assert after == before
    assert read_secret_file(token_file).reveal() == secret.reveal()


@pytest.mark.parametrize("fresh_server", [42], indirect=True)
def test_show_secret_is_the_only_way_to_print_it(fresh_server: FreshServer, tmp_path: Path) -> None:
    token_file = tmp_path / "management.token"
    result = runner.invoke(
        _app(),
        ["bootstrap", "--management-token-file", str(token_file), "--address",
         fresh_server.address, "--json", "--show-secret"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["secret_id"] == read_secret_file(token_file).reveal()
    assert record["bootstrapped"] is True


def test_bootstrapped_cluster_is_left_alone(live_cluster: LiveCluster, tmp_path: Path) -> None:
    token_file = tmp_path / "new.token"
    args = ["bootstrap", "--management-token-file", str(token_file)]
    result = runner.invoke(_app(), [*args, "--address", live_cluster.address("server-1")])
    assert result.exit_code == 0, result.output
    assert "already bootstrapped: nothing changed" in result.stdout
    assert not token_file.exists()


def test_existing_file_the_cluster_does_not_accept_is_not_replaced(
    live_cluster: LiveCluster, tmp_path: Path
) -> None:
    token_file = tmp_path / "stale.token"
    token_file.write_text("00000000-0000-0000-0000-000000000000\n")
    args = ["bootstrap", "--management-token-file", str(token_file)]
    result = runner.invoke(_app(), [*args, "--address", live_cluster.address("server-1")])
    assert result.exit_code == EXIT_INPUT
    assert "refusing to replace" in result.stderr
    assert token_file.read_text() == "00000000-0000-0000-0000-000000000000\n"


def test_existing_accepted_file_means_bootstrapped(live_cluster: LiveCluster) -> None:
    token_file = live_cluster.layout.management_token_file
    before = token_file.read_text()
    args = ["bootstrap", "--management-token-file", str(token_file)]
    result = runner.invoke(_app(), [*args, "--address", live_cluster.address("server-2")])
    assert result.exit_code == 0, result.output
    assert "nothing changed" in result.stdout
    assert live_cluster.management_token.reveal() not in result.output
    assert token_file.read_text() == before
