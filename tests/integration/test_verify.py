"""`lockctl verify` on the live cluster: green when all is well, and each check goes red, naming
the problem, on a cluster broken the way it guards against.

What the module's spec makes is deleted at its end (the worker-1 and worker-2 token and session
policy only if it made them: they are named after the real nodes). A break no other test may
see is made on a cluster of its own: the anonymous token, one per cluster, is given write on
every key on a private server (private_consul.py), never on the shared cluster."""

from __future__ import annotations

import contextlib
import json
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner
from workers_lab import eventually_usable

from provision.acl.apply import apply_plan, plan_against
from provision.acl.render import render_policies
from provision.acl.state import desired_from_render
from provision.cli import app
from provision.cluster import tls
from provision.cluster.local import ClusterShape, cluster_down, cluster_up
from provision.consul import Consul, KVOp
from provision.ledger.records import TickRecord
from provision.ledger.store import Claim, Ledger
from provision.spec import Spec, load_spec
from provision.system.secrets import Secret, read_secret_file, write_secret_file
from provision.system.templates import CHECKOUT_TEMPLATES, find_templates_dir
from provision.verify import run_verification, select_checks
from provision.verify.checks import CHECKS
from provision.verify.context import VerifyContext, load_workers
from provision.verify.control_checks import alive_session
from provision.verify.evidence import CheckFailed, Evidence, verify_session
from provision.verify.tick_checks import scratch_tick, tick_once
from tests.conftest import LiveCluster
from tests.integration.made_sessions import note_sessions, still_there
from tests.integration.named_reads import policy_named
from tests.integration.private_consul import PrivateConsul, private_consul
from tests.integration.spec_objects import SpecObjects
from tests.subnets import ALLOW_SUBNET

ANONYMOUS_TOKEN = "00000000-0000-0000-0000-000000000002"
runner = CliRunner()


class Applied:
    """A spec applied to a cluster (the live one, or a private server): its file, the worker
    token files, the management."""

    def __init__(
        self, spec_file: Path, secrets_dir: Path, cluster: LiveCluster | PrivateConsul
    ) -> None:
        self.spec_file = spec_file
        self.secrets_dir = secrets_dir
        self.cluster = cluster
        self.spec: Spec = load_spec(spec_file)
        self.management: Consul = cluster.management()

    def context(self, secrets_dir: Path | None = None) -> VerifyContext:
        workers = load_workers(self.spec, secrets_dir or self.secrets_dir, None)
        return VerifyContext(self.spec, self.management.transport.settings, workers)

    def verify(self, *only: str, secrets_dir: Path | None = None) -> dict[str, tuple[str, str]]:
        report = run_verification(self.context(secrets_dir), select_checks(list(only), False))
        return {r.name: (r.status, r.summary) for r in report.results}

    def apply(self) -> None:
        desired = desired_from_render(render_policies(self.spec, find_templates_dir()))
        plan = plan_against(self.management, desired, self.secrets_dir)
        apply_plan(self.management, plan, self.secrets_dir)


@pytest.fixture(scope="module")
def applied(
    live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Applied]:
    run = uuid.uuid4().hex[:6]
    folder = tmp_path_factory.mktemp("verify")
    spec_file = folder / "locks.hcl"
    spec_file.write_text(
        f"""
defaults {{
  ttl            = "10s"
  lock_delay     = "4s"
  renew_interval = "1s"
  kill_grace     = "1s"
}}
worker "worker-1" {{
  address = "{live_cluster.address("worker-1")}"
}}
worker "worker-2" {{
  address = "{live_cluster.address("worker-2")}"
}}
job "shared-{run}" {{
  prefix  = "verify-{run}/shared/"
  workers = ["worker-1", "worker-2"]
}}
job "only-two-{run}" {{
  prefix  = "verify-{run}/only-two/"
  workers = ["worker-2"]
}}
"""
    )
    made = SpecObjects(live_cluster.management, run)
    made.note(spec_file)
    result = Applied(spec_file, folder / "secrets", live_cluster)
    result.apply()
    yield result
    made.delete()


def _env(applied: Applied) -> dict[str, str]:
    layout = applied.cluster.layout
    return {
        "CONSUL_HTTP_ADDR": layout.servers[0].http_address,
        "CONSUL_HTTP_TOKEN_FILE": str(layout.management_token_file),
    }


OPERATOR_KEYS = 'key_prefix "lockctl/control/" {\n  policy = "write"\n}\n'


def _operator_rules(spec: Spec) -> str:
    """docs/operations.md's operators' policy: the control keys, and for `lockctl break` each
    worker's sessions and its node's health."""
    rules = [OPERATOR_KEYS]
    for worker in spec.workers:
        rules.append(f'session "{worker.name}" {{\n  policy = "write"\n}}\n')
        rules.append(f'node "{worker.name}" {{\n  policy = "read"\n}}\n')
    return "".join(rules)


@contextlib.contextmanager
def _operator_token(applied: Applied, rules: str, path: Path) -> Iterator[Secret]:
    """A token with `rules`, its secret in `path`; deleted at the end."""
    management = applied.management
    policy = management.acl.create_policy(f"verify-test-operator-{uuid.uuid4().hex[:6]}", rules)
    token = management.acl.create_token("verify test: alice (on-call)", [policy.name])
    try:
        assert token.secret is not None
        write_secret_file(path, token.secret)
        eventually_usable(applied.cluster.client("server-1", token.secret))
        yield token.secret
    finally:
        management.acl.delete_token(token.accessor_id)
        management.acl.delete_policy(policy.id)


@pytest.fixture(scope="module")
def operator_file(applied: Applied) -> Iterator[Path]:
    """The operators' token of docs/operations.md for the applied spec's workers."""
    path = applied.secrets_dir.parent / "operator.token"
    with _operator_token(applied, _operator_rules(applied.spec), path):
        yield path


def test_a_correct_cluster_passes_every_check_and_leaves_nothing(
    applied: Applied, operator_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    junit = applied.secrets_dir.parent / "verify.xml"
    args = ["verify", "--spec", str(applied.spec_file), "--secrets-dir", str(applied.secrets_dir)]
    args += ["--operator-token-file", str(operator_file)]
    made = note_sessions(monkeypatch)  # this run's sessions, asked about by ID afterwards
    result = runner.invoke(
        app, [*args, "--slow", "--json", "--junit", str(junit)], env=_env(applied)
    )
    # On a plain-HTTP cluster tls-http and gossip-encrypted are red (test_verify_tls.py).
    red = set() if applied.cluster.layout.tls else {"tls-http", "gossip-encrypted"}
    assert result.exit_code == (1 if red else 0), result.output
    report = json.loads(result.output)
    statuses = {check["name"]: check["status"] for check in report["checks"]}
    # the login checks need a JWT (--bearer-token-file): skipped here (test_login.py runs them)
    skipped = {c.name for c in CHECKS if c.name.startswith("login-")}
    expected = {c.name: "skip" if c.name in skipped else "pass" for c in CHECKS}
    assert statuses == {**expected, **dict.fromkeys(red, "fail")}
    # Concurrent: the wall time is below the sum of the checks' own times (a ratio, not a
    # timing bound: the checks slow down together on a loaded machine).
    assert report["seconds"] < sum(check["seconds"] for check in report["checks"])
    for secret in _secrets(applied):
        assert secret.reveal() not in result.output
        assert secret.reveal() not in junit.read_text()

    suite = ET.parse(junit).getroot()
    assert suite.tag == "testsuite" and suite.get("failures") == str(len(red))
    assert [case.get("name") for case in suite.iter("testcase")] == [c.name for c in CHECKS]

    assert made, "the lock checks made no session"
    assert still_there(applied.management, made) == []
    for job in applied.spec.jobs:  # no lock key, no tick record of a check is left
        left = [k for k in applied.management.kv.keys(job.prefix) if ".lockctl-verify" in k]
        assert left == []


def test_table_output_and_exit_code(applied: Applied) -> None:
    args = ["verify", "--spec", str(applied.spec_file), "--secrets-dir", str(applied.secrets_dir)]
    result = runner.invoke(app, [*args, "--only", "fencing-index"], env=_env(applied))
    assert result.exit_code == 0, result.output
    assert "fencing-index" in result.output and "PASS" in result.output
    assert "all checks passed" in result.output


def test_unknown_check_name_is_an_input_error(applied: Applied) -> None:
    result = runner.invoke(app, ["verify", "--spec", str(applied.spec_file), "--only", "nope"])
    assert result.exit_code == 2
    assert "--only nope: no such check" in result.output


@pytest.fixture
def anonymous_can_write(tmp_path: Path) -> Iterator[Applied]:
    """A cluster of its own, correct but for its anonymous token, which may write every key and
    make sessions. (On the shared cluster, every request without a token, and any other test's
    verify, would see that for as long as it lasted.)"""
    with private_consul(tmp_path / "consul", 45) as consul:
        run = uuid.uuid4().hex[:6]
        spec_file = tmp_path / "locks.hcl"
        spec_file.write_text(
            f'worker "{consul.node}" {{\n  address = "{consul.address()}"\n}}\n'
            f'job "anonymous-{run}" {{\n  prefix  = "verify-{run}/anonymous/"\n'
            f'  workers = ["{consul.node}"]\n}}\n'
        )
        applied = Applied(spec_file, tmp_path / "secrets", consul)
        applied.apply()
        rules = 'key_prefix "" { policy = "write" }\nsession_prefix "" { policy = "write" }\n'
        policy = applied.management.acl.create_policy(f"anonymous-writes-{run}", rules)
        applied.management.acl.update_token(ANONYMOUS_TOKEN, "Anonymous Token", [policy.name])
        yield applied


def test_anonymous_token_with_key_write_fails_anonymous_denied(
    anonymous_can_write: Applied,
) -> None:
    node = anonymous_can_write.spec.workers[0].name
    results = anonymous_can_write.verify("anonymous-denied", "acl-enabled")
    status, summary = results["anonymous-denied"]
    assert status == "fail"
    assert "session create with no token got 200, not 403" in summary
    assert "anonymous token grants session write" in summary
    assert results["acl-enabled"][0] == "fail"
    assert f"an anonymous read was allowed, not 403, on {node} (404)" in results["acl-enabled"][1]


def test_worker_token_with_key_prefix_everything_fails_confined(
    applied: Applied, tmp_path: Path
) -> None:
    management = applied.management
    name = f"verify-test-broad-{uuid.uuid4().hex[:6]}"
    policy = management.acl.create_policy(name, 'key_prefix "" { policy = "write" }\n')
    rendered = render_policies(applied.spec, find_templates_dir())
    worker_1 = next(t for t in rendered.tokens if t.worker == "worker-1")
    policies = [*worker_1.policies, name]  # what apply gives worker-1, plus everything
    broad = management.acl.create_token(
        "verify test: worker-1 with key_prefix everything", policies
    )
    try:
        assert broad.secret is not None
        write_secret_file(tmp_path / "worker-1.token", broad.secret)
        write_secret_file(
            tmp_path / "worker-2.token", read_secret_file(applied.secrets_dir / "worker-2.token")
        )
        results = applied.verify("worker-token-confined", secrets_dir=tmp_path)
        status, summary = results["worker-token-confined"]
        assert status == "fail"
        assert "worker-1's token got 200 True, not 403" in summary
    finally:
        management.acl.delete_token(broad.accessor_id)
        management.acl.delete_policy(policy.id)


def test_a_worker_token_cannot_pause_resume_or_trigger(applied: Applied, tmp_path: Path) -> None:
    """Green with the rendered policies (read on the job's control keys, no write); red for a
    token that may also write them, which could pause, resume or trigger its jobs."""
    status, summary = applied.verify("worker-token-control")["worker-token-control"]
    assert (status, summary) == (
        "pass",
        "worker tokens read their jobs' control keys and get 403 on pause, resume, trigger",
    )
    management = applied.management
    name = f"verify-test-control-{uuid.uuid4().hex[:6]}"
    job = applied.spec.jobs_for("worker-1")[0].name
    # the same folder as the lock policy's read: Consul takes the longest prefix that matches,
    # so a grant on lockctl/control/ alone would not widen it
    rules = f'key_prefix "lockctl/control/{job}/" {{ policy = "write" }}\n'
    policy = management.acl.create_policy(name, rules)
    rendered = render_policies(applied.spec, find_templates_dir())
    worker_1 = next(t for t in rendered.tokens if t.worker == "worker-1")
    broad = management.acl.create_token(
        "verify test: worker-1 that may write control keys", [*worker_1.policies, name]
    )
    try:
        assert broad.secret is not None
        write_secret_file(tmp_path / "worker-1.token", broad.secret)
        # a fresh token reaches the followers a moment after the leader (CONSUL_FACTS.md)
        eventually_usable(applied.cluster.client("worker-1", broad.secret))
        results = applied.verify("worker-token-control", secrets_dir=tmp_path)
        status, summary = results["worker-token-control"]
        assert status == "fail"
        assert "worker-1's token got 200 False, not 403: pause" in summary, summary
        assert "resume" in summary and "trigger" in summary and "forge a past pause" in summary
        # the writes were sent with a cas index no key has: nothing was paused
        assert management.kv.get(f"lockctl/control/{job}/paused")[0] is None
    finally:
        management.acl.delete_token(broad.accessor_id)
        management.acl.delete_policy(policy.id)


def test_a_worker_token_cannot_abort_a_run(applied: Applied, tmp_path: Path) -> None:
    """Green with the rendered policies (read on the job's control keys, no write); red for a
    token that may also write them, which could stop another replica's run."""
    status, summary = applied.verify("worker-token-abort")["worker-token-abort"]
    assert (status, summary) == ("pass", "worker tokens get 403 writing their jobs' abort key")
    management = applied.management
    name = f"verify-test-abort-{uuid.uuid4().hex[:6]}"
    job = applied.spec.jobs_for("worker-1")[0].name
    rules = f'key_prefix "lockctl/control/{job}/" {{ policy = "write" }}\n'
    policy = management.acl.create_policy(name, rules)
    rendered = render_policies(applied.spec, find_templates_dir())
    worker_1 = next(t for t in rendered.tokens if t.worker == "worker-1")
    broad = management.acl.create_token(
        "verify test: worker-1 that may abort", [*worker_1.policies, name]
    )
    try:
        assert broad.secret is not None
        write_secret_file(tmp_path / "worker-1.token", broad.secret)
        eventually_usable(applied.cluster.client("worker-1", broad.secret))
        status, summary = applied.verify("worker-token-abort", secrets_dir=tmp_path)[
            "worker-token-abort"
        ]
        assert status == "fail"
        assert "worker-1's token got 200 False, not 403: abort" in summary, summary
        assert management.kv.get(f"lockctl/control/{job}/abort")[0] is None  # cas: nothing
    finally:
        management.acl.delete_token(broad.accessor_id)
        management.acl.delete_policy(policy.id)


def test_a_worker_token_cannot_break_another_workers_session(
    applied: Applied, tmp_path: Path
) -> None:
    """Green with the rendered policies (session write on the worker's own node only); red for
    a worker token that may also write every node's sessions, which could break any lock."""
    status, summary = applied.verify("worker-token-break")["worker-token-break"]
    assert (status, summary) == (
        "pass",
        "worker tokens get 403 destroying another worker's session, and destroy their own",
    )
    management = applied.management
    name = f"verify-test-break-{uuid.uuid4().hex[:6]}"
    policy = management.acl.create_policy(name, 'session_prefix "" { policy = "write" }\n')
    rendered = render_policies(applied.spec, find_templates_dir())
    worker_1 = next(t for t in rendered.tokens if t.worker == "worker-1")
    broad = management.acl.create_token(
        "verify test: worker-1 that may write every node's sessions", [*worker_1.policies, name]
    )
    try:
        assert broad.secret is not None
        write_secret_file(tmp_path / "worker-1.token", broad.secret)
        write_secret_file(
            tmp_path / "worker-2.token", read_secret_file(applied.secrets_dir / "worker-2.token")
        )
        eventually_usable(applied.cluster.client("worker-1", broad.secret))
        results = applied.verify("worker-token-break", secrets_dir=tmp_path)
        status, summary = results["worker-token-break"]
        assert status == "fail"
        assert "worker-1's token got 200 True, not 403, destroying a session on worker-2" in summary
        assert "worker-2's token" not in summary  # its own policy: 403 on worker-1's session
    finally:
        management.acl.delete_token(broad.accessor_id)
        management.acl.delete_policy(policy.id)


def test_the_break_probe_renews_its_victim_and_makes_another_if_it_expired(
    applied: Applied,
) -> None:
    """A destroy of an expired session answers 200 whoever asks: on a slow cluster a denied
    token would look like one that broke another's lock. So each victim is renewed just before
    its probe, and one that is gone is replaced by a new session of the same worker's."""
    ctx = applied.context()
    evidence = Evidence()
    client = ctx.client("worker-2")
    try:
        gone = verify_session(ctx, client, "break")
        applied.management.session.destroy(gone)  # as its TTL running out would
        fresh = alive_session(ctx, "worker-2", gone, evidence)
        assert fresh != gone and client.session.info(fresh, consistency="consistent") is not None
        assert evidence.lines == [
            "worker-2: its session had expired before the probe; made another"
        ]
        assert alive_session(ctx, "worker-2", fresh, evidence) == fresh  # alive: renewed, kept
        assert len(evidence.lines) == 1
    finally:
        assert ctx.cleanup.run() == 0


def test_the_operators_token_may_break_and_one_without_the_session_rules_may_not(
    applied: Applied, operator_file: Path, tmp_path: Path
) -> None:
    args = ["verify", "--spec", str(applied.spec_file), "--secrets-dir", str(applied.secrets_dir)]
    args += ["--only", "operator-token-break", "--json", "--evidence"]
    allowed = runner.invoke(
        app, [*args, "--operator-token-file", str(operator_file)], env=_env(applied)
    )
    assert allowed.exit_code == 0, allowed.output
    (check,) = json.loads(allowed.stdout)["checks"]
    assert check["summary"] == (
        "the operators' token reads, judges and destroys a session on every worker's node"
    )
    # pause and trigger only: no session or node rule
    with _operator_token(applied, OPERATOR_KEYS, tmp_path / "narrow.token"):
        refused = runner.invoke(
            app, [*args, "--operator-token-file", str(tmp_path / "narrow.token")], env=_env(applied)
        )
    assert refused.exit_code == 1, refused.output
    (check,) = json.loads(refused.stdout)["checks"]
    summary = check["summary"]
    print(f"\noperator-token-break with only the pause and trigger rules: {summary}")  # docs
    assert 'cannot read sessions on worker-1 (session "worker-1" write)' in summary, summary
    assert "cannot read worker-2's health (node read)" in summary
    assert "got 403 destroying a session on worker-2: " in summary


def test_policy_edited_by_hand_fails_live_policies_lint(applied: Applied) -> None:
    management = applied.management
    job = applied.spec.jobs[0]
    name = f"lock-{job.name}"
    policy = policy_named(management, name)
    assert policy is not None and policy.rules is not None
    management.acl.update_policy(policy.id, name, 'key_prefix "" { policy = "write" }\n')
    try:
        status, summary = applied.verify("live-policies-lint")["live-policies-lint"]
        assert status == "fail"
        assert f"policy {name} in Consul differs from the rendered one" in summary
        assert f"policy {name} in Consul has lint errors" in summary
    finally:
        management.acl.update_policy(policy.id, name, policy.rules, policy.description)
    assert applied.verify("live-policies-lint")["live-policies-lint"][0] == "pass"


def test_live_policies_lint_renders_with_the_given_templates(
    applied: Applied, tmp_path: Path
) -> None:
    """Applied with lockctl's templates, so a folder whose lock policy differs must fail, and
    lockctl's own templates given as a folder must pass: the check renders with --templates-dir."""
    own = tmp_path / "templates"
    for source in CHECKOUT_TEMPLATES.rglob("*.j2"):
        target = own / source.relative_to(CHECKOUT_TEMPLATES)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(source.read_text())
    args = ["verify", "--spec", str(applied.spec_file), "--secrets-dir", str(applied.secrets_dir)]
    args += ["--only", "live-policies-lint", "--json", "--templates-dir", str(own)]
    same = runner.invoke(app, args, env=_env(applied))
    assert same.exit_code == 0, same.output
    lock = own / "policies" / "lock.hcl.j2"
    lock.write_text(lock.read_text() + 'key "{{ job.prefix }}readme" {\n  policy = "deny"\n}\n')
    differs = runner.invoke(app, args, env=_env(applied))
    assert differs.exit_code == 1, differs.output
    (check,) = json.loads(differs.stdout)["checks"]
    assert "in Consul differs from the rendered one" in check["summary"]


def test_default_policy_allow_fails_acl_enabled(applied: Applied, tmp_path: Path) -> None:
    """A cluster whose agents say default_policy = "allow" (from edited templates)."""
    templates = tmp_path / "templates"
    for source in CHECKOUT_TEMPLATES.rglob("*.j2"):
        target = templates / source.relative_to(CHECKOUT_TEMPLATES)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(source.read_text().replace('"deny"', '"allow"'))
    state = tmp_path / "cluster"
    up = cluster_up(state, ClusterShape(subnet=ALLOW_SUBNET), templates_dir=templates)
    try:
        layout = up.status.layout
        inventory = tmp_path / "inventory.json"
        inventory.write_text(json.dumps({a.name: a.http_address for a in layout.workers}))
        env = {
            "CONSUL_HTTP_ADDR": layout.servers[0].http_address,
            "CONSUL_HTTP_TOKEN_FILE": str(layout.management_token_file),
            **dict(tls.tls_exports(layout)),  # this cluster's own CA, not the session's
        }
        args = ["verify", "--spec", str(applied.spec_file), "--inventory", str(inventory)]
        table = runner.invoke(app, [*args, "--only", "acl-enabled"], env=env)
        assert table.exit_code == 1, table.output
        assert "FAILED: acl-enabled" in table.output
        assert "worker-1: ACLsEnabled=True ACLDefaultPolicy=allow" in table.output  # evidence
        as_json = runner.invoke(app, [*args, "--only", "acl-enabled", "--json"], env=env)
        (check,) = json.loads(as_json.output)["checks"]
        assert check["status"] == "fail"
        assert "worker-1: ACLsEnabled=True, default policy allow" in check["summary"]
        assert "ACLs are off or default_policy is allow" in check["summary"]
    finally:
        cluster_down(state)


def test_tick_once_names_the_winner_and_refuses_the_tick_after_release(applied: Applied) -> None:
    args = ["verify", "--spec", str(applied.spec_file), "--secrets-dir", str(applied.secrets_dir)]
    result = runner.invoke(app, [*args, "--only", "tick-once", "--json"], env=_env(applied))
    assert result.exit_code == 0, result.output
    (check,) = json.loads(result.output)["checks"]
    assert check["status"] == "pass", check
    race, told, completed, again, following = check["evidence"]
    winner = "worker-1" if "worker-1 won" in race else "worker-2"
    loser = "worker-2" if winner == "worker-1" else "worker-1"
    assert f"{winner} won (LockIndex " in race
    assert f"{loser} refused (tick taken, lock: " in race  # lost on both counts
    assert told.endswith(f"taken by {winner}")
    assert f"{winner} completed tick 1970-" in completed
    assert again.endswith(f"{loser} refused (tick taken)")  # the lock was free: the tick alone
    assert f"{loser} won (LockIndex " in following
    assert f"told it was taken by {winner}" in check["summary"]
    job = applied.spec.jobs[0]
    left = [k for k in applied.management.kv.keys(job.prefix) if ".lockctl-verify" in k]
    assert left == []


class LockOnlyLedger(Ledger):
    """A claim that lost its first operation (check-not-exists on the tick): the lock alone
    decides, as before the ledger. It still writes the record, so only exactly-once breaks."""

    def claim(self, record: TickRecord, holder: bytes, session_id: str) -> Claim:
        key = self.key(record.tick)
        answer = self.consul.txn.kv(
            [
                KVOp("lock", self.lock_key, holder, session=session_id),
                KVOp("set", key, record.encode()),
                KVOp("get", self.lock_key),
            ]
        )
        if not answer.applied:
            refusal = answer.failed(0)
            return Claim(False, lock_refusal=None if refusal is None else refusal.what)
        lock, written = answer.entry(self.lock_key), answer.entry(key)
        assert lock is not None and written is not None
        return Claim(True, lock.lock_index, lock.modify_index, written.modify_index)


def test_tick_once_fails_when_the_claim_does_not_check_the_tick(applied: Applied) -> None:
    """The same check through a claim that takes the lock but does not check the tick: one of
    the racers still wins (the lock is exclusive), but the tick runs again after release."""
    ctx = applied.context()
    evidence = Evidence()
    try:
        with pytest.raises(CheckFailed) as failed:
            tick_once(ctx, evidence, LockOnlyLedger)
    finally:
        ctx.cleanup.run()
    tick = scratch_tick(ctx.run_id).strftime("%Y-%m-%dT%H:%M:%SZ")
    message = str(failed.value)
    assert f"a second claim of tick {tick} after release won: the tick would run twice" in message
    assert f"lost the race but was not told tick {tick} is taken" in message
    job = applied.spec.jobs[0]
    left = [k for k in applied.management.kv.keys(job.prefix) if ".lockctl-verify" in k]
    assert left == []


def _secrets(applied: Applied) -> list[Secret]:
    return [read_secret_file(p) for p in sorted(applied.secrets_dir.glob("*.token"))]
