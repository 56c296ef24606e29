"""Each rendered policy, loaded into a real Consul, grants exactly what it claims: a token with it
acquires inside the job's prefix and gets 403 one character outside it; a session policy works on
its own node only.

Each rendered policy is loaded under its name with the module's uid appended (the rules are
what is tested, not the name): `session-worker-1` is the name every spec with a worker-1 gives
its session policy, so loading, reading or deleting that one would touch other tests'."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from provision.acl.render import RenderResult, render_policies
from provision.consul import Consul
from provision.consul.errors import PermissionDenied
from provision.spec import parse_spec
from provision.system.secrets import Secret
from provision.system.templates import find_templates_dir
from tests.conftest import LiveCluster


@dataclass(frozen=True)
class Loaded:
    """The rendered spec, and the name each of its policies was loaded into Consul under."""

    result: RenderResult
    names: dict[str, str]  # rendered name -> loaded name


@pytest.fixture(scope="module")
def rendered(live_cluster: LiveCluster) -> Iterator[Loaded]:
    """Render a spec with unique names and load every policy into Consul, each under its own
    name with the run's uid (deleted after)."""
    run = uuid.uuid4().hex[:6]
    spec = parse_spec(
        f"""
worker "worker-1" {{}}
worker "worker-2" {{}}
job "alpha-{run}" {{
  prefix  = "render-live-{run}/alpha/"
  workers = ["worker-1"]
}}
job "beta-{run}" {{
  prefix  = "render-live-{run}/beta/sub/"
  workers = ["worker-1", "worker-2"]
}}
""",
        "live.hcl",
    )
    result = render_policies(spec, find_templates_dir())
    management = live_cluster.management()
    names = {policy.name: f"{policy.name}-{run}" for policy in result.policies}
    created = []
    try:
        for policy in result.policies:
            made = management.acl.create_policy(names[policy.name], policy.rules, "test")
            created.append(made)
        yield Loaded(result, names)
    finally:
        for made in created:
            management.acl.delete_policy(made.id)


def _token_with(live_cluster: LiveCluster, *policies: str) -> Iterator[Secret]:
    management = live_cluster.management()
    token = management.acl.create_token(f"render-live {uuid.uuid4().hex[:6]}", list(policies))
    assert token.secret is not None
    try:
        yield token.secret
    finally:
        management.acl.delete_token(token.accessor_id)


def test_every_lock_policy_grants_its_prefix_and_nothing_next_to_it(
    live_cluster: LiveCluster, rendered: Loaded
) -> None:
    jobs = [p for p in rendered.result.policies if p.name.startswith("lock-")]
    assert len(jobs) == 2
    for policy in jobs:
        prefix = policy.rules.split('key_prefix "', 1)[1].split('"', 1)[0]
        loaded = (rendered.names[policy.name], rendered.names["session-worker-1"])
        for secret in _token_with(live_cluster, *loaded):
            client = live_cluster.client("worker-1", secret)
            session_id = client.session.create(name="render-live", ttl=10, lock_delay=0)
            try:
                assert client.kv.put(prefix + ".lock", b"x", acquire=session_id) is True
                assert client.kv.put(prefix + ".lock", release=session_id) is True
                for outside in (prefix[:-1] + "_", prefix[:-1], "x" + prefix):
                    with pytest.raises(PermissionDenied):
                        client.kv.put(outside, b"x", acquire=session_id)
                others = [p for p in jobs if p is not policy]
                for other in others:
                    other_prefix = other.rules.split('key_prefix "', 1)[1].split('"', 1)[0]
                    with pytest.raises(PermissionDenied):
                        client.kv.put(other_prefix + ".lock", b"x", acquire=session_id)
            finally:
                client.kv.delete(prefix + ".lock")
                client.session.destroy(session_id)


def test_every_session_policy_works_on_its_own_node_only(
    live_cluster: LiveCluster, rendered: Loaded
) -> None:
    sessions = sorted(p.name for p in rendered.result.policies if p.name.startswith("session-"))
    assert sessions == ["session-worker-1", "session-worker-2"]
    for name in sessions:
        own = name.removeprefix("session-")
        other = "worker-2" if own == "worker-1" else "worker-1"
        for secret in _token_with(live_cluster, rendered.names[name]):
            mine: Consul = live_cluster.client(own, secret)
            session_id = mine.session.create(name="render-live", ttl=10, lock_delay=0)
            assert mine.session.destroy(session_id) is True
            with pytest.raises(PermissionDenied):
                live_cluster.client(other, secret).session.create(
                    name="render-live", ttl=10, lock_delay=0
                )
