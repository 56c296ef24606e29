"""Token files that are not their worker's token, management tokens that may not read secrets,
and lockctl run several times at once, against the real cluster (issue 13, items B and C).

Each test names its jobs and workers with its own uid (test_apply.Env), so what its plan and
apply compare and change is its own, and deletes what its specs made at its end. lockctl's own
lock (LOCK_KEY and its "lockctl apply" sessions) is one per cluster, every apply's: the tests
that look at it, hold it or kill its holder run on a Consul of this module's own
(private_consul.py)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.acl.serialize import LOCK_KEY
from provision.consul import Consul
from provision.errors import EXIT_DENIED, EXIT_ENVIRONMENT, EXIT_INPUT
from provision.spec.names import lock_policy_name, token_description
from provision.system.secrets import read_secret_file
from tests.conftest import LiveCluster
from tests.integration.made_sessions import note_sessions, still_there
from tests.integration.named_reads import policy_named, worker_tokens
from tests.integration.private_consul import PrivateConsul, private_consul
from tests.integration.procscan import catches
from tests.integration.test_apply import Env, env_on

ROOT = Path(__file__).resolve().parents[2]
APP_SOURCE = (
    "from provision.cli.app import app\n"
    "from provision.cli import acl\n"
    "app.command('apply')(acl.apply)\n"
    "app.command('rotate')(acl.rotate)\n"
    "app(prog_name='lockctl')\n"
)
WRITE_SECRET = "write-secret"


@pytest.fixture
def env(
    tmp_path: Path, live_cluster: LiveCluster, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Env]:
    yield from env_on(live_cluster, tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def own_consul(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateConsul]:
    with private_consul(tmp_path_factory.mktemp("own-consul"), 46) as consul:
        yield consul


@pytest.fixture
def own_env(
    tmp_path: Path, own_consul: PrivateConsul, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Env]:
    """An Env on a Consul nothing but this module uses: whoever holds LOCK_KEY there, and every
    "lockctl apply" session on its one node, is this module's."""
    for env in env_on(own_consul, tmp_path, monkeypatch):
        env.agent = own_consul.node  # where its applies' lock sessions are made
        yield env


def _token_writes(plan_stdout: str) -> dict[str, str]:
    """worker -> reason of each write-secret in `plan --json`."""
    return {
        t["worker"]: t["reason"]
        for t in json.loads(plan_stdout)["tokens"]
        if t["action"] == WRITE_SECRET
    }


def _live_secret(mgmt: Consul, worker: str) -> str:
    (accessor,) = worker_tokens(mgmt, worker)
    secret = mgmt.acl.read_token(accessor).secret
    assert secret is not None
    return secret.reveal()


def _assert_file_is_the_live_token(env: Env, mgmt: Consul, worker: str) -> None:
    path = env.secrets / f"{worker}.token"
    assert read_secret_file(path).reveal() == _live_secret(mgmt, worker)
    info = path.stat()
    assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.geteuid()


# --- B: a token file that is not the worker's token ----------------------------------------


def test_each_wrong_token_file_shows_in_plan_and_apply_fixes_it(env: Env) -> None:
    """Once "No changes" for all of them: plan only checked that the file existed."""
    workers = [env.name("w1"), env.name("w2")]
    env.write_spec({env.name("tf-a"): workers}, workers)
    assert env.run("apply").exit_code == 0
    mgmt = env.cluster.management()
    revoked = mgmt.acl.create_token("revoked soon (test)", [])
    assert revoked.secret is not None
    mgmt.acl.delete_token(revoked.accessor_id)
    foreign = mgmt.acl.create_token("someone else's (test)", [])
    assert foreign.secret is not None
    right = _live_secret(mgmt, workers[0])
    cases: list[tuple[str, str, int, str]] = [
        ("revoked", revoked.secret.reveal(), 0o600, "revoked or unknown secret"),
        ("foreign", foreign.secret.reveal(), 0o600, "another token's secret"),
        ("empty", "", 0o600, "token file is empty"),
        ("garbage", "<hidden>\n", 0o600, "does not hold a token secret"),
        ("0644", right + "\n", 0o644, "mode 0644 lets group or others in"),
    ]
    path = env.secrets / f"{workers[0]}.token"
    try:
        for name, content, mode, reason in cases:
            path.write_text(content, encoding="utf-8")
            path.chmod(mode)
            plan = env.run("plan", "--json")
            assert plan.exit_code == 2, (name, plan.output)
            assert reason in _token_writes(plan.stdout).get(workers[0], ""), (name, plan.stdout)
            assert workers[1] not in _token_writes(plan.stdout)
            applied = env.run("apply")
            assert applied.exit_code == 0, (name, applied.output)
            assert f"wrote {path} (mode 0600)" in applied.stdout
            _assert_file_is_the_live_token(env, mgmt, workers[0])
            assert env.run("plan").exit_code == 0, name
    finally:
        mgmt.acl.delete_token(foreign.accessor_id)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_token_file_owned_by_another_user_is_rewritten(env: Env) -> None:
    worker = env.name("w")
    env.write_spec({env.name("tf-own"): [worker]}, [worker])
    assert env.run("apply").exit_code == 0
    path = env.secrets / f"{worker}.token"
    os.chown(path, 65534, 65534)
    plan = env.run("plan", "--json")
    assert plan.exit_code == 2
    assert "owned by uid 65534" in _token_writes(plan.stdout)[worker]
    assert env.run("apply").exit_code == 0
    _assert_file_is_the_live_token(env, env.cluster.management(), worker)


def _token_with(env: Env, name: str, rules: str) -> tuple[Path, str, str]:
    """A token with only `rules`, in a file; returns the file, the accessor and the policy ID."""
    mgmt = env.cluster.management()
    name = env.name(name)
    policy = mgmt.acl.create_policy(name, rules, "test")
    token = mgmt.acl.create_token(f"{name} (test)", [name])
    assert token.secret is not None
    path = env.tmp / f"{name}.token"
    path.write_text(token.secret.reveal() + "\n", encoding="utf-8")
    path.chmod(0o600)
    return path, token.accessor_id, policy.id


def test_a_management_token_that_cannot_read_secrets_never_writes_one(env: Env) -> None:
    """acl = "read" (and what lockctl's own lock needs): Consul shows SecretID "<hidden>".
    apply once wrote "<hidden>" as the token file, said "wrote ... (mode 0600)" and exited 0."""
    worker = env.name("w")
    env.write_spec({env.name("tf-ro"): [worker]}, [worker])
    assert env.run("apply").exit_code == 0
    reader, accessor, policy_id = _token_with(
        env,
        "acl-read-and-lock",
        f'acl = "read"\nsession_prefix "" {{ policy = "write" }}\n'
        f'key "{LOCK_KEY}" {{ policy = "write" }}\n',
    )
    path = env.secrets / f"{worker}.token"
    path.unlink()
    try:
        plan = env.run("plan", "--json", "--token-file", str(reader))
        assert plan.exit_code == 2, plan.output
        assert _token_writes(plan.stdout) == {worker: "token file missing"}
        applied = env.run("apply", "--token-file", str(reader))
        assert applied.exit_code == EXIT_DENIED, applied.output
        assert 'needs acl = "write" to read token secrets' in applied.stderr
        assert applied.stderr.count("\n") == 1 and "wrote" not in applied.stdout
        assert not path.exists()
        assert sorted(p.name for p in env.secrets.iterdir()) == []  # no temporary file either
    finally:
        mgmt = env.cluster.management()
        mgmt.acl.delete_token(accessor)
        mgmt.acl.delete_policy(policy_id)


def test_a_read_only_token_is_refused_at_lockctls_lock(env: Env) -> None:
    job = env.name("tf-ro2")
    env.write_spec({job: [env.name("w")]}, [env.name("w")])
    reader, accessor, policy_id = _token_with(env, "acl-read-only", 'acl = "read"')
    try:
        applied = env.run("apply", "--token-file", str(reader))
        assert applied.exit_code == EXIT_DENIED, applied.output
        assert LOCK_KEY in applied.stderr and 'acl = "write"' in applied.stderr
        assert policy_named(env.cluster.management(), lock_policy_name(job)) is None
    finally:
        mgmt = env.cluster.management()
        mgmt.acl.delete_token(accessor)
        mgmt.acl.delete_policy(policy_id)


def test_rotate_takes_only_a_worker_of_the_spec(env: Env) -> None:
    env.write_spec({env.name("tf-rot"): [env.name("w")]}, [env.name("w")])
    mgmt = env.cluster.management()
    planted = mgmt.acl.create_token(token_description("../outside"), [])
    before = sorted(p.name for p in env.tmp.iterdir())
    try:
        stranger = env.name("w9")
        for name, says in (("../outside", "not a valid worker name"), (stranger, "not a worker")):
            result = env.run("rotate", "--worker", name)
            assert result.exit_code == EXIT_INPUT, result.output
            assert says in result.stderr and result.stderr.count("\n") == 1
        assert sorted(p.name for p in env.tmp.iterdir()) == before  # nothing written anywhere
        assert mgmt.acl.read_token(planted.accessor_id).accessor_id == planted.accessor_id
    finally:
        mgmt.acl.delete_token(planted.accessor_id)


# --- C: lockctl run several times at once --------------------------------------------------


def _start(env: Env, *args: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-c", APP_SOURCE, *args, *env.flags()]
    return subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _finish(processes: list[subprocess.Popen[str]], env: Env) -> list[tuple[int, str, str]]:
    done = []
    for process in processes:
        out, err = process.communicate(timeout=120)
        for secret in env.all_secrets():
            assert secret not in out + err, "a token secret was printed"
        done.append((process.returncode, out, err))
    return done


def test_three_applies_at_once_mint_one_token_per_worker(own_env: Env) -> None:
    """Three at once once minted two tokens per worker."""
    workers = sorted(own_env.name(f"cc-{n}") for n in range(6))
    own_env.write_spec({own_env.name(f"cc-job-{n}"): workers[n : n + 3] for n in range(4)}, workers)
    mgmt = own_env.cluster.management()
    results = _finish([_start(own_env, "apply", "--json") for _ in range(3)], own_env)
    for code, out, err in results:
        assert code == 0, (out, err)
    created = [
        t["worker"]
        for _, out, _ in results
        for t in json.loads(out)["tokens"]
        if t["action"] == "create"
    ]
    assert sorted(created) == workers  # each worker's token minted by exactly one of them
    for worker in workers:
        assert len(worker_tokens(mgmt, worker)) == 1, worker
        _assert_file_is_the_live_token(own_env, mgmt, worker)
    assert own_env.run("plan").exit_code == 0
    assert mgmt.kv.get(LOCK_KEY)[0] is None  # released: the session and its key are gone


def test_three_rotates_at_once_never_announce_a_revoked_token(env: Env) -> None:
    """Three at once once revoked two of the three tokens they announced as new."""
    worker = env.name("w")
    env.write_spec({env.name("cc-rot"): [worker]}, [worker])
    assert env.run("apply").exit_code == 0
    mgmt = env.cluster.management()
    (first,) = worker_tokens(mgmt, worker)
    results = _finish([_start(env, "rotate", "--worker", worker, "--json") for _ in range(3)], env)
    announced = {}
    for code, out, err in results:
        assert code == 0, (out, err)
        (record,) = json.loads(out)
        announced[record["accessor_id"]] = record["revoked"]
    # They took turns: each revoked exactly what the one before it announced, a chain from
    # the first token to the live one; no rotate revoked a token another one had not replaced.
    chain = [first]
    while len(chain) <= len(announced):
        (after,) = [new for new, revoked in announced.items() if revoked == [chain[-1]]]
        chain.append(after)
    assert worker_tokens(mgmt, worker) == [chain[-1]]
    _assert_file_is_the_live_token(env, mgmt, worker)


def _wait_for_holder(mgmt: Consul, seconds: float = 30) -> str:
    give_up_at = time.monotonic() + seconds
    while time.monotonic() < give_up_at:
        entry, _ = mgmt.kv.get(LOCK_KEY, consistency="consistent")
        if entry is not None and entry.session:
            return entry.session
        time.sleep(0.01)
    raise AssertionError(f"nobody took {LOCK_KEY}")


def test_a_killed_holders_lock_is_taken_over_at_once_on_the_same_machine(own_env: Env) -> None:
    workers = [own_env.name(f"kl-{n}") for n in range(8)]
    own_env.write_spec({own_env.name(f"kl-job-{n:03d}"): workers for n in range(150)}, workers)
    mgmt = own_env.cluster.management()
    process = _start(own_env, "apply", "--concurrency", "1")
    try:
        held_by = _wait_for_holder(mgmt)
    finally:
        process.send_signal(signal.SIGKILL)
        process.communicate()
    assert mgmt.session.info(held_by) is not None  # its session outlives it (TTL 15 s)
    # Taken at once: waiting out the dead holder's session (TTL 15 s) would pass --lock-wait.
    rerun = own_env.run("apply", "--lock-wait", "5")
    assert rerun.exit_code == 0, rerun.output
    assert own_env.run("plan").exit_code == 0


def test_sigterm_frees_the_lock_at_once(own_env: Env) -> None:
    """SIGTERM unwinds like Ctrl-C: the session is destroyed, not left to its TTL."""
    workers = [own_env.name(f"st-{n}") for n in range(8)]
    own_env.write_spec({own_env.name(f"st-job-{n:03d}"): workers for n in range(150)}, workers)
    mgmt = own_env.cluster.management()
    process = _start(own_env, "apply", "--concurrency", "1")
    held_by = _wait_for_holder(mgmt)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 130, err
    assert "interrupted by SIGTERM" in err and err.count("\n") == 1, err
    assert mgmt.session.info(held_by) is None
    assert mgmt.kv.get(LOCK_KEY)[0] is None
    assert own_env.run("apply", "--lock-wait", "0").exit_code == 0


def _lock_sessions(mgmt: Consul, env: Env) -> list[str]:
    """The sessions of apply's own lock on the node of the agent `env` sends its applies to
    (a session is made on the serving agent's node): on the module's own Consul, this module's
    applies' (subprocesses, so not noted by made_sessions)."""
    on_node = mgmt.session.list(node=env.agent)
    return [s.id for s in on_node if s.name == "lockctl apply"]


def _when(moment: str, process: subprocess.Popen[str], mgmt: Consul, env: Env) -> None:
    """Wait (polling as fast as it can) for `moment` of the apply's life, or its end."""
    give_up_at = time.monotonic() + 60
    while process.poll() is None and time.monotonic() < give_up_at:
        if moment == "handler" and catches(process.pid, signal.SIGTERM):
            return
        if moment == "session" and _lock_sessions(mgmt, env):
            return
        if moment == "holder":
            entry, _ = mgmt.kv.get(LOCK_KEY, consistency="consistent")
            if entry is not None and entry.session:
                return
        if moment not in ("handler", "session", "holder"):
            time.sleep(float(moment))
            return


def test_sigterm_at_any_moment_never_leaves_lockctls_lock_held(own_env: Env) -> None:
    """SIGTERM the instant the handlers are in place, the instant the lock's session exists
    (before the acquire), the instant the lock is held (before the block), and at random
    moments: however it ends, nothing of lockctl's lock is left (an apply killed while it held
    the lock once left it to its TTL, and the next apply waited), and from the moment a
    handler is in place the exit is 0 or 130, never a death by signal."""
    workers = [own_env.name(f"sa-{n}") for n in range(4)]
    mgmt = own_env.cluster.management()
    random.seed(os.getpid())
    moments = ["handler", "session", "holder"] * 3 + [
        f"{random.uniform(0, 1.5):.3f}" for _ in "123"
    ]
    for round_number, moment in enumerate(moments):
        jobs = {own_env.name(f"sa{round_number}-{n:02d}"): workers for n in range(30)}
        own_env.write_spec(jobs, workers)
        process = _start(own_env, "apply", "--concurrency", "1")
        try:
            _when(moment, process, mgmt, own_env)
            caught = catches(process.pid, signal.SIGTERM)
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            _, err = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
        context = (round_number, moment, caught, process.returncode, err)
        if caught or moment in ("session", "holder"):  # the handlers come before the session
            assert process.returncode in (0, 130), context
        else:  # signalled during the interpreter's start: nothing can have been taken yet
            assert process.returncode in (0, 130, -signal.SIGTERM), context
        assert mgmt.kv.get(LOCK_KEY, consistency="consistent")[0] is None, context
        assert _lock_sessions(mgmt, own_env) == [], context
    assert own_env.run("apply", "--lock-wait", "0").exit_code == 0
    assert own_env.run("plan").exit_code == 0


def test_a_live_holder_elsewhere_makes_apply_give_up_after_lock_wait(own_env: Env) -> None:
    job = own_env.name("busy")
    own_env.write_spec({job: [own_env.name("w")]}, [own_env.name("w")])
    mgmt = own_env.cluster.management()
    session = mgmt.session.create(name="test holder", ttl=30, lock_delay=0)
    forged = b'{"command": "apply\\u001b[2J", "host": "elsewhere", "pid": 1, "machine": "x"}'
    assert mgmt.kv.put(LOCK_KEY, forged, acquire=session)
    try:
        began = time.monotonic()
        result = own_env.run("apply", "--lock-wait", "1")
        assert result.exit_code == EXIT_ENVIRONMENT, result.output
        # it gave up after --lock-wait, not once the holder's session (TTL 30 s) ended
        assert 1 <= time.monotonic() - began < 20
        assert result.stderr.count("\n") == 1 and "\x1b" not in result.stderr
        assert LOCK_KEY in result.stderr and "pid 1 on elsewhere" in result.stderr
        assert policy_named(mgmt, lock_policy_name(job)) is None
    finally:
        mgmt.session.destroy(session)
    assert own_env.run("apply", "--lock-wait", "5").exit_code == 0


def test_the_lock_session_is_destroyed_when_apply_fails(
    own_env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = own_env.name("w")
    own_env.write_spec({own_env.name("fail-lock"): [worker]}, [worker])
    mgmt = own_env.cluster.management()
    blocker = own_env.secrets
    blocker.mkdir(parents=True, exist_ok=True)
    (blocker / f"{worker}.token").mkdir()  # a folder where the token file goes: the write fails
    made = note_sessions(monkeypatch)  # the apply runs in this process: its session, by ID
    result = own_env.run("apply")
    assert result.exit_code == EXIT_ENVIRONMENT, result.output
    assert "cannot write token file" in result.stderr and result.stderr.count("\n") == 1
    assert mgmt.kv.get(LOCK_KEY)[0] is None
    assert made, "the apply made no session for its lock"
    assert still_there(mgmt, made) == []
