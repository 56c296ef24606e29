"""plan / apply / rotate against the real cluster: idempotence, least privilege, prune scope,
secrets never printed, failures, SIGKILL at random points, and a leader kill mid-apply.

The cluster is shared by every test, and lockctl's managed set is the whole cluster's: each
test names its jobs and workers with its own uid (a worker is named after a real node only
where sessions on that node are tested) and deletes what its specs made at its end; `--prune`
of a spec without an owner, which deletes every object of the default owner its spec does not
name, whoever made it, runs on a Consul of the test's own (private_consul.py). Two specs with
owners of their own prune beside other tests' objects: test_two_owners.py."""

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
from collections.abc import Iterable, Iterator
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
from tests.conftest import LiveCluster
from tests.integration.named_reads import policy_named, serf_health, worker_tokens
from tests.integration.private_consul import PrivateConsul, private_consul
from tests.integration.spec_objects import SpecObjects
from tests.subnets import TEST_SUBNET

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
    """A spec file, a secrets folder and the flags to point lockctl at the test cluster (or at a
    Consul of the test's own); a uid for the test's names, and what its specs made."""

    def __init__(
        self, tmp_path: Path, cluster: LiveCluster | PrivateConsul, agent: str = "server-1"
    ) -> None:
        self.tmp = tmp_path
        self.cluster = cluster
        self.spec = tmp_path / "locks.hcl"
        self.secrets = tmp_path / "secrets"
        self.agent = agent  # the agent lockctl talks to: its sessions are made on its node
        self.address = cluster.address(agent)
        self.uid = uuid.uuid4().hex[:8]
        self.made = SpecObjects(cluster.management, self.uid)  # deleted by the fixture

    def name(self, base: str) -> str:
        """`base` with this test's uid: a job or worker name no other test's spec has."""
        return f"{base}-{self.uid}"

    def write_spec(self, jobs: dict[str, list[str]], workers: list[str]) -> None:
        self.write_text(spec_text(jobs, workers))

    def write_text(self, text: str) -> None:
        """Every spec a test applies is written here, so its objects are noted first."""
        self.spec.write_text(text, encoding="utf-8")
        self.made.note(self.spec)

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


def env_on(
    consul: LiveCluster | PrivateConsul, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Env]:
    """An Env on `consul`, and at its end what its specs made deleted (only that)."""
    for name in ("CONSUL_HTTP_TOKEN", "CONSUL_HTTP_TOKEN_FILE", "CONSUL_HTTP_ADDR"):
        monkeypatch.delenv(name, raising=False)
    env = Env(tmp_path, consul)
    yield env
    env.made.delete()


@pytest.fixture
def env(
    tmp_path: Path, live_cluster: LiveCluster, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Env]:
    yield from env_on(live_cluster, tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def own_consul(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateConsul]:
    with private_consul(tmp_path_factory.mktemp("own-consul"), 43) as consul:
        yield consul


@pytest.fixture
def own_env(
    tmp_path: Path, own_consul: PrivateConsul, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Env]:
    """An Env on a Consul nothing but this module uses: what `--prune` deletes there is the
    test's own."""
    yield from env_on(own_consul, tmp_path, monkeypatch)


def _existing(consul: Consul, names: Iterable[str]) -> dict[str, str]:
    """Which of `names` are policies in Consul (name -> ID), each read by its name."""
    found = {name: policy_named(consul, name) for name in names}
    return {name: policy.id for name, policy in found.items() if policy is not None}


def test_apply_twice_creates_nothing_the_second_time(env: Env) -> None:
    workers = [env.name("w1"), env.name("w2")]
    env.write_spec({env.name("idem-a"): workers[:1], env.name("idem-b"): workers}, workers)
    first = env.run("apply", "--json")
    assert first.exit_code == 0, first.output
    record = json.loads(first.stdout)
    assert record["applied"] >= 2  # at least the two job policies
    mgmt = env.cluster.management()
    for worker in workers:
        path = env.secrets / f"{worker}.token"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        (accessor,) = worker_tokens(mgmt, worker)
        secret = mgmt.acl.read_token(accessor).secret
        assert secret is not None and read_secret_file(path).reveal() == secret.reveal()
    second = env.run("apply", "--json")
    assert second.exit_code == 0, second.output
    again = json.loads(second.stdout)
    assert again["changes_pending"] is False
    assert again["applied"] == 0
    # the two list calls, and one check per worker that its file holds its live token
    assert again["requests"] == 2 + 2
    assert len(worker_tokens(mgmt, workers[0])) == 1


def test_plan_exit_codes_and_json(env: Env) -> None:
    worker, plan_a, plan_b = env.name("w"), env.name("plan-a"), env.name("plan-b")
    env.write_spec({plan_a: [worker]}, [worker])
    assert env.run("apply").exit_code == 0
    env.write_spec({plan_a: [worker], plan_b: [worker]}, [worker])
    pending = env.run("plan")
    assert pending.exit_code == 2, pending.output
    assert f"policy {lock_policy_name(plan_b)}: create (new)" in pending.stdout
    assert f"+{lock_policy_name(plan_b)}" in pending.stdout
    # stderr names the cluster's managed objects no spec of this test has (other tests'):
    # none of this test's is stale
    assert env.uid not in pending.stderr
    as_json = env.run("plan", "--json", "--no-detailed-exitcode")
    assert as_json.exit_code == 0
    assert json.loads(as_json.stdout)["changes_pending"] is True
    assert env.run("apply").exit_code == 0
    clean = env.run("plan")
    assert clean.exit_code == 0, clean.output
    assert "No changes" in clean.stdout


def test_worker_tokens_are_least_privilege(env: Env) -> None:
    """worker-1's token acquires its own job's lock; 403 on another job's prefix and on a
    session on worker-2's node. (Named after the real nodes: sessions are made on them.)"""
    mine, other = env.name("lp-mine"), env.name("lp-other")
    env.write_spec({mine: ["worker-1"], other: ["worker-2"]}, ["worker-1", "worker-2"])
    assert env.run("apply").exit_code == 0
    token = read_secret_file(env.secrets / "worker-1.token")
    own_agent = env.cluster.client("worker-1", token)
    session = own_agent.session.create(name="lp", ttl=10, lock_delay=0)
    try:
        assert own_agent.kv.put(f"locks/{mine}/.lock", b"x", acquire=session) is True
        with pytest.raises(PermissionDenied):
            own_agent.kv.put(f"locks/{other}/.lock", b"x", acquire=session)
        with pytest.raises(PermissionDenied):
            own_agent.kv.put(f"locks/{mine}-x", b"x")  # one character outside the prefix
        other_agent = own_agent.with_settings(address=env.cluster.address("worker-2"))
        with pytest.raises(PermissionDenied):
            other_agent.session.create(name="lp", ttl=10, lock_delay=0)
    finally:
        own_agent.kv.put(f"locks/{mine}/.lock", b"", release=session)
        own_agent.session.destroy(session)
        env.cluster.management().kv.delete(f"locks/{mine}/", recurse=True)


def test_existing_policy_is_adopted_by_name(env: Env) -> None:
    mgmt = env.cluster.management()
    job = env.name("adopt-me")
    name = lock_policy_name(job)
    made = mgmt.acl.create_policy(name, 'key "x" { policy = "read" }', "made by hand")
    env.write_spec({job: [env.name("w")]}, [env.name("w")])
    result = env.run("apply")
    assert result.exit_code == 0, result.output
    assert f"policy {name}: updated (rules differ; adopt" in result.stdout
    after = mgmt.acl.read_policy(made.id)
    assert after.rules is not None and f'key_prefix "locks/{job}/"' in after.rules
    assert after.description.startswith("lockctl-managed")
    adopted = policy_named(mgmt, name)  # the one made by hand, not a second one
    assert adopted is not None and adopted.id == made.id


def _deleted(record: dict[str, list[dict[str, str]]], kind: str, field: str) -> list[str]:
    return sorted(change[field] for change in record[kind] if change["action"] == "delete")


def test_prune_deletes_only_what_lockctl_manages(own_env: Env, own_consul: PrivateConsul) -> None:
    """On a Consul of the test's own: `--prune` of a spec without an owner deletes every object
    of the default owner its spec does not name, whoever made it, so on the shared cluster it
    would take other tests' objects (and what it deleted could not be asserted exactly)."""
    env = own_env
    mgmt = env.cluster.management()
    uid = env.uid
    # Bystanders: a lock- policy and a token made by hand (unmarked), and a policy marked as
    # lockctl's but neither a lock nor a session policy, as agent policies are (bootstrap made
    # one for this server's own agent too).
    hand_rules = 'key_prefix "h/" { policy = "read" }'
    hand = mgmt.acl.create_policy(f"lock-hand-made-{uid}", hand_rules, "ops")
    hand_token = mgmt.acl.create_token(f"ops token {uid}", [hand.name])
    node = f"prune-{uid}"
    agent = mgmt.acl.create_policy(
        agent_policy_name(node),
        f'node "{node}" {{ policy = "write" }}',
        f"{MANAGED_MARKER}: agent token for node {node}",
    )
    kept_job, gone_job = env.name("prune-a"), env.name("prune-b")
    kept_worker, gone_worker = env.name("pw1"), env.name("pw2")
    gone = [lock_policy_name(gone_job), session_policy_name(gone_worker)]
    names = [lock_policy_name(kept_job), *gone, hand.name, agent.name]
    own_agent = agent_policy_name(own_consul.node)
    try:
        workers = [kept_worker, gone_worker]
        env.write_spec({kept_job: workers[:1], gone_job: workers}, workers)
        assert env.run("apply").exit_code == 0
        (gone_token,) = worker_tokens(mgmt, gone_worker)
        env.write_spec({kept_job: [kept_worker]}, [kept_worker])
        kept = env.run("apply")
        assert kept.exit_code == 0
        assert set(gone) <= set(_existing(mgmt, names))
        assert f"policy {gone[0]}" in kept.stderr  # named as stale, kept without --prune
        pruned = env.run("apply", "--prune", "--json")
        assert pruned.exit_code == 0, pruned.output
        record = json.loads(pruned.stdout)
        assert _deleted(record, "policies", "name") == sorted(gone)
        assert _deleted(record, "tokens", "accessor_id") == [gone_token]
        left = _existing(mgmt, names)
        assert not set(gone) & set(left)
        assert lock_policy_name(kept_job) in left
        assert left[hand.name] == hand.id
        assert mgmt.acl.read_token(hand_token.accessor_id).accessor_id == hand_token.accessor_id
        assert left[agent.name] == agent.id
        assert policy_named(mgmt, own_agent) is not None  # as the cluster's agent policies stay
        assert len(worker_tokens(mgmt, kept_worker)) == 1
    finally:
        mgmt.acl.delete_token(hand_token.accessor_id)
        for policy in (hand, agent):
            mgmt.acl.delete_policy(policy.id)


def test_rotate_revokes_the_old_token_only_after_the_new_one_works(env: Env) -> None:
    worker = env.name("w")
    env.write_spec({env.name("rot"): [worker]}, [worker])
    assert env.run("apply").exit_code == 0
    path = env.secrets / f"{worker}.token"
    old_secret = read_secret_file(path)
    mgmt = env.cluster.management()
    (old_accessor,) = worker_tokens(mgmt, worker)
    result = runner.invoke(
        _app(),
        ["rotate", "--worker", worker, "--spec", str(env.spec), "--secrets-dir",
         str(env.secrets), "--address", env.address, "--token-file",
         str(env.cluster.layout.management_token_file)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    new_secret = read_secret_file(path)
    assert new_secret.reveal() != old_secret.reveal()
    for secret in (old_secret, new_secret):
        assert secret.reveal() not in result.output
    (new_accessor,) = worker_tokens(mgmt, worker)
    assert new_accessor != old_accessor
    assert f"revoked {old_accessor}" in result.stdout
    with pytest.raises(PermissionDenied):
        env.cluster.client(token=old_secret).acl.read_self_token()
    assert env.cluster.client(token=new_secret).acl.read_self_token().accessor_id == new_accessor
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert env.run("plan").exit_code == 0  # the rotated token still matches the spec


def test_duplicate_token_from_an_interrupted_rotate_converges(env: Env) -> None:
    worker = env.name("w")
    env.write_spec({env.name("dup"): [worker]}, [worker])
    assert env.run("apply").exit_code == 0
    mgmt = env.cluster.management()
    (kept,) = worker_tokens(mgmt, worker)
    policies = list(mgmt.acl.read_token(kept).policy_names)
    extra = mgmt.acl.create_token(token_description(worker), policies)  # minted, never written
    plan = env.run("plan", "--json")
    assert plan.exit_code == 2
    assert json.loads(plan.stdout)["tokens"][0]["accessor_id"] == extra.accessor_id
    assert env.run("apply").exit_code == 0
    assert worker_tokens(mgmt, worker) == [kept]  # the one the file holds


def test_missing_token_file_is_fetched_not_reminted(env: Env) -> None:
    worker = env.name("w")
    env.write_spec({env.name("refetch"): [worker]}, [worker])
    assert env.run("apply").exit_code == 0
    mgmt = env.cluster.management()
    before = worker_tokens(mgmt, worker)
    secret = read_secret_file(env.secrets / f"{worker}.token")
    (env.secrets / f"{worker}.token").unlink()
    assert env.run("apply").exit_code == 0
    assert worker_tokens(mgmt, worker) == before
    assert read_secret_file(env.secrets / f"{worker}.token").reveal() == secret.reveal()


# --- failures -------------------------------------------------------------------------------


def test_no_token_is_a_permission_error_naming_the_permission(env: Env) -> None:
    job = env.name("denied")
    env.write_spec({job: [env.name("w")]}, [env.name("w")])
    result = env.run("apply", token=False)
    assert result.exit_code == EXIT_DENIED
    assert result.stderr.count("\n") == 1
    assert "403" in result.stderr and 'acl = "read"' in result.stderr
    assert policy_named(env.cluster.management(), lock_policy_name(job)) is None


def test_token_without_acl_write_is_refused_and_changes_nothing(env: Env) -> None:
    mgmt = env.cluster.management()
    reader = mgmt.acl.create_policy(env.name("acl-reader"), 'acl = "read"', "test")
    token = mgmt.acl.create_token(f"acl reader (test {env.uid})", [reader.name])
    try:
        assert token.secret is not None
        token_file = env.tmp / "reader.token"
        token_file.write_text(token.secret.reveal(), encoding="utf-8")
        job = env.name("readonly")
        env.write_spec({job: [env.name("w")]}, [env.name("w")])
        args = ["--spec", str(env.spec), "--secrets-dir", str(env.secrets)]
        args += ["--address", env.address, "--token-file", str(token_file)]
        result = runner.invoke(_app(), ["apply", *args])
        assert result.exit_code == EXIT_DENIED, result.output
        assert 'acl = "write"' in result.stderr
        assert token.secret.reveal() not in result.output
        assert policy_named(mgmt, lock_policy_name(job)) is None
    finally:
        mgmt.acl.delete_token(token.accessor_id)
        mgmt.acl.delete_policy(reader.id)


def test_consul_unreachable_is_a_clear_error(env: Env) -> None:
    env.write_spec({env.name("unreach"): [env.name("w")]}, [env.name("w")])
    env.address = f"http://{TEST_SUBNET}.99:8500"
    result = env.run("apply", "--timeout", "1")
    assert result.exit_code == EXIT_UNAVAILABLE, result.output
    assert "cannot connect" in result.stderr
    assert result.stderr.count("\n") == 1


def test_invalid_spec_changes_nothing(env: Env) -> None:
    """Nothing the spec names is made or changed: its job's and workers' policies, their tokens."""
    mgmt = env.cluster.management()
    job, worker, nobody = env.name("bad"), env.name("w"), env.name("nobody")
    workers = [worker, nobody]
    names = [lock_policy_name(job), *(session_policy_name(w) for w in workers)]

    def state() -> tuple[dict[str, int], list[list[str]]]:
        found = {name: policy_named(mgmt, name) for name in names}
        policies = {name: p.modify_index for name, p in found.items() if p is not None}
        return policies, [worker_tokens(mgmt, w) for w in workers]

    before = state()
    assert lock_policy_name(job) not in before[0]
    env.write_text(
        f'worker "{worker}" {{}}\njob "{job}" {{\n  prefix = ""\n  workers = ["{nobody}"]\n}}\n'
    )
    result = env.run("apply")
    assert result.exit_code == EXIT_INPUT
    assert "locks.hcl:" in result.stderr
    assert state() == before
    assert not env.secrets.exists()


def test_unwritable_secrets_dir_is_refused_before_any_change(env: Env) -> None:
    job = env.name("nodir")
    env.write_spec({job: [env.name("w")]}, [env.name("w")])
    blocker = env.tmp / "file"
    blocker.write_text("x")
    result = runner.invoke(_app(), ["apply", *env.flags(), "--secrets-dir", str(blocker / "s")])
    assert result.exit_code == 6, result.output
    assert policy_named(env.cluster.management(), lock_policy_name(job)) is None


# --- kills ----------------------------------------------------------------------------------


def _reset(mgmt: Consul, jobs: list[str], workers: list[str]) -> None:
    for worker in workers:
        for accessor in worker_tokens(mgmt, worker):
            mgmt.acl.delete_token(accessor)
    names = [lock_policy_name(j) for j in jobs] + [session_policy_name(w) for w in workers]
    for policy_id in _existing(mgmt, names).values():
        mgmt.acl.delete_policy(policy_id)


def _assert_converged(mgmt: Consul, env: Env, jobs: list[str], workers: list[str]) -> None:
    names = _existing(mgmt, [lock_policy_name(j) for j in jobs])
    assert all(lock_policy_name(j) in names for j in jobs)
    for worker in workers:
        accessors = worker_tokens(mgmt, worker)
        assert len(accessors) == 1, f"{worker}: {len(accessors)} tokens"
        secret = mgmt.acl.read_token(accessors[0]).secret
        assert secret is not None
        assert read_secret_file(env.secrets / f"{worker}.token").reveal() == secret.reveal()


def test_sigkill_at_random_points_then_rerun_converges(env: Env) -> None:
    workers = [env.name(f"kw-{n}") for n in range(12)]
    jobs = [env.name(f"kill-{n:03d}") for n in range(150)]
    env.write_spec({j: random.Random(n).sample(workers, 3) for n, j in enumerate(jobs)}, workers)
    mgmt = env.cluster.management()
    argv = [sys.executable, "-c", APP_SOURCE, "apply", *env.flags(), "--concurrency", "2"]
    rng = random.Random(4)
    first_writes = sorted(lock_policy_name(j) for j in jobs)[:2]
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
        made = len(_existing(mgmt, [lock_policy_name(j) for j in jobs]))
        partial += 0 < made < len(jobs) or 0 < len(list(env.secrets.glob("*.token"))) < len(workers)
        rerun = env.run("apply", "--concurrency", "8")
        assert rerun.exit_code == 0, rerun.output
        _assert_converged(mgmt, env, jobs, workers)
        assert env.run("plan").exit_code == 0
    assert partial >= 1, "no kill landed in the middle of an apply"


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
    workers = [env.name(f"lk-{n}") for n in range(5)]
    jobs = [env.name(f"leader-{n:03d}") for n in range(120)]
    env.write_spec({j: random.Random(n).sample(workers, 2) for n, j in enumerate(jobs)}, workers)
    env.agent = "worker-1"  # a client agent: it survives the kill
    env.address = live_cluster.address(env.agent)
    mgmt = live_cluster.management("worker-1")
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
        _restart(live_cluster, leader)  # the env fixture then deletes what the apply made
