"""The namespace mode of the local cluster: layout, refusals, and a full up/down that leaves
nothing behind (root for the last two)."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from provision.cli import app
from provision.cluster import netns as ns
from provision.cluster.consul_binary import find_consul
from provision.cluster.layout import default_layout, load_layout, save_layout
from provision.cluster.local import ClusterShape, cluster_down, cluster_status, cluster_up
from provision.errors import EXIT_ENVIRONMENT, InputError
from provision.system.processes import is_running, read_pid

pytestmark = pytest.mark.faults
runner = CliRunner()


def test_namespaced_layout_gives_each_agent_its_namespace(tmp_path: Path) -> None:
    layout = default_layout(tmp_path, "10.77.0", 3, netns=True)
    prefix = ns.netns_prefix(tmp_path)
    assert layout.netns_prefix == prefix
    assert layout.driver_netns == f"{prefix}-driver"
    assert [(a.name, a.address, a.netns) for a in layout.agents] == [
        (name, f"10.77.0.{host}", f"{prefix}-{name}")
        for name, host in (
            ("server-1", 11),
            ("server-2", 12),
            ("server-3", 13),
            ("worker-1", 21),
            ("worker-2", 22),
            ("worker-3", 23),
        )
    ]
    assert all(len(layout.host(a).veth) <= 15 for a in layout.agents)  # IFNAMSIZ
    tmp_path.mkdir(exist_ok=True)
    save_layout(layout)
    assert load_layout(tmp_path) == layout


def test_loopback_layout_is_unchanged(tmp_path: Path) -> None:
    layout = default_layout(tmp_path, "127.0.12", 2)
    assert layout.netns_prefix is None and layout.driver_netns is None
    assert all(a.netns is None for a in layout.agents)


@pytest.mark.parametrize(
    ("subnet", "netns"), [("127.0.12", True), ("8.8.8", True), ("10.77.0", False)]
)
def test_subnet_must_fit_the_mode(tmp_path: Path, subnet: str, netns: bool) -> None:
    with pytest.raises(InputError):
        default_layout(tmp_path, subnet, 2, netns=netns)


def test_netns_without_root_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    result = runner.invoke(app, ["cluster", "up", "--netns", "--state-dir", str(tmp_path / "s")])
    assert result.exit_code == EXIT_ENVIRONMENT
    assert "--netns needs root" in result.output
    assert result.output.count("\n") == 1
    assert not (tmp_path / "s").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_up_and_down_leave_nothing_behind(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    up = cluster_up(state_dir, ClusterShape(workers=1, netns=True))
    try:
        layout = up.status.layout
        assert up.status.healthy and layout.netns_prefix is not None
        created = set(ns.recorded_namespaces(state_dir))
        assert created == {a.netns for a in layout.agents} | {
            f"{layout.netns_prefix}-bridge",
            f"{layout.netns_prefix}-driver",
        }
        assert created <= set(os.listdir(ns.NETNS_RUN_DIR))
        root_addresses = subprocess.run(
            ["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True
        ).stdout
        assert "10.77.0." not in root_addresses, "addresses must exist only in the namespaces"
        agent = layout.workers[0]
        pid = read_pid(layout.pidfile(agent))
        assert pid is not None and is_running(pid, str(layout.config_file(agent)))
        # the pidfile holds consul's PID (ip netns exec execs), inside the agent's namespace
        assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
        assert "consul" in Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[0]
        _env_works_from_the_driver_namespace(state_dir, ns.driver_netns(layout.netns_prefix))
        again = cluster_up(state_dir)  # recovery keeps it a namespace cluster
        assert again.started == () and again.status.healthy
        assert cluster_status(state_dir).layout.netns_prefix == layout.netns_prefix
    finally:
        cluster_down(state_dir)
    after = set(os.listdir(ns.NETNS_RUN_DIR)) if ns.NETNS_RUN_DIR.exists() else set()
    assert not [name for name in after if name.startswith(f"{layout.netns_prefix}-")]
    assert not state_dir.exists()
    assert not is_running(pid, str(layout.config_file(agent)))


def _env_works_from_the_driver_namespace(state_dir: Path, driver: str) -> None:
    """`cluster env` says where its addresses answer, and they do answer there."""
    printed = runner.invoke(app, ["cluster", "env", "--state-dir", str(state_dir)])
    assert printed.exit_code == 0, printed.output
    first, *rest = printed.output.splitlines()
    assert first.startswith("# namespace mode:") and f"ip netns exec {driver} " in first
    assignments = [shlex.split(line)[1] for line in rest if line.startswith("export ")]
    exports = dict(assignment.split("=", 1) for assignment in assignments)
    consul = find_consul()
    assert consul is not None
    members = subprocess.run(
        ["ip", "netns", "exec", driver, str(consul.path), "members"],
        env={**os.environ, **exports, "CONSUL_HTTP_TOKEN": ""},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert members.returncode == 0, members.stderr
    assert "server-1" in members.stdout and "alive" in members.stdout
