"""A federation's datacenters without a cluster: where each runs, what its agents' configs say
(primary, WAN join, a secondary's replication token), what `up` refuses, and what `down` leaves.
The running federation: tests/federation/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import hcl2
import pytest
from typer.testing import CliRunner

from provision.cli.app import app
from provision.cluster import federation
from provision.cluster.agent_config import ConfigDialect, render_agent_config
from provision.cluster.federation import (
    FEDERATION_FILE,
    datacenter_layouts,
    federation_down,
    federation_up,
    is_federation,
)
from provision.cluster.layout import AgentSpec, ClusterLayout, load_layout, save_layout
from provision.cluster.local import ClusterShape
from provision.errors import InputError, LocalEnvironmentError
from provision.system.secrets import Secret, write_secret_file
from provision.system.templates import CHECKOUT_TEMPLATES, make_environment

# Test data, not a secret: the shape of a token's secret
FAKE_REPLICATION_TOKEN = Secret("00000000-0000-4000-8000-000000000000")
TWO = ClusterShape(subnet="127.0.30", workers=1, servers=1, datacenters=2, tls=False)


def _render(layout: ClusterLayout, agent: AgentSpec) -> dict[str, Any]:
    text = render_agent_config(
        make_environment(CHECKOUT_TEMPLATES),
        layout,
        agent,
        ConfigDialect.of("1.8.7"),
        gossip_key=None,
        log_level="info",
        replication_token=FAKE_REPLICATION_TOKEN,
    )
    config = _unquoted(hcl2.loads(text))
    assert isinstance(config, dict)
    return config


def _unquoted(value: object) -> object:
    """python-hcl2 keeps a string's quotes: without them, everywhere."""
    if isinstance(value, str):
        return value.strip('"')
    if isinstance(value, list):
        return [_unquoted(item) for item in value]
    if isinstance(value, dict):
        return {key: _unquoted(item) for key, item in value.items()}
    return value


def test_each_datacenter_has_its_folder_its_subnet_and_its_own_node_names(tmp_path: Path) -> None:
    dc1, dc2 = datacenter_layouts(tmp_path, TWO)
    assert (dc1.datacenter, dc2.datacenter) == ("dc1", "dc2")
    assert (dc1.state_dir, dc2.state_dir) == (tmp_path / "dc1", tmp_path / "dc2")
    assert [(a.name, a.address) for a in dc1.agents] == [
        ("server-1", "127.0.30.11"),
        ("worker-1", "127.0.30.21"),
    ]
    assert [(a.name, a.address) for a in dc2.agents] == [
        ("dc2-server-1", "127.0.31.11"),
        ("dc2-worker-1", "127.0.31.21"),
    ]
    assert not dc1.secondary and dc2.secondary
    assert dc1.primary_datacenter == dc2.primary_datacenter == "dc1"
    assert (dc1.wan_join, dc2.wan_join) == ((), ("127.0.30.11",))
    three = datacenter_layouts(tmp_path, ClusterShape(subnet="127.0.30", datacenters=2))
    assert [len(layout.servers) for layout in three] == [3, 3]  # the default size


def test_a_secondarys_servers_join_the_primary_over_the_wan_and_replicate(tmp_path: Path) -> None:
    dc1, dc2 = datacenter_layouts(tmp_path, TWO)
    server = _render(dc2, dc2.servers[0])
    assert server["primary_datacenter"] == "dc1" and server["datacenter"] == "dc2"
    assert server["retry_join_wan"] == ["127.0.30.11"]
    assert server["retry_interval_wan"] == "1s"
    [acl] = server["acl"]  # python-hcl2: a block is a list of its bodies
    assert acl["enable_token_replication"] is True
    assert acl["tokens"][0]["replication"] == FAKE_REPLICATION_TOKEN.reveal()
    # the token stays off every agent that does not replicate
    for layout, agent in ((dc2, dc2.workers[0]), (dc1, dc1.servers[0]), (dc1, dc1.workers[0])):
        config = _render(layout, agent)
        assert config["primary_datacenter"] == "dc1"
        assert "tokens" not in str(config) and FAKE_REPLICATION_TOKEN.reveal() not in str(config)
        assert "retry_join_wan" not in config


def test_a_federations_record_keeps_the_primary_and_the_wan_join(tmp_path: Path) -> None:
    _, dc2 = datacenter_layouts(tmp_path, TWO)
    dc2.state_dir.mkdir()
    save_layout(dc2)
    assert load_layout(dc2.state_dir) == dc2


@pytest.mark.parametrize(
    ("shape", "refusal"),
    [
        (ClusterShape(datacenters=5), r"--datacenters 5: must be 1\.\.4"),
        (ClusterShape(datacenters=2, netns=True), r"--netns: a federation runs on loopback"),
        (ClusterShape(subnet="127.0.255", datacenters=2), r"--subnet 127\.0\.255: 2 datacenters"),
        (ClusterShape(subnet="127.0.30", datacenters=2, servers=2), r"--servers 2: must be 1 or 3"),
    ],
)
def test_a_shape_a_federation_cannot_take_is_refused_in_one_line(
    tmp_path: Path, shape: ClusterShape, refusal: str
) -> None:
    with pytest.raises(InputError, match=refusal):
        datacenter_layouts(tmp_path, shape)


def test_up_refuses_a_folder_that_holds_something_else(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(LocalEnvironmentError, match="not a federation's folder"):
        federation_up(tmp_path, TWO)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def _recorded_federation(state: Path) -> tuple[ClusterLayout, ...]:
    """What `up` records, without an agent: the federation's and each datacenter's files."""
    layouts = datacenter_layouts(state, TWO)
    state.mkdir()
    (state / FEDERATION_FILE).write_text('{"datacenters": ["dc1", "dc2"]}\n')
    for layout in layouts:
        layout.state_dir.mkdir()
        save_layout(layout)
        write_secret_file(layout.management_token_file, FAKE_REPLICATION_TOKEN)
    write_secret_file(layouts[1].replication_token_file, FAKE_REPLICATION_TOKEN)
    return layouts


def test_env_points_at_the_primary_and_names_the_others(tmp_path: Path) -> None:
    state = tmp_path / "state"
    _recorded_federation(state)
    shown = CliRunner().invoke(app, ["cluster", "env", "--state-dir", str(state)])
    assert shown.exit_code == 0, shown.output
    assert "export CONSUL_HTTP_ADDR=http://127.0.30.11:8500" in shown.output
    assert f"CONSUL_HTTP_TOKEN_FILE={state / 'dc1' / 'management.token'}" in shown.output
    assert "# datacenter dc2: --address http://127.0.31.11:8500" in shown.output
    assert FAKE_REPLICATION_TOKEN.reveal() not in shown.output


def test_down_removes_what_a_stopped_federation_left_and_nothing_else(tmp_path: Path) -> None:
    state = tmp_path / "state"
    _recorded_federation(state)
    assert is_federation(state)
    result = federation_down(state)
    assert result.stopped == () and result.kept == ()
    assert not state.exists()


def test_a_failed_up_stops_what_it_started_in_every_datacenter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dc2 fails to come up: dc1's agents, started by the same call, are stopped again (dc2's
    own bring-up stops its own), so a failed fixture leaves no agent behind."""
    stopped: list[tuple[str, list[str]]] = []

    def bring_up(layout: ClusterLayout, *_: object) -> tuple[tuple[str, ...], bool]:
        if layout.secondary:
            raise LocalEnvironmentError("cluster up failed: dc2 had no leader in time")
        return tuple(agent.name for agent in layout.agents), True

    def stop(layout: ClusterLayout, agents: list[AgentSpec]) -> tuple[str, ...]:
        stopped.append((layout.datacenter, [agent.name for agent in agents]))
        return ()

    monkeypatch.setattr(federation, "install_consul", lambda: None)
    monkeypatch.setattr(federation, "bring_up", bring_up)
    monkeypatch.setattr(federation, "_prepare_secondary", lambda primary, layout: None)
    monkeypatch.setattr(federation, "stop_agents", stop)
    with pytest.raises(LocalEnvironmentError, match="dc2 had no leader"):
        federation_up(tmp_path / "state", TWO)
    assert stopped == [("dc1", ["server-1", "worker-1"])]
