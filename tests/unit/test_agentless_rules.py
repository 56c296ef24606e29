"""Workers without a local agent (issue 23, item 4), the pure parts: the spec's `agentless`, the
policy it renders (node write on exactly its own node), the worker config that carries it, the
calls a session on it takes (the node registered first, no node checks: what Consul 1.8.7 was
measured to accept), the address it registers, and the fencing bound that still holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import responses

from provision.acl.lint import lint_rules
from provision.acl.render import render_policies
from provision.consul import Consul, ConsulSettings
from provision.sessions import (
    NODE_ADDRESS_ENV,
    AgentlessNode,
    SessionTerms,
    agentless_node,
    create_session,
    node_address,
)
from provision.spec import SpecError, parse_spec
from provision.timings import SAFETY_MARGIN, fencing_problem
from provision.workers.config import config_record, load_worker_config

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
ADDRESS = "http://127.0.0.1:9"
SPEC = """
worker "pod-0" {
  address   = "https://consul-server.consul:8501"
  agentless = true
}
worker "vm-1" {}
job "report" {
  prefix  = "locks/report/"
  workers = ["pod-0", "vm-1"]
}
"""


def test_the_spec_marks_a_worker_agentless_and_leaves_the_others_as_they_were() -> None:
    spec = parse_spec(SPEC, "s.hcl")
    assert spec.worker("pod-0").agentless is True
    assert spec.worker("vm-1").agentless is False


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ('"yes"', "must be true or false, not a string"),
        ("1", "must be true or false, not a number"),
        ('["x"]', "must be true or false, not a list"),
    ],
)
def test_agentless_must_be_a_boolean_at_its_line(value: str, problem: str) -> None:
    job = 'job "j" {\n  prefix = "l/j/"\n  workers = ["w"]\n}\n'
    text = f'worker "w" {{\n  agentless = {value}\n}}\n{job}'
    with pytest.raises(SpecError) as caught:
        parse_spec(text, "s.hcl")
    assert [str(p) for p in caught.value.problems] == [f's.hcl:2: worker "w".agentless: {problem}']


def test_an_agentless_worker_s_policy_allows_its_own_node_and_nothing_broader() -> None:
    rendered = {
        p.name: p.rules for p in render_policies(parse_spec(SPEC, "s.hcl"), TEMPLATES).policies
    }
    pod = rendered["session-pod-0"]
    assert 'node "pod-0" {\n  policy = "write"\n}' in pod
    assert 'session "pod-0" {\n  policy = "write"\n}' in pod
    assert "node_prefix" not in pod and pod.count("policy =") == 2
    assert "node " not in rendered["session-vm-1"], "a worker with an agent needs no node rule"


@pytest.mark.parametrize(
    ("rules", "finding"),
    [
        ('session "vm-1" { policy = "write" }\nnode "vm-1" { policy = "write" }', True),
        ('session "pod-0" { policy = "write" }\nnode "pod-1" { policy = "write" }', True),
        ('session "pod-0" { policy = "write" }\nnode_prefix "pod-" { policy = "write" }', True),
        ('session "pod-0" { policy = "write" }\nnode "pod-0" { policy = "write" }', False),
    ],
)
def test_lint_holds_each_session_policy_to_its_node(rules: str, finding: bool) -> None:
    from provision.acl.expectations import expectation_for

    spec = parse_spec(SPEC.replace('worker "vm-1" {}', 'worker "vm-1" {}\nworker "pod-1" {}'), "s")
    worker = "vm-1" if "vm-1" in rules else "pod-0"
    name = f"session-{worker}"
    found = lint_rules(
        rules,
        name=name,
        declared_nodes=frozenset(w.name for w in spec.workers),
        expected=expectation_for(spec, name),
    )
    assert bool([f for f in found if f.severity == "error"]) is finding, found


def test_the_worker_config_carries_agentless_only_for_agentless_workers(tmp_path: Path) -> None:
    spec = parse_spec(SPEC, "s.hcl")
    pod = config_record(spec, "pod-0", Path("/run/t"))
    vm = config_record(spec, "vm-1", Path("/run/t"))
    assert pod["agentless"] is True and "agentless" not in vm
    path = tmp_path / "lockctl.json"
    path.write_text(json.dumps(pod))
    assert load_worker_config(path).agentless is True
    path.write_text(json.dumps(vm))
    assert load_worker_config(path).agentless is False
    path.write_text(json.dumps({**pod, "agentless": "true"}))
    with pytest.raises(Exception, match="agentless: must be true or false"):
        load_worker_config(path)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({NODE_ADDRESS_ENV: "10.1.2.3"}, "10.1.2.3"),
        ({NODE_ADDRESS_ENV: " 10.1.2.3\n"}, "10.1.2.3"),
    ],
)
def test_the_node_address_comes_from_the_environment_when_given(
    environ: dict[str, str], expected: str
) -> None:
    assert node_address(environ) == expected


def test_without_the_variable_the_node_address_is_this_host_s() -> None:
    assert node_address({NODE_ADDRESS_ENV: ""})  # resolved, or 127.0.0.1: never empty
    assert agentless_node("pod-0", False, {}) is None
    assert agentless_node("pod-0", True, {NODE_ADDRESS_ENV: "10.0.0.9"}) == AgentlessNode(
        "pod-0", "10.0.0.9"
    )


def _consul() -> Consul:
    return Consul(ConsulSettings(address=ADDRESS, timeout=1))


def test_an_agentless_session_registers_its_node_then_has_no_node_checks() -> None:
    with responses.RequestsMock() as mocked:
        register = mocked.add(responses.PUT, f"{ADDRESS}/v1/catalog/register", json=True)
        create = mocked.add(responses.PUT, f"{ADDRESS}/v1/session/create", json={"ID": "s-1"})
        node = AgentlessNode("pod-0", "10.0.0.9")
        made = create_session(_consul(), SessionTerms("n", 10, 15, "release", 5, node))
        assert made == "s-1"
        assert [call.request.url for call in mocked.calls] == [register.url, create.url]
        assert json.loads(mocked.calls[0].request.body) == {"Node": "pod-0", "Address": "10.0.0.9"}
        body = json.loads(mocked.calls[1].request.body)
    # Measured on 1.8.7: either empty list gives a session with NodeChecks [] (no serfHealth)
    assert body["Node"] == "pod-0" and body["Checks"] == [] and body["NodeChecks"] == []
    assert body["TTL"] == "10s" and body["LockDelay"] == "15s"


def test_a_session_with_an_agent_stays_on_the_agent_s_node_with_serf_health() -> None:
    with responses.RequestsMock() as mocked:
        mocked.add(responses.PUT, f"{ADDRESS}/v1/session/create", json={"ID": "s-2"})
        create_session(_consul(), SessionTerms("n", 10, 15, "release", 5))
        body = json.loads(mocked.calls[0].request.body)
    assert body["Checks"] == ["serfHealth"] and "Node" not in body and "NodeChecks" not in body


# The fencing bound for TTL-only sessions. It assumes the worst: the session invalidated right
# after the server handled our last confirming request. A TTL-only session can end no sooner
# (Consul ends it at TTL expiry, at the earliest TTL after that renew, or by a destroy or a
# deregistration of its node, which is that worst case), so the rule needs no change: the job is
# dead (SIGKILL at D - margin) before another session can acquire (invalidation + D), and with
# a TTL-only session the other acquires at TTL + D at the earliest, TTL later than the rule needs.
@pytest.mark.parametrize(
    ("ttl", "lock_delay", "renew", "grace"),
    [(10, 15, 10 / 3, 5), (15, 15, 5, 5), (30, 60, 10, 30), (10, 7, 3, 2)],
)
def test_the_fencing_bound_holds_for_ttl_only_sessions(
    ttl: float, lock_delay: float, renew: float, grace: float
) -> None:
    assert fencing_problem(lock_delay, renew, grace) is None
    killed_at = lock_delay - SAFETY_MARGIN  # from the send time of the last confirmation
    earliest_invalidation = {"agent-backed": 0.0, "ttl-only expiry": float(ttl)}
    for invalidated in earliest_invalidation.values():
        assert killed_at < invalidated + lock_delay
