"""The Consul client against the real 5-agent cluster (Consul 1.8.7, ACLs on, default deny).

Every object a test makes has a uuid in its name and is deleted by a fixture finalizer, so tests
are independent and can run in any order.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from provision.consul import (
    NO_RETRY,
    Consul,
    ConsulError,
    ConsulHTTPError,
    ConsulServerError,
    NotFound,
    PermissionDenied,
)
from provision.consul.models import Policy, Token
from provision.consul.transport import Call, Sending
from provision.system.secrets import Secret
from tests.integration.named_reads import carrying, policy_named, tokens_with_policy

if TYPE_CHECKING:
    from conftest import LiveCluster


T = TypeVar("T")
PROPAGATION = 10.0  # seconds a new token may take to be known by every server


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def eventually(call: Callable[[], T], deadline: float = PROPAGATION) -> T:
    """Retry `call` while Consul says 403: a freshly minted token reaches followers a moment
    after the leader (CONSUL_FACTS.md). Anything else fails at once."""
    give_up_at = time.monotonic() + deadline
    while True:
        try:
            return call()
        except PermissionDenied:
            if time.monotonic() > give_up_at:
                raise
            time.sleep(0.1)


def bogus() -> Secret:
    return Secret(str(uuid.uuid4()))


# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture
def mgmt(live_cluster: LiveCluster) -> Consul:
    return live_cluster.management("server-1")


@pytest.fixture
def prefix(mgmt: Consul) -> Iterator[str]:
    """A KV folder of this test's own, deleted (recursively) at the end."""
    name = f"lockctl-test/{uuid.uuid4().hex}/"
    yield name
    mgmt.kv.delete(name, recurse=True)
    entry, _ = mgmt.kv.get(name + "probe")
    assert entry is None


class Minted:
    """Policies and tokens made by one test, every name and description carrying its `uid`
    (a list answer is narrowed to them by it); `cleanup` deletes all of them."""

    def __init__(self, mgmt: Consul) -> None:
        self.mgmt = mgmt
        self.uid = uuid.uuid4().hex[:12]
        self.policies: list[Policy] = []
        self.tokens: list[Token] = []
        self._made = 0

    def name(self, kind: str) -> str:
        """A new name (or description) of this test's: `lockctl-test-<kind>-<uid>-<n>`."""
        self._made += 1
        return f"lockctl-test-{kind}-{self.uid}-{self._made}"

    def policy(self, rules: str, description: str = "") -> Policy:
        policy = self.mgmt.acl.create_policy(self.name("policy"), rules, description)
        self.policies.append(policy)
        return policy

    def token(self, *rules: str) -> Token:
        names = [self.policy(r).name for r in rules]
        token = self.mgmt.acl.create_token(self.name("token"), names)
        self.tokens.append(token)
        return token

    def cleanup(self) -> None:
        for token in self.tokens:
            with contextlib.suppress(NotFound, PermissionDenied):  # 1.8.7: 403 if gone
                self.mgmt.acl.delete_token(token.accessor_id)
        for policy in self.policies:
            with contextlib.suppress(NotFound, PermissionDenied):
                self.mgmt.acl.delete_policy(policy.id)


@pytest.fixture
def minted(mgmt: Consul) -> Iterator[Minted]:
    made = Minted(mgmt)
    yield made
    made.cleanup()


class Sessions:
    """Sessions made by one test, destroyed at the end (with the management token)."""

    def __init__(self, live_cluster: LiveCluster) -> None:
        self.live_cluster = live_cluster
        self.made: list[tuple[str, str]] = []

    def create(self, agent: str, token: Secret | None = None, lock_delay: float = 0) -> str:
        client = self.live_cluster.client(agent, token or self.live_cluster.management_token)
        session_id = eventually(
            lambda: client.session.create(
                name=unique("lockctl-test"), ttl=30, lock_delay=lock_delay
            )
        )
        self.made.append((agent, session_id))
        return session_id

    def cleanup(self) -> None:
        for agent, session_id in self.made:
            self.live_cluster.management(agent).session.destroy(session_id)


@pytest.fixture
def sessions(live_cluster: LiveCluster) -> Iterator[Sessions]:
    made = Sessions(live_cluster)
    yield made
    made.cleanup()


def token_secret(token: Token) -> Secret:
    assert token.secret is not None
    return token.secret


# --- status, agent, health ------------------------------------------------------------------


def test_leader_and_peers_are_the_three_servers(live_cluster: LiveCluster) -> None:
    servers = {f"{agent.address}:8300" for agent in live_cluster.layout.servers}
    leaders = {live_cluster.client(a.name).status.leader() for a in live_cluster.layout.agents}
    assert len(leaders) == 1
    assert leaders <= servers
    for name in ("server-2", "worker-1"):
        assert set(live_cluster.client(name).status.peers()) == servers


def test_agent_self_names_the_serving_node(live_cluster: LiveCluster) -> None:
    for agent in live_cluster.layout.agents:
        me = live_cluster.management(agent.name).agent.self()
        assert me["Config"]["NodeName"] == agent.name
        assert me["Config"]["Server"] is agent.server
        assert me["Member"]["Addr"] == agent.address


def test_agent_self_is_denied_without_a_token_and_with_a_bogus_one(
    live_cluster: LiveCluster,
) -> None:
    client = live_cluster.client("worker-1", None)
    with pytest.raises(PermissionDenied):
        client.agent.self()
    with pytest.raises(PermissionDenied):
        client.agent.self(token=bogus())


def test_members_are_the_five_agents_alive(live_cluster: LiveCluster) -> None:
    # The members list is what is under test; only the cluster's own agents are looked at.
    agents = {a.name for a in live_cluster.layout.agents}
    members = live_cluster.management("worker-2").agent.members()
    by_name = {m["Name"]: m for m in members if m["Name"] in agents}
    assert set(by_name) == agents
    assert {m["Status"] for m in by_name.values()} == {1}  # serf: 1 = alive
    assert by_name["server-1"]["Tags"]["role"] == "consul"
    assert by_name["worker-1"]["Tags"]["role"] == "node"


def test_every_node_has_a_passing_serf_health_check(live_cluster: LiveCluster) -> None:
    client = live_cluster.management("worker-1")
    # The state lists are what is under test; only the cluster's own agents are looked at.
    agents = {a.name for a in live_cluster.layout.agents}

    def serf(state: str) -> list[str]:
        checks = client.health.checks_in_state(state)
        return sorted(
            c["Node"] for c in checks if c["CheckID"] == "serfHealth" and c["Node"] in agents
        )

    assert serf("passing") == sorted(agents)
    assert serf("critical") == []
    assert serf("any") == sorted(agents)


def test_unknown_check_state(mgmt: Consul) -> None:
    """Measured: 1.8.7 answers an unknown state with 200 and an empty list."""
    try:
        assert mgmt.health.checks_in_state("sideways") == []
    except ConsulHTTPError as error:  # a stricter Consul may say 400
        assert type(error) is ConsulHTTPError
        assert error.status == 400


@pytest.mark.parametrize("checks", [(), ("serfHealth",)])
def test_session_checks_are_reported_back(
    live_cluster: LiveCluster, sessions: Sessions, checks: tuple[str, ...]
) -> None:
    """1.8.7 reports a session's checks as NodeChecks, not Checks."""
    worker = live_cluster.management("worker-1")
    session_id = worker.session.create(
        name=unique("lockctl-test"), ttl=15, lock_delay=0, checks=checks
    )
    sessions.made.append(("worker-1", session_id))
    info = worker.session.info(session_id)
    assert info is not None
    assert info.checks == checks
    assert worker.session.renew(session_id).checks == checks


def test_set_agent_token_is_applied_and_persisted(
    live_cluster: LiveCluster, mgmt: Consul, minted: Minted
) -> None:
    agent = next(a for a in live_cluster.layout.agents if a.name == "worker-2")
    description = "lockctl-managed: agent token for node worker-2"
    agent_policy = policy_named(mgmt, "agent-worker-2")
    assert agent_policy is not None
    (original,) = tokens_with_policy(mgmt, agent_policy.id)
    assert original.description == description
    original_secret = token_secret(mgmt.acl.read_token(original.accessor_id))
    replacement = minted.token('node "worker-2" { policy = "write" }')
    persisted = live_cluster.layout.data_dir(agent) / "acl-tokens.json"
    worker = live_cluster.management("worker-2")
    try:
        worker.agent.set_agent_token(token_secret(replacement))
        assert json.loads(persisted.read_text())["agent"] == token_secret(replacement).reveal()
    finally:
        worker.agent.set_agent_token(original_secret)
    assert json.loads(persisted.read_text())["agent"] == original_secret.reveal()


def test_set_agent_token_needs_agent_write(live_cluster: LiveCluster) -> None:
    client = live_cluster.client("worker-2", None)
    with pytest.raises(PermissionDenied) as caught:
        client.agent.set_agent_token(bogus())
    assert caught.value.exit_code == 4


# --- ACL bootstrap, policies, tokens --------------------------------------------------------


def test_bootstrap_on_a_bootstrapped_cluster_is_denied_at_once(mgmt: Consul) -> None:
    sent = mgmt.transport.count.value
    with pytest.raises(PermissionDenied) as caught:
        mgmt.acl.bootstrap()
    assert caught.value.status == 403
    assert mgmt.transport.count.value - sent == 1  # a 403 is final: not retried


def test_policy_create_read_update_list_delete(mgmt: Consul, minted: Minted) -> None:
    rules = 'key "lockctl-test/a" { policy = "read" }'
    created = minted.policy(rules, "first")
    assert created.name.startswith("lockctl-test-")
    assert (created.rules, created.description) == (rules, "first")
    assert mgmt.acl.read_policy(created.id) == created

    by_name = mgmt.acl.read_policy_by_name(created.name)
    assert by_name == created

    new_rules = 'key "lockctl-test/a" { policy = "write" }'
    updated = mgmt.acl.update_policy(created.id, created.name, new_rules, "second")
    assert updated.id == created.id
    assert (updated.rules, updated.description) == (new_rules, "second")
    assert updated.modify_index > created.modify_index
    assert mgmt.acl.read_policy(created.id).rules == new_rules

    # The list is what is under test; only this test's own policies are looked at in it.
    other = minted.policy('key "lockctl-test/b" { policy = "read" }')
    listed = {p.name: p for p in carrying(mgmt.acl.list_policies(), minted.uid)}
    assert set(listed) == {created.name, other.name}
    assert listed[created.name].id == created.id
    assert listed[created.name].rules is None  # list answers omit rules
    assert listed[other.name].id == other.id

    mgmt.acl.delete_policy(created.id)
    assert mgmt.acl.read_policy_by_name(created.name) is None
    assert [p.name for p in carrying(mgmt.acl.list_policies(), minted.uid)] == [other.name]


def test_missing_policy_name_is_none(mgmt: Consul) -> None:
    name = unique("lockctl-test-missing")
    raw = mgmt.transport
    with pytest.raises((PermissionDenied, NotFound)) as caught:
        raw.request(Call("GET", f"/v1/acl/policy/name/{name}"), Sending(retry=NO_RETRY))
    assert caught.value.status in (403, 404)  # 1.8.7: 403 "ACL not found"; newer: 404
    assert mgmt.acl.read_policy_by_name(name) is None


def test_read_policy_by_name_without_acl_read_is_denied_not_none(
    live_cluster: LiveCluster, minted: Minted
) -> None:
    """A caller that may not read ACLs must not be told "no such policy"."""
    key = f"lockctl-test/{minted.uid}/x"  # read only to learn the token is known everywhere
    existing = minted.policy(f'key "{key}" {{ policy = "read" }}')
    weak = minted.token(f'key "{key}" {{ policy = "read" }}')
    client = live_cluster.client("server-1", token_secret(weak))
    eventually(lambda: client.kv.get(key))
    for name in (existing.name, unique("lockctl-test-missing")):
        with pytest.raises(PermissionDenied):
            client.acl.read_policy_by_name(name)
    with pytest.raises(PermissionDenied):
        live_cluster.client("server-1", None).acl.read_policy_by_name(existing.name)
    with pytest.raises(PermissionDenied):
        live_cluster.client("server-1", bogus()).acl.read_policy_by_name(existing.name)


def test_read_deleted_policy_by_id_fails(mgmt: Consul, minted: Minted) -> None:
    policy = minted.policy('key "lockctl-test/y" { policy = "read" }')
    mgmt.acl.delete_policy(policy.id)
    with pytest.raises((NotFound, PermissionDenied)):
        mgmt.acl.read_policy(policy.id)


def test_token_create_read_self_update_list_delete(
    live_cluster: LiveCluster, mgmt: Consul, minted: Minted
) -> None:
    first = minted.policy('key "lockctl-test/t1" { policy = "read" }')
    second = minted.policy('key "lockctl-test/t2" { policy = "read" }')
    description = minted.name("token")
    created = mgmt.acl.create_token(description, [first.name])
    minted.tokens.append(created)
    secret = token_secret(created)
    uuid.UUID(secret.reveal())  # a real secret came back
    assert created.policy_names == (first.name,)
    assert created.description == description
    assert created.local is False

    read = mgmt.acl.read_token(created.accessor_id)
    assert read.accessor_id == created.accessor_id
    assert read.secret == secret

    own = live_cluster.client("server-1", secret)
    me = eventually(lambda: own.acl.read_self_token())
    assert me.accessor_id == created.accessor_id
    assert me.policy_names == (first.name,)

    renamed = minted.name("renamed")
    updated = mgmt.acl.update_token(created.accessor_id, renamed, [first.name, second.name])
    assert updated.description == renamed
    assert updated.policy_names == tuple(sorted([first.name, second.name]))
    assert mgmt.acl.read_token(created.accessor_id).secret == secret  # the secret stays

    # The list is what is under test; only this test's own tokens are looked at in it.
    other = minted.token('key "lockctl-test/t3" { policy = "read" }')
    listed = {t.accessor_id: t for t in carrying(mgmt.acl.list_tokens(), minted.uid)}
    assert set(listed) == {created.accessor_id, other.accessor_id}
    assert listed[created.accessor_id].description == renamed
    assert listed[other.accessor_id].description == other.description
    assert [t.secret for t in listed.values()] == [None, None]  # no secret in a list answer

    mgmt.acl.delete_token(created.accessor_id)
    mine = [t.accessor_id for t in carrying(mgmt.acl.list_tokens(), minted.uid)]
    assert mine == [other.accessor_id]
    with pytest.raises((NotFound, PermissionDenied)):
        mgmt.acl.read_token(created.accessor_id)


def test_local_token(mgmt: Consul, minted: Minted) -> None:
    policy = minted.policy('key "lockctl-test/l" { policy = "read" }')
    token = mgmt.acl.create_token(minted.name("local"), [policy.name], local=True)
    minted.tokens.append(token)
    assert token.local is True
    assert mgmt.acl.read_token(token.accessor_id).local is True


def test_read_self_without_a_token_or_with_a_bogus_one_is_denied(
    live_cluster: LiveCluster,
) -> None:
    client = live_cluster.client("worker-1", None)
    with pytest.raises((PermissionDenied, NotFound)):
        client.acl.read_self_token()
    with pytest.raises(PermissionDenied):
        client.acl.read_self_token(token=bogus())


def test_acl_writes_are_denied_without_a_token(live_cluster: LiveCluster) -> None:
    for token in (None, bogus()):
        client = live_cluster.client("server-1", token)
        with pytest.raises(PermissionDenied):
            client.acl.create_policy(unique("lockctl-test"), "")
        with pytest.raises(PermissionDenied):
            client.acl.list_tokens()
        with pytest.raises(PermissionDenied):
            client.acl.create_token("x", [])


# --- sessions -------------------------------------------------------------------------------

SESSION_RULE = 'session "worker-1" { policy = "write" }'


def test_session_lifecycle_with_a_node_scoped_token(
    live_cluster: LiveCluster, minted: Minted, sessions: Sessions
) -> None:
    token = token_secret(minted.token(SESSION_RULE))
    worker = live_cluster.client("worker-1", token)
    name = unique("lockctl-test")
    session_id = eventually(
        lambda: worker.session.create(name=name, ttl=20, lock_delay=1.5, behavior="delete")
    )
    sessions.made.append(("worker-1", session_id))

    info = worker.session.info(session_id)
    assert info is not None
    assert (info.id, info.name, info.node) == (session_id, name, "worker-1")
    assert info.ttl == "20s"
    assert info.lock_delay_ns == 1_500_000_000
    assert info.behavior == "delete"
    assert info.checks == ("serfHealth",)
    assert worker.session.info(session_id, consistency="consistent") == info
    stale = worker.session.info(session_id, consistency="stale")
    assert stale is None or stale.id == session_id  # a follower may not have it yet

    renewed = worker.session.renew(session_id)
    assert renewed.id == session_id
    assert renewed.ttl == "20s"

    # list() is what is under test; only this test's session (its name) is looked at in it
    def listed(node: str | None = None) -> list[str]:
        return [s.id for s in carrying(worker.session.list(node=node), name)]

    assert listed() == [session_id]
    assert listed("worker-1") == [session_id]
    assert listed("worker-2") == []

    assert worker.session.destroy(session_id) is True
    assert worker.session.info(session_id) is None
    assert listed("worker-1") == []
    with pytest.raises(NotFound) as caught:
        worker.session.renew(session_id)
    assert caught.value.status == 404


def test_session_with_the_management_token(live_cluster: LiveCluster, sessions: Sessions) -> None:
    session_id = sessions.create("worker-1")
    info = live_cluster.management("server-2").session.info(session_id)
    assert info is not None
    assert info.node == "worker-1"


def test_session_rule_is_scoped_to_the_serving_agents_node(
    live_cluster: LiveCluster, minted: Minted, sessions: Sessions
) -> None:
    token = token_secret(minted.token(SESSION_RULE))
    sessions.create("worker-1", token)  # proves the token is known everywhere by now
    with pytest.raises(PermissionDenied):
        live_cluster.client("worker-2", token).session.create(name="x", ttl=15, lock_delay=0)


@pytest.mark.parametrize("agent", ["worker-1", "server-1"])
def test_session_create_without_a_token_or_with_a_bogus_one_is_denied(
    live_cluster: LiveCluster, agent: str
) -> None:
    names = {unique("lockctl-test"): token for token in (None, bogus())}
    for name, token in names.items():
        client = live_cluster.client(agent, token)
        with pytest.raises(PermissionDenied) as caught:
            client.session.create(name=name, ttl=15, lock_delay=0)
        assert caught.value.status == 403
    # made on the serving agent's node, had Consul taken it: none of this test's names is there
    on_node = live_cluster.management(agent).session.list(node=agent)
    assert [s.id for s in on_node if s.name in names] == []


def test_session_renew_and_destroy_of_a_stranger_are_denied(
    live_cluster: LiveCluster, sessions: Sessions
) -> None:
    session_id = sessions.create("worker-1")
    stranger = live_cluster.client("worker-1", bogus())
    with pytest.raises(PermissionDenied):
        stranger.session.renew(session_id)
    with pytest.raises(PermissionDenied):
        stranger.session.destroy(session_id)
    assert live_cluster.management().session.info(session_id) is not None


# --- KV -------------------------------------------------------------------------------------


def test_get_missing_key_is_none_with_an_index(mgmt: Consul, prefix: str) -> None:
    for consistency in ("default", "consistent", "stale"):
        entry, meta = mgmt.kv.get(prefix + "missing", consistency=consistency)
        assert entry is None
        assert meta.index is not None
        assert meta.index > 0


@pytest.mark.parametrize("agent", ["server-1", "server-3", "worker-1"])
def test_put_then_get_in_every_consistency_mode_with_read_meta(
    live_cluster: LiveCluster, prefix: str, agent: str
) -> None:
    client = live_cluster.management(agent)
    value = bytes(range(256))  # binary survives the base64 round trip
    assert client.kv.put(prefix + "k", value) is True
    written, meta = client.kv.get(prefix + "k", consistency="consistent")
    assert written is not None
    assert written.value == value
    assert written.key == prefix + "k"
    assert written.session is None
    assert written.lock_index == 0
    assert meta.index is not None
    assert meta.index >= written.modify_index
    assert meta.known_leader is True
    assert meta.last_contact_ms == 0  # consistent reads are answered by the leader itself
    entry, meta = client.kv.get(prefix + "k")  # default: answered by the leader
    assert entry is not None
    assert entry.modify_index == written.modify_index
    assert meta.known_leader is True
    for consistency in ("default", "stale"):
        entry, meta = client.kv.get(prefix + "k", consistency=consistency)
        # A stale read from a follower may not see the write yet (CONSUL_FACTS.md).
        assert entry is None or entry.value == value
        assert meta.index is not None
        assert isinstance(meta.known_leader, bool)
        assert isinstance(meta.last_contact_ms, int)
        assert meta.last_contact_ms >= 0


def test_empty_value_and_overwrite(mgmt: Consul, prefix: str) -> None:
    assert mgmt.kv.put(prefix + "k") is True
    entry, _ = mgmt.kv.get(prefix + "k")
    assert entry is not None
    assert entry.value in (None, b"")
    assert mgmt.kv.put(prefix + "k", b"two") is True
    again, _ = mgmt.kv.get(prefix + "k")
    assert again is not None
    assert again.value == b"two"
    assert again.modify_index > entry.modify_index
    assert again.create_index == entry.create_index


def test_blocking_get_returns_when_another_thread_writes(mgmt: Consul, prefix: str) -> None:
    key = prefix + "watched"
    mgmt.kv.put(key, b"before")
    _, meta = mgmt.kv.get(key)
    assert meta.index is not None
    errors: list[BaseException] = []

    def write_later() -> None:
        try:
            time.sleep(0.5)
            mgmt.kv.put(key, b"after")
        except BaseException as exc:  # reported to the main thread
            errors.append(exc)

    writer = threading.Thread(target=write_later)
    started = time.monotonic()
    writer.start()
    try:
        entry, after = mgmt.kv.get(key, index=meta.index, wait=20)
    finally:
        writer.join(10)
    elapsed = time.monotonic() - started
    assert errors == []
    assert 0.4 <= elapsed < 10
    assert entry is not None
    assert entry.value == b"after"
    assert after.index is not None
    assert after.index > meta.index


def test_blocking_get_with_no_change_returns_after_wait(mgmt: Consul, prefix: str) -> None:
    key = prefix + "quiet"
    mgmt.kv.put(key, b"same")
    entry, meta = mgmt.kv.get(key)
    assert entry is not None
    assert meta.index is not None
    started = time.monotonic()
    unchanged, after = mgmt.kv.get(key, index=meta.index, wait=1.5)
    elapsed = time.monotonic() - started
    # it waited (Consul adds up to wait/16 of jitter), and returned at the wait's end: not at
    # the client's timeout, nor Consul's default wait of 5 minutes
    assert 1.4 <= elapsed < 10
    assert unchanged == entry
    assert after.index == meta.index


def test_blocking_get_on_a_missing_key_times_out_to_none(mgmt: Consul, prefix: str) -> None:
    _, meta = mgmt.kv.get(prefix + "never")
    assert meta.index is not None
    started = time.monotonic()
    entry, after = mgmt.kv.get(prefix + "never", index=meta.index, wait=1)
    assert entry is None
    assert after.index is not None
    assert 0.9 <= time.monotonic() - started < 10  # at the wait's end, not Consul's default 5 min


def test_cas_put(mgmt: Consul, prefix: str) -> None:
    key = prefix + "cas"
    assert mgmt.kv.put(key, b"1", cas=0) is True  # 0: only if absent
    assert mgmt.kv.put(key, b"2", cas=0) is False
    entry, _ = mgmt.kv.get(key)
    assert entry is not None
    assert mgmt.kv.put(key, b"3", cas=entry.modify_index + 1000) is False
    assert mgmt.kv.put(key, b"3", cas=entry.modify_index) is True
    assert mgmt.kv.put(key, b"4", cas=entry.modify_index) is False  # stale now
    final, _ = mgmt.kv.get(key)
    assert final is not None
    assert final.value == b"3"


def test_delete_cas_and_recurse(mgmt: Consul, prefix: str) -> None:
    mgmt.kv.put(prefix + "single", b"x")
    assert mgmt.kv.delete(prefix + "single") is True
    assert mgmt.kv.get(prefix + "single")[0] is None
    assert mgmt.kv.delete(prefix + "single") is True  # deleting nothing is fine

    mgmt.kv.put(prefix + "guarded", b"x")
    entry, _ = mgmt.kv.get(prefix + "guarded")
    assert entry is not None
    assert mgmt.kv.delete(prefix + "guarded", cas=entry.modify_index + 1000) is False
    assert mgmt.kv.get(prefix + "guarded")[0] is not None
    assert mgmt.kv.delete(prefix + "guarded", cas=entry.modify_index) is True
    assert mgmt.kv.get(prefix + "guarded")[0] is None

    for leaf in ("tree/a", "tree/b/c", "treetop"):
        mgmt.kv.put(prefix + leaf, b"x")
    assert mgmt.kv.delete(prefix + "tree/", recurse=True) is True
    assert mgmt.kv.get(prefix + "tree/a")[0] is None
    assert mgmt.kv.get(prefix + "tree/b/c")[0] is None
    assert mgmt.kv.get(prefix + "treetop")[0] is not None  # outside the folder


def test_acquire_release_and_lock_index(
    live_cluster: LiveCluster, minted: Minted, sessions: Sessions, prefix: str
) -> None:
    key = prefix + ".lock"
    token = token_secret(
        minted.token(
            f'key "{key}" {{ policy = "write" }}',
            'session "worker-1" { policy = "write" }\nsession "worker-2" { policy = "write" }',
        )
    )
    one = sessions.create("worker-1", token)
    two = sessions.create("worker-2", token)
    first = live_cluster.client("worker-1", token)
    second = live_cluster.client("worker-2", token)

    assert first.kv.put(key, b"held by one", acquire=one) is True
    entry, _ = first.kv.get(key, consistency="consistent")
    assert entry is not None
    assert (entry.session, entry.lock_index, entry.value) == (one, 1, b"held by one")

    assert second.kv.put(key, b"stolen", acquire=two) is False  # held: refused
    assert second.kv.put(key, release=two) is False  # not the holder
    entry, _ = first.kv.get(key, consistency="consistent")
    assert entry is not None
    assert (entry.session, entry.value) == (one, b"held by one")

    assert first.kv.put(key, b"again", acquire=one) is True  # holder re-acquires
    entry, _ = first.kv.get(key, consistency="consistent")
    assert entry is not None
    assert entry.lock_index == 1  # a re-acquire by the holder is not a new lock

    assert first.kv.put(key, b"released", release=one) is True
    entry, _ = first.kv.get(key, consistency="consistent")
    assert entry is not None
    assert entry.session is None
    assert entry.value == b"released"

    # After a graceful release there is no lock-delay: the other session gets it at once.
    assert second.kv.put(key, b"held by two", acquire=two) is True
    entry, _ = second.kv.get(key, consistency="consistent")
    assert entry is not None
    assert (entry.session, entry.lock_index) == (two, 2)

    assert second.kv.put(key, release=two) is True
    assert first.kv.put(key, acquire=one) is True
    entry, _ = first.kv.get(key, consistency="consistent")
    assert entry is not None
    assert entry.lock_index == 3  # the fencing token grows on every acquire


def test_acquire_and_read_is_one_transaction_returning_the_lock_index(
    live_cluster: LiveCluster, minted: Minted, sessions: Sessions, prefix: str
) -> None:
    key = prefix + ".lock"
    token = token_secret(
        minted.token(
            f'key "{key}" {{ policy = "write" }}',
            'session "worker-1" { policy = "write" }\nsession "worker-2" { policy = "write" }',
        )
    )
    one, two = sessions.create("worker-1", token), sessions.create("worker-2", token)
    first = live_cluster.client("worker-1", token)
    second = live_cluster.client("worker-2", token)

    entry = first.txn.acquire_and_read(key, b"held by one", one)
    assert entry is not None
    assert (entry.session, entry.lock_index, entry.value) == (one, 1, b"held by one")
    assert second.txn.acquire_and_read(key, b"stolen", two) is None  # held: rolled back
    assert first.kv.get(key, consistency="consistent")[0] == entry  # nothing changed

    first.kv.put(key, release=one)
    taken = second.txn.acquire_and_read(key, b"held by two", two)
    assert taken is not None and (taken.session, taken.lock_index) == (two, 2)

    # A token that may not write the key: Consul rolls the transaction back with 409 and a
    # "Permission denied" per operation (not 403); the client raises PermissionDenied for it.
    other = token_secret(minted.token('session "worker-1" { policy = "write" }'))
    denied = live_cluster.client("worker-1", other)
    with pytest.raises(PermissionDenied, match="Permission denied"):
        denied.txn.acquire_and_read(key, b"x", one)
    with pytest.raises(PermissionDenied):
        denied.kv.put(key, b"x", acquire=one)


def test_acquire_with_a_destroyed_session_is_a_server_error(
    live_cluster: LiveCluster, sessions: Sessions, prefix: str
) -> None:
    mgmt = live_cluster.management("worker-1")
    session_id = sessions.create("worker-1")
    mgmt.session.destroy(session_id)
    with pytest.raises(ConsulServerError) as caught:
        mgmt.kv.put(prefix + ".lock", acquire=session_id)
    assert caught.value.status == 500


@pytest.mark.parametrize("agent", ["worker-1", "server-2"])
def test_kv_without_a_token_or_with_a_bogus_one_is_denied(
    live_cluster: LiveCluster, sessions: Sessions, prefix: str, agent: str
) -> None:
    key = prefix + ".lock"
    session_id = sessions.create("worker-1")
    live_cluster.management().kv.put(prefix + "existing", b"x")
    for token in (None, bogus()):
        client = live_cluster.client(agent, token)
        with pytest.raises(PermissionDenied):
            client.kv.put(key, b"x", acquire=session_id)
        with pytest.raises(PermissionDenied):
            client.kv.put(key, b"x")
        with pytest.raises(PermissionDenied):
            client.kv.get(prefix + "existing")
        with pytest.raises(PermissionDenied):
            client.kv.delete(prefix + "existing")
    entry, _ = live_cluster.management().kv.get(key)
    assert entry is None  # nothing was written


def test_a_token_for_one_key_cannot_acquire_another(
    live_cluster: LiveCluster, minted: Minted, sessions: Sessions, prefix: str
) -> None:
    token = token_secret(minted.token(f'key "{prefix}mine" {{ policy = "write" }}'))
    session_id = sessions.create("worker-1")
    client = live_cluster.client("worker-1", token)
    assert eventually(lambda: client.kv.put(prefix + "mine", acquire=session_id)) is True
    with pytest.raises(PermissionDenied):
        client.kv.put(prefix + "mine-too", acquire=session_id)  # `key` is an exact match


def test_no_secret_in_errors_from_the_live_cluster(
    live_cluster: LiveCluster, caplog: pytest.LogCaptureFixture, prefix: str
) -> None:
    import logging

    caplog.set_level(logging.DEBUG)
    secret = bogus()
    client = live_cluster.client("worker-1", secret)
    failures: list[ConsulError] = []
    calls: list[Callable[[], Any]] = [
        lambda: client.agent.self(),
        lambda: client.acl.read_self_token(),
        lambda: client.session.create(name="x", ttl=15, lock_delay=0),
        lambda: client.kv.put(prefix + "k", b"x"),
        lambda: client.agent.set_agent_token(secret),
    ]
    for call in calls:
        with pytest.raises(ConsulError) as caught:
            call()
        failures.append(caught.value)
    text = "\n".join(
        [str(e) + repr(e) + getattr(e, "body", "") for e in failures]
        + [r.getMessage() for r in caplog.records]
    )
    assert secret.reveal() not in text
    assert live_cluster.management_token.reveal() not in text
