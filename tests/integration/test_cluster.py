"""The local cluster: lifecycle, recovery, refusals and what it promises about ACLs and secrets."""

from __future__ import annotations

import os
import signal
import stat
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from provision.cli import app
from provision.cluster import tls
from provision.cluster.layout import load_layout
from provision.cluster.local import ClusterShape, cluster_down, cluster_status, cluster_up
from provision.consul import Consul
from provision.consul.errors import PermissionDenied
from provision.errors import EXIT_ENVIRONMENT, EXIT_FAILED
from provision.system.processes import is_running, read_pid
from tests.conftest import LiveCluster
from tests.integration.named_reads import policy_named, tokens_with_policy
from tests.subnets import LIFECYCLE_SUBNET, TEST_SUBNET

runner = CliRunner()


def test_up_gives_a_healthy_bootstrapped_six_agent_cluster(live_cluster: LiveCluster) -> None:
    status = live_cluster.status
    assert status.healthy
    assert [a.agent.name for a in status.agents] == [
        "server-1",
        "server-2",
        "server-3",
        "worker-1",
        "worker-2",
        "worker-3",
    ]
    assert status.leader.endswith(":8300")
    assert [a.agent.address for a in status.agents] == [
        f"{TEST_SUBNET}.{host}" for host in (11, 12, 13, 21, 22, 23)
    ]
    # Only the agents up made are looked at in the members list (the cluster is every test's).
    agents = ("server-1", "server-2", "server-3", "worker-1", "worker-2", "worker-3")
    members = live_cluster.management().agent.members()
    mine = sorted((m["Name"], m["Status"]) for m in members if m["Name"] in agents)
    assert mine == [(name, 1) for name in agents]


def test_management_token_file_is_private(live_cluster: LiveCluster) -> None:
    mode = stat.S_IMODE(live_cluster.layout.management_token_file.stat().st_mode)
    assert mode == 0o600


def test_acls_deny_by_default(live_cluster: LiveCluster) -> None:
    anonymous = live_cluster.client("worker-1", token=None)
    with pytest.raises(PermissionDenied):
        anonymous.session.create(name="no-token", ttl=10, lock_delay=0)
    with pytest.raises(PermissionDenied):
        anonymous.kv.put("locks/any/.lock", b"x")
    self_config = live_cluster.management("worker-1").agent.self()
    assert self_config["Config"]["NodeName"] == "worker-1"


def test_every_agent_has_a_minimal_agent_token(live_cluster: LiveCluster) -> None:
    management = live_cluster.management()
    for agent in live_cluster.layout.agents:
        policy = policy_named(management, f"agent-{agent.name}")
        assert policy is not None, agent.name
        rules = policy.rules or ""
        assert f'node "{agent.name}"' in rules
        assert "key" not in rules and "session" not in rules
        # one token carries the agent's policy, and nothing else
        owned = [t.policy_names for t in tokens_with_policy(management, policy.id)]
        assert owned == [(f"agent-{agent.name}",)], agent.name


def test_up_on_a_running_cluster_starts_nothing_and_prints_no_secret(
    live_cluster: LiveCluster, cluster_state_dir: Path
) -> None:
    result = runner.invoke(
        app, ["cluster", "up", "--state-dir", str(cluster_state_dir), "--subnet", TEST_SUBNET]
    )
    assert result.exit_code == 0, result.output
    assert "started: none" in result.output
    assert "bootstrapped before" in result.output
    assert live_cluster.management_token.reveal() not in result.output


def test_status_and_env_commands(live_cluster: LiveCluster, cluster_state_dir: Path) -> None:
    status = runner.invoke(app, ["cluster", "status", "--state-dir", str(cluster_state_dir)])
    assert status.exit_code == 0, status.output
    assert "healthy: yes" in status.output
    env = runner.invoke(app, ["cluster", "env", "--state-dir", str(cluster_state_dir)])
    assert env.exit_code == 0
    address = (
        f"https://{TEST_SUBNET}.11:8501"
        if live_cluster.layout.tls
        else f"http://{TEST_SUBNET}.11:8500"
    )
    assert f"export CONSUL_HTTP_ADDR={address}" in env.output
    assert f"export CONSUL_HTTP_TOKEN_FILE={cluster_state_dir.absolute()}" in env.output
    assert live_cluster.management_token.reveal() not in env.output + status.output


def test_refuses_a_folder_that_is_not_a_cluster(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    result = runner.invoke(app, ["cluster", "up", "--state-dir", str(tmp_path)])
    assert result.exit_code == EXIT_ENVIRONMENT
    assert "not a lockctl cluster folder" in result.output
    down = runner.invoke(app, ["cluster", "down", "--state-dir", str(tmp_path)])
    assert down.exit_code == EXIT_ENVIRONMENT
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_refuses_addresses_served_by_another_cluster(
    live_cluster: LiveCluster, tmp_path: Path
) -> None:
    result = runner.invoke(
        app, ["cluster", "up", "--state-dir", str(tmp_path / "other"), "--subnet", TEST_SUBNET]
    )
    assert result.exit_code == EXIT_ENVIRONMENT
    assert "already in use by a process this cluster did not start" in result.output
    assert not (tmp_path / "other").exists(), "a refused up must leave nothing behind"
    assert cluster_status(live_cluster.layout.state_dir).healthy


def test_status_of_a_missing_cluster_is_a_clear_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["cluster", "status", "--state-dir", str(tmp_path / "none")])
    assert result.exit_code == EXIT_ENVIRONMENT
    assert result.output.count("\n") == 1
    assert "no cluster in" in result.output


def test_lifecycle_up_crash_recover_down_up(tmp_path: Path) -> None:
    """up, kill -9 an agent, up recovers it, down stops every process, up again from scratch."""
    state_dir = tmp_path / "state"
    first = cluster_up(state_dir, ClusterShape(subnet=LIFECYCLE_SUBNET))
    try:
        assert first.bootstrapped and first.status.healthy
        layout = first.status.layout
        # A user's files in the state folder: `down` must delete only what lockctl made.
        (state_dir / "notes.txt").write_text("mine\n")
        (state_dir / "worker-1" / "my.log").write_text("mine too\n")
        worker = layout.workers[0]
        victim = read_pid(layout.pidfile(worker))
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        _wait(lambda: not is_running(victim, str(layout.config_file(worker))))
        assert cluster_status(state_dir).healthy is False

        recovered = cluster_up(state_dir, ClusterShape(subnet=LIFECYCLE_SUBNET))
        assert recovered.started == (worker.name,)
        assert not recovered.bootstrapped
        assert recovered.status.healthy
        token = layout.management_token_file.read_text().strip()
        worker_client = Consul(tls.consul_settings(layout, address=worker.http_address))
        assert worker_client.with_settings().status.leader()
        pids = [read_pid(layout.pidfile(agent)) for agent in layout.agents]
    finally:
        down = cluster_down(state_dir)
    assert len(down.stopped) == 5
    kept = sorted(str(p.relative_to(state_dir)) for p in state_dir.rglob("*"))
    assert kept == ["notes.txt", "worker-1", "worker-1/my.log"]
    assert down.kept == (state_dir / "notes.txt", state_dir / "worker-1" / "my.log")
    assert (state_dir / "notes.txt").read_text() == "mine\n"
    for agent, pid in zip(layout.agents, pids, strict=True):
        assert pid is not None and not is_running(pid, str(layout.config_file(agent)))
    (state_dir / "notes.txt").unlink()
    (state_dir / "worker-1" / "my.log").unlink()
    (state_dir / "worker-1").rmdir()

    again = cluster_up(state_dir, ClusterShape(subnet=LIFECYCLE_SUBNET))
    try:
        assert again.bootstrapped and again.status.healthy
        assert layout.management_token_file.read_text().strip() != token
    finally:
        cluster_down(state_dir)
    assert load_layout(state_dir) is None


def test_status_exit_code_when_unhealthy(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    # the plain-HTTP cluster, too
    cluster_up(state_dir, ClusterShape(subnet=LIFECYCLE_SUBNET, tls=False))
    try:
        layout = cluster_status(state_dir).layout
        for agent in layout.workers:
            pid = read_pid(layout.pidfile(agent))
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            _wait(lambda pid=pid, agent=agent: not is_running(pid, str(layout.config_file(agent))))
        result = runner.invoke(app, ["cluster", "status", "--state-dir", str(state_dir)])
        assert result.exit_code == EXIT_FAILED
        assert "stopped" in result.output
    finally:
        cluster_down(state_dir)


def _wait(condition: object, timeout: float = 10.0) -> None:
    assert callable(condition)
    give_up_at = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < give_up_at, "condition not met in time"
        time.sleep(0.05)
