"""plan / apply / rotate against the real cluster: idempotence, least privilege, prune scope,
secrets never printed, failures, SIGKILL at random points, and a leader kill mid-apply."""

from __future__ import annotations

import json
import os
import random
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from provision.acl.agent_tokens import agent_policy_name
from provision.cli import acl
from provision.cli.app import ErrorBoundaryGroup
from provision.cluster.consul_binary import install_consul
from provision.cluster.layout import AgentSpec
from provision.consul import Consul
from provision.consul.errors import ConsulError, PermissionDenied
from provision.errors import EXIT_DENIED, EXIT_INPUT, EXIT_UNAVAILABLE
from provision.spec.names import (
    MANAGED_MARKER,
    lock_policy_name,
    session_policy_name,
    token_description,
)
from provision.system.processes import read_pid, spawn
from provision.system.secrets import read_secret_file
from tests.conftest import TEST_SUBNET, LiveCluster
from tests.integration.named_reads import policy_named, serf_health, tokens_with_policy

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
APP_SOURCE = (
    "from provision.cli.app import app\n"
    "from provision.cli import acl\n"
    "app.command('apply')(acl.apply)\n"
    "app(prog_name='lockctl')\n"
)


def _app() -> typer.Typer:
    app = typer.Typer(cls=ErrorBoundaryGroup, pretty_exceptions_enable=False)
    for name in ("bootstrap", "plan", "apply", "rotate"):
        app.command(name)(getattr(acl, name))
    return app


def spec_text(jobs: dict[str, list[str]], workers: list[str]) -> str:
    lines = [f'worker "{w}" {{}}' for w in workers]
    for job, runs_on in jobs.items():
        quoted = ", ".join(f'"{w}"' for w in runs_on)
        lines.append(f'job "{job}" {{\n  prefix = "locks/{job}/"\n  workers = [{quoted}]\n}}')
    return "\n".join(lines) + "\n"


class Env:
    """A spec file, a secrets folder and the flags to point lockctl at the test cluster."""

    def __init__(self, tmp_path: Path, cluster: LiveCluster, agent: str = "server-1") -> None:
        self.tmp = tmp_path
        self.cluster = cluster
        self.spec = tmp_path / "locks.hcl"
        self.secrets = tmp_path / "secrets"
        self.agent = agent  # the agent lockctl talks to: its sessions are made on its node
        self.address = cluster.address(agent)

    def write_spec(self, jobs: dict[str, list[str]], workers: list[str]) -> None:
        self.spec.write_text(spec_text(jobs, workers), encoding="utf-8")

    def flags(self, token: bool = True) -> list[str]:
        out = ["--spec", str(self.spec), "--secrets-dir", str(self.secrets)]
        out += ["--address", self.address]
        if token:
            out += ["--token-file", str(self.cluster.layout.management_token_file)]
        return out

    def run(self, command: str, *extra: str, token: bool = True) -> object:
        result = runner.invoke(_app(), [command, *self.flags(token), *extra])
        for secret in self.all_secrets():
            assert secret not in result.output, "a token secret was printed"
        return result

    def all_secrets(self) -> list[str]:
        found = [self.cluster.management_token.reveal()]
        if self.secrets.is_dir():  # a test may have put anything there, even a non-secret
            files = [p for p in self.secrets.glob("*.token") if p.is_file()]
            found += [p.read_text(errors="replace").strip() for p in files]
        return [secret for secret in found if len(secret) >= 8]


@pytest.fixture
def env(tmp_path: Path, live_cluster: LiveCluster, monkeypatch: pytest.MonkeyPatch) -> Env:
    for name in ("CONSUL_HTTP_TOKEN", "CONSUL_HTTP_TOKEN_FILE", "CONSUL_HTTP_ADDR"):
        monkeypatch.delenv(name, raising=False)
    return Env(tmp_path, live_cluster)


def _tokens_for(consul: Consul, worker: str) -> list[str]:
    """The accessors of `worker`'s tokens: every token apply or rotate mints for it carries its
    session policy, so they are read by that link, not picked from the list of every token."""
    session_policy = policy_named(consul, session_policy_name(worker))
    if session_policy is None:
        return []
    return [
        t.accessor_id
        for t in tokens_with_policy(consul, session_policy.id)
        if t.description == token_description(worker)
    ]


def _existing(consul: Consul, names: Iterable[str]) -> dict[str, str]:
    """Which of `names` are policies in Consul (name -> ID), each read by its name."""
    found = {name: policy_named(consul, name) for name in names}
    return {name: policy.id for name, policy in found.items() if policy is not None}


def test_apply_twice_creates_nothing_the_second_time(env: Env) -> None:
    env.write_spec(
        {"idem-a": ["worker-1"], "idem-b": ["worker-1", "worker-2"]}, ["worker-1", "worker-2"]
    )
    first = env.run("apply", "--json")
    assert first.exit_code == 0, first.output
    record = json.loads(first.stdout)
    assert record["applied"] >= 2  # at least the two job policies
    mgmt = env.cluster.management()
    for worker in ("worker-1", "worker-2"):
        path = env.secrets / f"{worker}.token"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        (accessor,) = _tokens_for(mgmt, worker)
        secret = mgmt.acl.read_token(accessor).secret
        assert secret is not None and read_secret_file(path).reveal() == secret.reveal()
    second = env.run("apply", "--json")
    assert second.exit_code == 0, second.output
    again = json.loads(second.stdout)
    assert again["changes_pending"] is False
    assert again["applied"] == 0
    # the two list calls, and one check per worker that its file holds its live token
    assert again["requests"] == 2 + 2
    assert len(_tokens_for(mgmt, "worker-1")) == 1


def test_plan_exit_codes_and_json(env: Env) -> None:
    env.write_spec({"plan-a": ["worker-1"]}, ["worker-1"])
    env.run("apply")  # whatever state earlier tests left for worker-1
    env.write_spec({"plan-a": ["worker-1"], "plan-b": ["worker-1"]}, ["worker-1"])
    pending = env.run("plan")
    assert pending.exit_code == 2, pending.output
    assert "policy lock-plan-b: create (new)" in pending.stdout
    assert "+lock-plan-b" in pending.stdout
    assert pending.stderr == "" or "no longer in the spec" in pending.stderr
    as_json = env.run("plan", "--json", "--no-detailed-exitcode")
    assert as_json.exit_code == 0
    assert json.loads(as_json.stdout)["changes_pending"] is True
    assert env.run("apply").exit_code == 0
    clean = env.run("plan")
    assert clean.exit_code == 0, clean.output
    assert "No changes" in clean.stdout


def test_worker_tokens_are_least_privilege(env: Env) -> None:
    """worker-1's token acquires its own job's lock; 403 on another job's prefix and on a
    session on worker-2's node."""
    env.write_spec({"lp-mine": ["worker-1"], "lp-other": ["worker-2"]}, ["worker-1", "worker-2"])
    assert env.run("apply").exit_code == 0
    token = read_secret_file(env.secrets / "worker-1.token")
    own_agent = env.cluster.client("worker-1", token)
    session = own_agent.session.create(name="lp", ttl=10, lock_delay=0)
    try:
        assert own_agent.kv.put("locks/lp-mine/.lock", b"x", acquire=session) is True
        with pytest.raises(PermissionDenied):
            own_agent.kv.put("locks/lp-other/.lock", b"x", acquire=session)
        with pytest.raises(PermissionDenied):
            own_agent.kv.put("locks/lp-mine-x", b"x")  # one character outside the prefix
        other_agent = own_agent.with_settings(address=env.cluster.address("worker-2"))
        with pytest.raises(PermissionDenied):
            other_agent.session.create(name="lp", ttl=10, lock_delay=0)
    finally:
        own_agent.kv.put("locks/lp-mine/.lock", b"", release=session)
        own_agent.session.destroy(session)


def test_existing_policy_is_adopted_by_name(env: Env) -> None:
    mgmt = env.cluster.management()
    made = mgmt.acl.create_policy("lock-adopt-me", 'key "x" { policy = "read" }', "made by hand")
    env.write_spec({"adopt-me": ["worker-1"]}, ["worker-1"])
    result = env.run("apply")
    assert result.exit_code == 0, result.output
    assert "policy lock-adopt-me: updated (rules differ; adopt" in result.stdout
    after = mgmt.acl.read_policy(made.id)
    assert after.rules is not None and 'key_prefix "locks/adopt-me/"' in after.rules
    assert after.description.startswith("lockctl-managed")
    adopted = policy_named(mgmt, "lock-adopt-me")  # the one made by hand, not a second one
    assert adopted is not None and adopted.id == made.id


def test_prune_deletes_only_what_lockctl_manages(env: Env) -> None:
    mgmt = env.cluster.management()
    uid = uuid.uuid4().hex[:8]
    # Bystanders of this test's own: a lock- policy and a token made by hand (unmarked), and a
    # policy marked as lockctl's but neither a lock nor a session policy, as the cluster's agent
    # policies are.
    hand_rules = 'key_prefix "h/" { policy = "read" }'
    hand = mgmt.acl.create_policy(f"lock-hand-made-{uid}", hand_rules, "ops")
    hand_token = mgmt.acl.create_token(f"ops token {uid}", [hand.name])
    node = f"prune-{uid}"
    agent = mgmt.acl.create_policy(
        agent_policy_name(node),
        f'node "{node}" {{ policy = "write" }}',
        f"{MANAGED_MARKER}: agent token for node {node}",
    )
    names = ["lock-prune-a", "lock-prune-b", hand.name, agent.name]
    try:
        env.write_spec({"prune-a": ["worker-1"], "prune-b": ["worker-1"]}, ["worker-1"])
        assert env.run("apply").exit_code == 0
        env.write_spec({"prune-a": ["worker-1"]}, ["worker-1"])
        kept = env.run("apply")
        assert kept.exit_code == 0
        assert "lock-prune-b" in _existing(mgmt, names)
        assert "policy lock-prune-b" in kept.stderr  # named as stale, kept without --prune
        pruned = env.run("apply", "--prune")
        assert pruned.exit_code == 0, pruned.output
        left = _existing(mgmt, names)
        assert "lock-prune-b" not in left
        assert "lock-prune-a" in left
        assert left[hand.name] == hand.id
        assert mgmt.acl.read_token(hand_token.accessor_id).accessor_id == hand_token.accessor_id
        assert left[agent.name] == agent.id  # as the cluster's agent policies stay
    finally:
        mgmt.acl.delete_token(hand_token.accessor_id)
        for policy in (hand, agent):
            mgmt.acl.delete_policy(policy.id)


def test_rotate_revokes_the_old_token_only_after_the_new_one_works(env: Env) -> None:
    env.write_spec({"rot": ["worker-1"]}, ["worker-1"])
    assert env.run("apply").exit_code == 0
    path = env.secrets / "worker-1.token"
    old_secret = read_secret_file(path)
    mgmt = env.cluster.management()
    (old_accessor,) = _tokens_for(mgmt, "worker-1")
    result = runner.invoke(
        _app(),
        ["rotate", "--worker", "worker-1", "--spec", str(env.spec), "--secrets-dir",
         str(env.secrets), "--address", env.address, "--token-file",
         str(env.cluster.layout.management_token_file)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    new_secret = read_secret_file(path)
    assert new_secret.reveal() != old_secret.reveal()
    for secret in (old_secret, new_secret):
        assert secret.reveal() not in result.output
    (new_accessor,) = _tokens_for(mgmt, "worker-1")
    assert new_accessor != old_accessor
    assert f"revoked {old_accessor}" in result.stdout
    with pytest.raises(PermissionDenied):
        env.cluster.client(token=old_secret).acl.read_self_token()
    assert env.cluster.client(token=new_secret).acl.read_self_token().accessor_id == new_accessor
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert env.run("plan").exit_code == 0  # the rotated token still matches the spec


def test_duplicate_token_from_an_interrupted_rotate_converges(env: Env) -> None:
    env.write_spec({"dup": ["worker-1"]}, ["worker-1"])
    assert env.run("apply").exit_code == 0
    mgmt = env.cluster.management()
    (kept,) = _tokens_for(mgmt, "worker-1")
    policies = list(mgmt.acl.read_token(kept).policy_names)
    extra = mgmt.acl.create_token(token_description("worker-1"), policies)  # minted, never written
    plan = env.run("plan", "--json")
    assert plan.exit_code == 2
    assert json.loads(plan.stdout)["tokens"][0]["accessor_id"] == extra.accessor_id
    assert env.run("apply").exit_code == 0
    assert _tokens_for(mgmt, "worker-1") == [kept]  # the one the file holds


def test_missing_token_file_is_fetched_not_reminted(env: Env) -> None:
    env.write_spec({"refetch": ["worker-1"]}, ["worker-1"])
    assert env.run("apply").exit_code == 0
    mgmt = env.cluster.management()
    before = _tokens_for(mgmt, "worker-1")
    secret = read_secret_file(env.secrets / "worker-1.token")
    (env.secrets / "worker-1.token").unlink()
    assert env.run("apply").exit_code == 0
    assert _tokens_for(mgmt, "worker-1") == before
    assert read_secret_file(env.secrets / "worker-1.token").reveal() == secret.reveal()


# --- failures -------------------------------------------------------------------------------


def test_no_token_is_a_permission_error_naming_the_permission(env: Env) -> None:
    env.write_spec({"denied": ["worker-1"]}, ["worker-1"])
    result = env.run("apply", token=False)
    assert result.exit_code == EXIT_DENIED
    assert result.stderr.count("\n") == 1
    assert "403" in result.stderr and 'acl = "read"' in result.stderr
    assert policy_named(env.cluster.management(), "lock-denied") is None


def test_token_without_acl_write_is_refused_and_changes_nothing(env: Env) -> None:
    mgmt = env.cluster.management()
    reader = mgmt.acl.create_policy("acl-reader-test", 'acl = "read"', "test")
    token = mgmt.acl.create_token("acl reader (test)", ["acl-reader-test"])
    assert token.secret is not None
    token_file = env.tmp / "reader.token"
    token_file.write_text(token.secret.reveal(), encoding="utf-8")
    env.write_spec({"readonly": ["worker-1"]}, ["worker-1"])
    args = ["--spec", str(env.spec), "--secrets-dir", str(env.secrets), "--address", env.address]
    result = runner.invoke(_app(), ["apply", *args, "--token-file", str(token_file)])
    assert result.exit_code == EXIT_DENIED, result.output
    assert 'acl = "write"' in result.stderr
    assert token.secret.reveal() not in result.output
    assert policy_named(mgmt, "lock-readonly") is None
    mgmt.acl.delete_token(token.accessor_id)
    mgmt.acl.delete_policy(reader.id)


def test_consul_unreachable_is_a_clear_error(env: Env) -> None:
    env.write_spec({"unreach": ["worker-1"]}, ["worker-1"])
    env.address = f"http://{TEST_SUBNET}.99:8500"
    result = env.run("apply", "--timeout", "1")
    assert result.exit_code == EXIT_UNAVAILABLE, result.output
    assert "cannot connect" in result.stderr
    assert result.stderr.count("\n") == 1


def test_invalid_spec_changes_nothing(env: Env) -> None:
    """Nothing the spec names is made or changed: its job's and workers' policies, their tokens."""
    mgmt = env.cluster.management()
    job = f"bad-{uuid.uuid4().hex[:8]}"
    workers = ["worker-1", "nobody"]
    names = [lock_policy_name(job), *(session_policy_name(w) for w in workers)]

    def state() -> tuple[dict[str, int], list[list[str]]]:
        found = {name: policy_named(mgmt, name) for name in names}
        policies = {name: p.modify_index for name, p in found.items() if p is not None}
        return policies, [_tokens_for(mgmt, w) for w in workers]

    before = state()
    assert lock_policy_name(job) not in before[0]
    env.spec.write_text(
        f'worker "worker-1" {{}}\njob "{job}" {{\n  prefix = ""\n  workers = ["nobody"]\n}}\n'
    )
    result = env.run("apply")
    assert result.exit_code == EXIT_INPUT
    assert "locks.hcl:" in result.stderr
    assert state() == before
    assert not env.secrets.exists()


def test_unwritable_secrets_dir_is_refused_before_any_change(env: Env) -> None:
    env.write_spec({"nodir": ["worker-1"]}, ["worker-1"])
    blocker = env.tmp / "file"
    blocker.write_text("x")
    result = runner.invoke(_app(), ["apply", *env.flags(), "--secrets-dir", str(blocker / "s")])
    assert result.exit_code == 6, result.output
    assert policy_named(env.cluster.management(), "lock-nodir") is None


# --- kills ----------------------------------------------------------------------------------


def _reset(mgmt: Consul, jobs: list[str], workers: list[str]) -> None:
    for worker in workers:
        for accessor in _tokens_for(mgmt, worker):
            mgmt.acl.delete_token(accessor)
    names = [f"lock-{j}" for j in jobs] + [f"session-{w}" for w in workers]
    for policy_id in _existing(mgmt, names).values():
        mgmt.acl.delete_policy(policy_id)


def _assert_converged(mgmt: Consul, env: Env, jobs: list[str], workers: list[str]) -> None:
    names = _existing(mgmt, [f"lock-{j}" for j in jobs])
    assert all(f"lock-{j}" in names for j in jobs)
    for worker in workers:
        accessors = _tokens_for(mgmt, worker)
        assert len(accessors) == 1, f"{worker}: {len(accessors)} tokens"
        secret = mgmt.acl.read_token(accessors[0]).secret
        assert secret is not None
        assert read_secret_file(env.secrets / f"{worker}.token").reveal() == secret.reveal()


def test_sigkill_at_random_points_then_rerun_converges(env: Env) -> None:
    workers = [f"kw-{n}" for n in range(12)]
    jobs = [f"kill-{n:03d}" for n in range(150)]
    env.write_spec({j: random.Random(j).sample(workers, 3) for j in jobs}, workers)
    mgmt = env.cluster.management()
    argv = [sys.executable, "-c", APP_SOURCE, "apply", *env.flags(), "--concurrency", "2"]
    rng = random.Random(4)
    first_writes = sorted(f"lock-{j}" for j in jobs)[:2]
    partial = 0
    for _ in range(4):
        _reset(mgmt, jobs, workers)
        for token_file in env.secrets.glob("*.token"):
            token_file.unlink()
        process = subprocess.Popen(
            argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        # Kill once the apply has started writing (not after a fixed sleep: on a loaded
        # machine start-up alone can take longer), at a random point after that. It creates
        # the policies in name order, so its first writes are the first two job policies.
        give_up_at = time.monotonic() + 30
        while not _existing(mgmt, first_writes) and process.poll() is None:
            assert time.monotonic() < give_up_at, "the apply never started writing"
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.4))
        process.send_signal(signal.SIGKILL)
        process.wait()
        made = len(_existing(mgmt, [f"lock-{j}" for j in jobs]))
        partial += 0 < made < len(jobs) or 0 < len(list(env.secrets.glob("*.token"))) < len(workers)
        rerun = env.run("apply", "--concurrency", "8")
        assert rerun.exit_code == 0, rerun.output
        _assert_converged(mgmt, env, jobs, workers)
        assert env.run("plan").exit_code == 0
    assert partial >= 1, "no kill landed in the middle of an apply"
    _reset(mgmt, jobs, workers)


def _restart(live_cluster: LiveCluster, agent: AgentSpec) -> None:
    """Start the killed server again from its own config (its agent token is persisted), and
    wait until the cluster sees it healthy. (cluster_up's recovery re-sets agent tokens, which a
    just-restarted server refused with 403 "ACL not found" here.)"""
    layout = live_cluster.layout
    argv = [str(install_consul().path), "agent", f"-config-file={layout.config_file(agent)}"]
    spawn(argv, layout.log_file(agent), layout.pidfile(agent))
    mgmt = live_cluster.management("worker-1")
    give_up_at = time.monotonic() + 60
    while time.monotonic() < give_up_at:
        try:
            if serf_health(mgmt, agent.name) == "passing":
                live_cluster.management(agent.name).acl.read_self_token()  # it resolves tokens
                return
        except ConsulError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{agent.name} did not come back")


def test_leader_kill_during_apply_is_ridden_out(env: Env, live_cluster: LiveCluster) -> None:
    workers = [f"lk-{n}" for n in range(5)]
    jobs = [f"leader-{n:03d}" for n in range(120)]
    env.write_spec({j: random.Random(j).sample(workers, 2) for j in jobs}, workers)
    env.agent = "worker-1"  # a client agent: it survives the kill
    env.address = live_cluster.address(env.agent)
    mgmt = live_cluster.management("worker-1")
    _reset(mgmt, jobs, workers)
    leader_raft = mgmt.status.leader()
    leader = next(a for a in live_cluster.layout.servers if leader_raft.startswith(a.address + ":"))
    pid = read_pid(live_cluster.layout.pidfile(leader))
    assert pid is not None
    outcome: dict[str, object] = {}

    def run_apply() -> None:
        outcome["result"] = runner.invoke(_app(), ["apply", *env.flags(), "--concurrency", "2"])

    thread = threading.Thread(target=run_apply)
    thread.start()
    time.sleep(0.3)
    os.kill(pid, signal.SIGKILL)
    thread.join(timeout=120)
    try:
        result = outcome["result"]
        assert result.exit_code == 0, result.output  # type: ignore[attr-defined]
        _assert_converged(mgmt, env, jobs, workers)
    finally:
        _restart(live_cluster, leader)
        _reset(live_cluster.management(), jobs, workers)
