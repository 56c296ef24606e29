"""Workload identity on the real cluster: apply creates the auth method, roles and binding rules,
a second apply changes nothing, a changed claim updates only its binding rule, --prune deletes
only lockctl's own; and a JWT the test signs (as a service-account issuer would, RS256 with a
key made here, a JWT signed with PyJWT) logs in as worker-1 with exactly its privileges.

`--prune` deletes every lockctl-managed object its spec does not name, roles and binding rules
included, whoever made them, and the first apply's exact list of creations holds only where no
earlier test left a `worker-<w>` role: the apply-then-prune test runs on a Consul of its own
(private_consul.py). The login test needs the real nodes, so it runs on the shared cluster
under names of its own, and deletes what its spec made (test_apply.Env)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.consul import Consul, PermissionDenied
from provision.consul.errors import ConsulError
from provision.system.secrets import Secret
from tests.conftest import LiveCluster
from tests.integration.named_reads import binding_rules_of, role_named, worker_tokens
from tests.integration.private_consul import PrivateConsul, private_consul
from tests.integration.test_apply import Env, env_on
from tests.jwt_issuer import ISSUER, make_key, sign_jwt


def _spec(workers: dict[str, str], method: str = "it-k8s", uid: str = "") -> str:
    """A spec whose workers (name -> service account) log in through `method`; each worker's
    job is `it-<worker><uid>`, on the prefix `it/<worker><uid>/`."""
    out = [
        f'auth_method "{method}" {{\n  type = "jwt"\n  bound_issuer = "{ISSUER}"\n'
        '  bound_audiences = ["consul"]\n  jwt_validation_pub_keys_file = "issuer.pem"\n'
        '  max_token_ttl = "5m"\n  claim_mappings {\n'
        '    namespace = "/kubernetes.io/namespace"\n'
        '    service_account = "/kubernetes.io/serviceaccount/name"\n  }\n}\n'
    ]
    for worker, account in workers.items():
        out.append(
            f'worker "{worker}" {{\n  identity {{\n    auth_method = "{method}"\n'
            f'    claims {{\n      namespace = "it"\n      service_account = "{account}"\n'
            "    }\n  }\n}\n"
        )
    for worker in workers:
        job = f"{worker}{uid}"
        out.append(f'job "it-{job}" {{\n  prefix = "it/{job}/"\n  workers = ["{worker}"]\n}}\n')
    return "".join(out)


@pytest.fixture
def env(
    tmp_path: Path, live_cluster: LiveCluster, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Env]:
    make_key(tmp_path)  # issuer.key, issuer.pem
    yield from env_on(live_cluster, tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def own_consul(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateConsul]:
    with private_consul(tmp_path_factory.mktemp("own-consul"), 44) as consul:
        yield consul


@pytest.fixture
def own_env(
    tmp_path: Path, own_consul: PrivateConsul, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Env]:
    make_key(tmp_path)
    yield from env_on(own_consul, tmp_path, monkeypatch)


def _apply(env: Env, text: str, *extra: str) -> dict[str, object]:
    env.write_text(text)
    result = env.run("apply", "--json", *extra)
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert isinstance(record, dict)
    return record


ROLES = ("worker-worker-1", "worker-worker-2", "it-theirs")  # the roles this module makes


def _mine(consul: Consul) -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
    """The roles this module makes and the binding rules of its auth method, each role read by
    its name (not the lists of every role and binding rule in the cluster)."""
    found = {name: role_named(consul, name) for name in ROLES}
    roles = {name: role.policy_names for name, role in found.items() if role is not None}
    rules = {r.bind_name: r.selector for r in binding_rules_of(consul, "it-k8s")}
    return roles, rules


def test_apply_creates_then_changes_nothing_then_updates_a_claim_then_prunes(
    own_env: Env,
) -> None:
    env = own_env
    mgmt = env.cluster.management()
    theirs = mgmt.identity.create_role("it-theirs", "made by hand", [])
    first = _apply(env, _spec({"worker-1": "sa-1", "worker-2": "sa-2"}))
    made = [(c["action"], c["kind"], c["name"]) for c in first["identity"]]  # type: ignore[union-attr]
    assert made == [
        ("create", "auth-method", "it-k8s"),
        ("create", "role", "worker-worker-1"),
        ("create", "role", "worker-worker-2"),
        ("create", "binding-rule", "worker-1"),
        ("create", "binding-rule", "worker-2"),
    ]
    assert mgmt.identity.read_auth_method("it-k8s").name == "it-k8s"
    roles, rules = _mine(mgmt)
    assert roles["worker-worker-1"] == ("lock-it-worker-1", "session-worker-1")
    assert rules["worker-worker-2"] == (
        'value.namespace == "it" and value.service_account == "sa-2"'
    )
    again = _apply(env, _spec({"worker-1": "sa-1", "worker-2": "sa-2"}))
    assert again["changes_pending"] is False and again["applied"] == 0
    changed = _apply(env, _spec({"worker-1": "sa-1", "worker-2": "sa-2b"}))
    assert changed["identity"] == [
        {
            "action": "update",
            "kind": "binding-rule",
            "name": "worker-2",
            "reason": "selector differs (the worker's claims changed)",
        }
    ]
    assert _mine(mgmt)[1]["worker-worker-2"].endswith('"sa-2b"')
    (worker_2_token,) = worker_tokens(mgmt, "worker-2")
    pruned = _apply(env, _spec({"worker-1": "sa-1"}), "--prune")
    deleted = {(c["kind"], c["name"]) for c in pruned["identity"]}  # type: ignore[union-attr]
    assert deleted == {("binding-rule", "worker-2"), ("role", "worker-worker-2")}
    # everything on its Consul is its own: what --prune deletes there is known exactly
    policies = sorted((c["action"], c["name"]) for c in pruned["policies"])  # type: ignore[union-attr]
    assert policies == [("delete", "lock-it-worker-2"), ("delete", "session-worker-2")]
    tokens = [(c["action"], c["accessor_id"]) for c in pruned["tokens"]]  # type: ignore[union-attr]
    assert tokens == [("delete", worker_2_token)]
    roles, rules = _mine(mgmt)
    assert "worker-worker-2" not in roles and "worker-worker-2" not in rules
    assert "worker-worker-1" in roles and "it-theirs" in roles  # unmanaged: untouched
    mgmt.identity.delete_role(theirs.id)


# --- login with a JWT the test signs --------------------------------------------------------


def _jwt(key: Path, namespace: str, account: str) -> Secret:
    """An RS256 JWT with a projected service-account token's claims, signed by `key`."""
    return Secret(sign_jwt(key, namespace, account, lifetime=300))


def test_a_login_as_worker_1_gets_exactly_its_privileges_and_a_stranger_none(env: Env) -> None:
    """On the shared cluster (sessions on the real nodes): its auth method and jobs carry its
    uid; the worker-<w> roles, session policies and tokens are the real nodes' names."""
    method, uid = env.name("it-login"), f"-{env.uid}"
    _apply(env, _spec({"worker-1": "sa-1", "worker-2": "sa-2"}, method=method, uid=uid))
    anonymous = env.cluster.client(token=None)
    token = anonymous.identity.login(method, _jwt(env.tmp / "issuer.key", "it", "sa-1"))
    assert token.secret is not None
    as_worker = env.cluster.client(token=token.secret)
    try:
        session = as_worker.session.create(name="it-login", ttl=15, lock_delay=0, node="worker-1")
        assert as_worker.kv.put(f"it/worker-1{uid}/x.lock", b"1", acquire=session)
        with pytest.raises(PermissionDenied):
            as_worker.kv.put(f"it/worker-2{uid}/x.lock", b"1", acquire=session)
        with pytest.raises(PermissionDenied):
            as_worker.session.create(name="it-login", ttl=15, lock_delay=0, node="worker-2")
        as_worker.session.destroy(session)
    finally:
        anonymous.identity.logout(token.secret)
        env.cluster.management().kv.delete(f"it/worker-1{uid}/", recurse=True)
    with pytest.raises(PermissionDenied):
        as_worker.acl.read_self_token()
    with pytest.raises(PermissionDenied):  # no binding rule selects this identity
        anonymous.identity.login(method, _jwt(env.tmp / "issuer.key", "it", "sa-9"))
    with pytest.raises(ConsulError):  # Consul answers 500 for a bad signature (CONSUL_FACTS)
        other, _ = make_key(env.tmp, "other")
        anonymous.identity.login(method, _jwt(other, "it", "sa-1"))
