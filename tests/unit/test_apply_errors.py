"""apply/rotate on answers a healthy real server does not give on demand (responses-mocked):
an ambiguous failed create that did take effect, a create answer without a secret or with a
redacted one, a read-back naming another token, and stopping at the first refused write."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import responses

from provision.acl import rotate as rotate_module
from provision.acl import writes as writes_module
from provision.acl.apply import ApplyFailed, apply_plan
from provision.acl.plan import Plan, PolicyChange, TokenChange
from provision.acl.rotate import rotate_worker_token
from provision.acl.writes import ACLPermissionError
from provision.consul import Consul, ConsulSettings, RetryPolicy
from provision.errors import EXIT_DENIED, EXIT_ENVIRONMENT, InputError, LocalEnvironmentError
from provision.system.secrets import Secret

ADDRESS = "http://consul.test:8500"
MGMT = "11111111-2222-3333-4444-555555555555"
NEW_SECRET = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"


@pytest.fixture
def consul(monkeypatch: pytest.MonkeyPatch) -> Consul:
    monkeypatch.setattr(writes_module, "RETRY_PAUSE", 0.0)
    monkeypatch.setattr(rotate_module, "RETRY_PAUSE", 0.0)
    settings = ConsulSettings(address=ADDRESS, token=Secret(MGMT), timeout=1)
    return Consul(settings, retry=RetryPolicy(deadline=0.0))


def _lock_answers() -> None:
    """lockctl's own lock (rotate takes it): a session, an acquire, the session destroyed."""
    responses.put(f"{ADDRESS}/v1/session/create", json={"ID": "lock-session"})
    responses.put(f"{ADDRESS}/v1/kv/lockctl/apply.lock", json=True)
    responses.put(f"{ADDRESS}/v1/session/destroy/lock-session", json=True)


def _policy_plan(n: int) -> Plan:
    changes = tuple(
        PolicyChange("create", f"lock-j{i}", "new", None, "lockctl-managed: x", "key {}")
        for i in range(n)
    )
    return Plan(changes, (), 0, 0)


@responses.activate
def test_a_failed_create_that_took_effect_is_adopted_not_duplicated(
    consul: Consul, tmp_path: Path
) -> None:
    responses.put(f"{ADDRESS}/v1/acl/policy", status=500, body="rpc error: leadership lost")
    listed = [{"ID": "p1", "Name": "lock-j0", "Description": "", "Hash": "x"}]
    responses.get(f"{ADDRESS}/v1/acl/policies", json=listed)
    updated = {
        "ID": "p1",
        "Name": "lock-j0",
        "Description": "lockctl-managed: x",
        "Rules": "key {}",
    }
    responses.put(f"{ADDRESS}/v1/acl/policy/p1", json=updated)
    result = apply_plan(consul, _policy_plan(1), tmp_path, concurrency=1)
    assert result.applied == 1
    creates = [c for c in responses.calls if c.request.url == f"{ADDRESS}/v1/acl/policy"]
    assert len(creates) == 1  # no second create once the policy was seen


@responses.activate
def test_a_failed_token_create_that_took_effect_is_adopted(consul: Consul, tmp_path: Path) -> None:
    responses.put(f"{ADDRESS}/v1/acl/token", status=500, body="No cluster leader")
    made = {"AccessorID": "t1", "Description": "lockctl worker w1", "Policies": []}
    responses.get(f"{ADDRESS}/v1/acl/tokens", json=[made])
    responses.get(f"{ADDRESS}/v1/acl/token/t1", json={**made, "SecretID": NEW_SECRET})
    change = TokenChange("create", "w1", "new", None, "lockctl worker w1", ("session-w1",))
    apply_plan(consul, Plan((), (change,), 0, 0), tmp_path, concurrency=1)
    assert (tmp_path / "w1.token").read_text().strip() == NEW_SECRET
    assert len([c for c in responses.calls if c.request.method == "PUT"]) == 1


@responses.activate
def test_a_create_answer_without_a_secret_is_an_error_without_secrets(
    consul: Consul, tmp_path: Path
) -> None:
    responses.put(
        f"{ADDRESS}/v1/acl/token",
        json={"AccessorID": "t1", "Description": "lockctl worker w1", "Policies": []},
    )
    change = TokenChange("create", "w1", "new", None, "lockctl worker w1", ("session-w1",))
    with pytest.raises(ApplyFailed, match="no secret") as caught:
        apply_plan(consul, Plan((), (change,), 0, 0), tmp_path, concurrency=1)
    assert caught.value.exit_code == EXIT_ENVIRONMENT
    assert MGMT not in str(caught.value)
    assert not (tmp_path / "w1.token").exists()


@responses.activate
@pytest.mark.parametrize(
    "shown", ["<hidden>", "not-a-uuid", "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee\nx"]
)
def test_a_redacted_secret_is_never_written(consul: Consul, tmp_path: Path, shown: str) -> None:
    """A management token with acl = "read" is shown SecretID "<hidden>": refused with exit 4,
    naming the permission, and no token file is written (it once wrote "<hidden>", exit 0)."""
    token = {"AccessorID": "t1", "Description": "lockctl worker w1", "Policies": []}
    responses.get(f"{ADDRESS}/v1/acl/token/t1", json={**token, "SecretID": shown})
    change = TokenChange("write-secret", "w1", "token file missing", "t1", "lockctl worker w1")
    with pytest.raises(ApplyFailed) as caught:
        apply_plan(consul, Plan((), (change,), 0, 0), tmp_path, concurrency=1)
    assert caught.value.exit_code == EXIT_DENIED
    assert 'needs acl = "write" to read token secrets' in str(caught.value)
    assert "\n" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []


@responses.activate
def test_first_refused_write_stops_new_calls(consul: Consul, tmp_path: Path) -> None:
    body = f"Permission denied for token {MGMT}"
    responses.put(f"{ADDRESS}/v1/acl/policy", status=403, body=body)
    with pytest.raises(ACLPermissionError) as caught:
        apply_plan(consul, _policy_plan(20), tmp_path, concurrency=2)
    message = str(caught.value)
    assert caught.value.exit_code == EXIT_DENIED
    assert 'acl = "write"' in message and "0 of 20 changes were applied" in message
    assert MGMT not in message
    assert len(responses.calls) <= 2  # the two in flight; none started after the refusal


@responses.activate
def test_rotate_keeps_the_old_token_when_read_back_names_another(
    consul: Consul, tmp_path: Path
) -> None:
    old = {"AccessorID": "old", "Description": "lockctl worker w1", "Policies": [{"Name": "p"}]}
    responses.get(f"{ADDRESS}/v1/acl/tokens", json=[old])
    new = {"AccessorID": "new", "Description": "lockctl worker w1", "Policies": [{"Name": "p"}]}
    responses.put(f"{ADDRESS}/v1/acl/token", json={**new, "SecretID": NEW_SECRET})
    responses.get(f"{ADDRESS}/v1/acl/token/self", json={**new, "AccessorID": "someone-else"})
    _lock_answers()
    with pytest.raises(LocalEnvironmentError, match="old token kept") as caught:
        rotate_worker_token(consul, "w1", tmp_path, read_back_deadline=0)
    assert NEW_SECRET not in str(caught.value)
    assert not [c for c in responses.calls if c.request.method == "DELETE"]
    (create,) = [c for c in responses.calls if c.request.url == f"{ADDRESS}/v1/acl/token"]
    assert json.loads(create.request.body or b"{}")["Policies"] == [{"Name": "p"}]
    assert responses.calls[-1].request.url == f"{ADDRESS}/v1/session/destroy/lock-session"


@responses.activate
def test_rotate_keeps_the_old_token_when_consul_never_accepts_the_new_one(
    consul: Consul, tmp_path: Path
) -> None:
    old = {"AccessorID": "old", "Description": "lockctl worker w1", "Policies": []}
    responses.get(f"{ADDRESS}/v1/acl/tokens", json=[old])
    responses.put(
        f"{ADDRESS}/v1/acl/token", json={**old, "AccessorID": "new", "SecretID": NEW_SECRET}
    )
    responses.get(f"{ADDRESS}/v1/acl/token/self", status=403, body="ACL not found")
    _lock_answers()
    with pytest.raises(LocalEnvironmentError, match="old token was kept"):
        rotate_worker_token(consul, "w1", tmp_path, read_back_deadline=0)
    assert not [c for c in responses.calls if c.request.method == "DELETE"]


@responses.activate
def test_rotate_refuses_a_redacted_new_secret(consul: Consul, tmp_path: Path) -> None:
    old = {"AccessorID": "old", "Description": "lockctl worker w1", "Policies": []}
    responses.get(f"{ADDRESS}/v1/acl/tokens", json=[old])
    responses.put(
        f"{ADDRESS}/v1/acl/token", json={**old, "AccessorID": "new", "SecretID": "<hidden>"}
    )
    _lock_answers()
    with pytest.raises(ACLPermissionError, match='needs acl = "write"') as caught:
        rotate_worker_token(consul, "w1", tmp_path, read_back_deadline=0)
    assert caught.value.exit_code == EXIT_DENIED
    assert list(tmp_path.iterdir()) == []
    assert not [c for c in responses.calls if c.request.method == "DELETE"]


@pytest.mark.parametrize("name", ["../outside", "a/b", "", "W1", "x" * 65])
def test_rotate_checks_the_worker_name_before_any_call(
    consul: Consul, tmp_path: Path, name: str
) -> None:
    """A token described `lockctl worker ../outside` once made rotate write outside the folder."""
    with responses.RequestsMock() as mocked:  # any HTTP call would fail the test
        with pytest.raises(InputError, match="not a valid worker name"):
            rotate_worker_token(consul, name, tmp_path / "secrets")
        assert not mocked.calls
    assert not (tmp_path / "secrets").exists()
    assert list(tmp_path.iterdir()) == []
