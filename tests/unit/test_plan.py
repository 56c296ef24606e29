"""plan: golden cases (tests/golden/plan/*.json, one per case) plus the rules comparison.

Each case gives the desired objects, the live objects as Consul's list endpoints show them (the
harness computes each policy's Hash the way Consul does and hides its rules unless the plan asks
to read them, as apply does), the token files present (which token each holds, what is wrong
with it), and the expected plan. Regenerate the expectations after a deliberate change with
LOCKCTL_UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from provision.acl.owners import OwnerConflict
from provision.acl.plan import plan_changes, policies_to_read
from provision.acl.render import render_policies
from provision.acl.rules import rules_equivalent
from provision.acl.state import (
    Desired,
    DesiredPolicy,
    DesiredToken,
    LivePolicy,
    LiveState,
    LiveToken,
    TokenFileState,
    desired_from_render,
    policy_hash,
)
from provision.spec import parse_spec
from provision.spec.names import DEFAULT_OWNER
from provision.system.templates import find_templates_dir

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "plan"
CASES = sorted(GOLDEN.glob("*.json"))


def _desired(raw: dict[str, Any]) -> Desired:
    return Desired(
        tuple(DesiredPolicy(p["name"], p["description"], p["rules"]) for p in raw["policies"]),
        tuple(
            DesiredToken(t["worker"], t["description"], tuple(t["policies"])) for t in raw["tokens"]
        ),
        owner=raw.get("owner", DEFAULT_OWNER),  # a case without one: a spec that names none
    )


def _listed(raw: dict[str, Any]) -> LivePolicy:
    """What GET /v1/acl/policies shows: Consul's hash, no rules."""
    with_hash = {**raw, "Hash": policy_hash(raw["Name"], raw["Description"], raw["Rules"])}
    return replace(LivePolicy.from_api(with_hash), rules=None)


def _plan_case(case: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    desired = _desired(case["desired"])
    live = LiveState(
        tuple(_listed(p) for p in case["live"]["policies"]),
        tuple(LiveToken.from_api(t) for t in case["live"]["tokens"]),
    )
    to_read = policies_to_read(desired, live)
    rules = {p["ID"]: p["Rules"] for p in case["live"]["policies"]}
    live = LiveState(
        tuple(replace(p, rules=rules[p.id]) if p.id in to_read else p for p in live.policies),
        live.tokens,
    )
    token_files = {
        worker: TokenFileState(state["holds"], tuple(state["problems"]))
        for worker, state in case["token_files"].items()
    }
    try:
        plan = plan_changes(desired, live, token_files=token_files, prune=case["prune"])
    except OwnerConflict as refused:  # the whole plan refused: nothing would be written
        return {"refused": str(refused), "exit_code": refused.exit_code}, to_read
    return plan.to_record(), to_read


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_golden_plan(path: Path) -> None:
    case = json.loads(path.read_text(encoding="utf-8"))
    record, to_read = _plan_case(case)
    got = {"plan": record, "policies_read": to_read}
    if os.environ.get("LOCKCTL_UPDATE_GOLDEN"):
        case["expected"] = got
        path.write_text(json.dumps(case, indent=2) + "\n", encoding="utf-8")
    assert got == case["expected"], case["doc"]


def test_there_are_golden_cases() -> None:
    assert len(CASES) >= 10


def test_a_matching_hash_needs_no_read() -> None:
    """The no-op path: equal hashes mean no policy is read, whatever the count."""
    desired = Desired(
        tuple(
            DesiredPolicy(f"lock-j{i}", "lockctl-managed: x", f'key_prefix "j{i}/" {{}}')
            for i in range(500)
        ),
        (),
    )
    live = LiveState(
        tuple(
            LivePolicy(f"id{i}", p.name, p.description, p.hash)
            for i, p in enumerate(desired.policies)
        ),
        (),
    )
    assert policies_to_read(desired, live) == []
    assert not plan_changes(desired, live).has_changes


def test_policy_hash_is_consuls() -> None:
    """Value taken from a real Consul 1.8.7 list answer for this name, description and rules."""
    rules = 'key_prefix "a/" {\n policy = "write"\n}\n'
    assert policy_hash("hashprobe", "d x", rules) == "66qOXSWRgwSYS+4uPVhEUIGg0JDIRV8xTQTx2lopJVU="


@pytest.mark.parametrize(
    ("left", "right", "same"),
    [
        (
            'key_prefix "a/" { policy = "write" }',
            'key_prefix "a/" {\n  policy = "write"\n}\n',
            True,
        ),
        ('# c\nkey "k" { policy = "read" }', 'key "k" {\n  policy = "read" # c\n}', True),
        ('key_prefix "a/" { policy = "write" }', 'key_prefix "a/" { policy = "read" }', False),
        ('key_prefix "a/" { policy = "write" }', 'key_prefix "a" { policy = "write" }', False),
        ('key_prefix "a/" { policy = "write" }', 'key "a/" { policy = "write" }', False),
        ('acl = "read"', 'acl = "write"', False),
        ('acl = "read"\noperator = "read"', 'operator = "read"\nacl = "read"', True),
        ('key_prefix "a/" {', 'key_prefix "a/" {', True),  # unparseable: compared as text
        ('key_prefix "a/" {', 'key_prefix "a/"  {', False),
    ],
)
def test_rules_equivalent(left: str, right: str, same: bool) -> None:
    assert rules_equivalent(left, right) is same


def test_desired_from_render_marks_policies_and_tokens() -> None:
    spec = parse_spec(
        'worker "w1" {}\nworker "w2" {}\n'
        'job "a" {\n prefix = "locks/a/"\n workers = ["w1", "w2"]\n}\n'
        'job "b" {\n prefix = "locks/b/"\n workers = ["w2"]\n}\n',
        "locks.hcl",
    )
    desired = desired_from_render(render_policies(spec, find_templates_dir()))
    assert {p.name: p.description for p in desired.policies} == {
        "lock-a": 'lockctl-managed: job "a"',
        "lock-b": 'lockctl-managed: job "b"',
        "session-w1": 'lockctl-managed: worker "w1"',
        "session-w2": 'lockctl-managed: worker "w2"',
    }
    assert {t.worker: t.policies for t in desired.tokens} == {
        "w1": ("lock-a", "session-w1"),
        "w2": ("lock-a", "lock-b", "session-w2"),
    }
    assert {t.description for t in desired.tokens} == {"lockctl worker w1", "lockctl worker w2"}


def test_each_token_change_carries_its_workers_datacenter() -> None:
    """Where a worker's token must be known before its file is written (apply awaits it
    there): the worker's datacenter, from the spec to every change of its token; none in a
    spec that names none."""
    spec = parse_spec(
        'worker "w1" {\n datacenter = "dc1"\n}\nworker "w2" {\n datacenter = "dc2"\n}\n'
        'job "a" {\n prefix = "locks/a/"\n workers = ["w1", "w2"]\n scope = "datacenter"\n}\n',
        "locks.hcl",
    )
    desired = desired_from_render(render_policies(spec, find_templates_dir()))
    assert {t.worker: t.datacenter for t in desired.tokens} == {"w1": "dc1", "w2": "dc2"}
    created = plan_changes(desired, LiveState((), ()))
    assert {(c.worker, c.action, c.datacenter) for c in created.tokens} == {
        ("w1", "create", "dc1"),
        ("w2", "create", "dc2"),
    }
    plain = parse_spec('worker "w1" {}\njob "a" {\n prefix = "l/"\n workers = ["w1"]\n}\n', "x")
    [token] = desired_from_render(render_policies(plain, find_templates_dir())).tokens
    assert token.datacenter is None
