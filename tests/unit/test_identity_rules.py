"""Workload identity: the spec's auth_method and identity blocks rendered (identity.json, golden),
planned against Consul's objects (golden plans: create, update, no-op, prune), and the lint of
selectors that match more than one worker. Regenerate the goldens with LOCKCTL_UPDATE_GOLDEN=1."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from provision.acl.identity import DesiredIdentity, selector
from provision.acl.identity_lint import lint_identities
from provision.acl.identity_plan import (
    IdentityConflict,
    LiveAuthMethod,
    LiveIdentity,
    LiveRole,
    LiveRule,
    plan_identity,
)
from provision.acl.render import render_policies, write_rendered
from provision.errors import InputError
from provision.spec import load_spec, parse_spec
from provision.system.templates import find_templates_dir

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "identity"
SPEC = GOLDEN / "locks.hcl"


def _identity(spec_path: Path = SPEC) -> DesiredIdentity:
    return render_policies(load_spec(spec_path), find_templates_dir(None)).identity


def _golden(name: str, got: Any) -> None:
    path = GOLDEN / name
    if os.environ.get("LOCKCTL_UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    assert got == json.loads(path.read_text(encoding="utf-8"))


def _as_consul_shows(desired: DesiredIdentity) -> LiveIdentity:
    """What Consul lists (and reads) after applying `desired`: TTL as Go prints it."""
    methods = []
    for method in desired.methods:
        body = method.body()
        minutes, seconds = divmod(int(method.max_token_ttl), 60)
        ttl = f"{minutes}m{seconds}s"
        methods.append(
            LiveAuthMethod(body["Name"], body["Type"], body["Description"], ttl, body["Config"])
        )
    roles = [LiveRole(f"role-{r.worker}", r.name, r.description, r.policies) for r in desired.roles]
    rules = [
        LiveRule(f"rule-{r.worker}", r.auth_method, r.description, r.selector, "role", r.role)
        for r in desired.rules
    ]
    return LiveIdentity(tuple(methods), tuple(roles), tuple(rules))


def _plan(desired: DesiredIdentity, live: LiveIdentity, *, prune: bool) -> dict[str, Any]:
    plan = plan_identity(desired, live, prune=prune)
    return {
        "changes": [c.to_record() for c in plan.changes],
        "unchanged": plan.unchanged,
        "not_pruned": list(plan.not_pruned),
    }


# --- spec and render ------------------------------------------------------------------------


def test_the_spec_carries_the_method_and_each_workers_claims() -> None:
    spec = load_spec(SPEC)
    (method,) = spec.auth_methods
    assert (method.name, method.type, method.max_token_ttl.seconds) == ("k8s", "jwt", 600.0)
    assert method.bound_audiences == ("consul",)
    assert dict(method.claim_mappings)["service_account"] == "/kubernetes.io/serviceaccount/name"
    identity = spec.worker("worker-1").identity
    assert identity is not None
    assert identity.claims == (("namespace", "prod"), ("service_account", "worker-1"))


def test_render_golden_identity_json(tmp_path: Path) -> None:
    result = render_policies(load_spec(SPEC), find_templates_dir(None))
    _golden("render.json", json.loads(result.identity.text()))
    report = write_rendered(result, tmp_path / "out")
    assert "identity.json" in report.written
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["identity"] == {
        "file": "identity.json"
    }


def test_rendering_is_deterministic_whatever_the_order_in_the_spec(tmp_path: Path) -> None:
    text = SPEC.read_text()
    first, second = text.index('worker "worker-1"'), text.index('worker "worker-2"')
    job = text.index('job "report"')
    swapped = text[:first] + text[second:job] + text[first:second] + text[job:]
    swapped = swapped.replace(
        'namespace       = "prod"\n      service_account = "worker-1"',
        'service_account = "worker-1"\n      namespace       = "prod"',
    )
    assert swapped != text
    shutil.copy(GOLDEN / "issuer.pem", tmp_path / "issuer.pem")
    (tmp_path / "locks.hcl").write_text(swapped)
    assert _identity(tmp_path / "locks.hcl").text() == _identity().text()


def test_a_worker_no_longer_in_the_spec_loses_identity_json(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_rendered(render_policies(load_spec(SPEC), find_templates_dir(None)), out)
    plain = tmp_path / "plain.hcl"
    plain.write_text('worker "w" {}\njob "a" {\n  prefix = "locks/a/"\n  workers = ["w"]\n}\n')
    report = write_rendered(render_policies(load_spec(plain), find_templates_dir(None)), out)
    assert "identity.json" in report.removed


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("not a key\n", "holds no PEM public key"),
    ],
)
def test_an_unusable_key_file_is_an_input_error_at_the_spec_line(
    tmp_path: Path, content: str | None, message: str
) -> None:
    spec = tmp_path / "locks.hcl"
    spec.write_text(SPEC.read_text())
    if content is not None:
        (tmp_path / "issuer.pem").write_text(content)
    with pytest.raises(InputError) as caught:
        _identity(spec)
    text = str(caught.value)
    assert text.startswith(f'{spec}:5: auth_method "k8s".jwt_validation_pub_keys_file: ')
    assert message in text and "\n" not in text


def test_the_selector_is_exactly_the_claims_in_order() -> None:
    claims = (("service_account", "w-1"), ("namespace", "prod"))
    assert selector(claims) == 'value.namespace == "prod" and value.service_account == "w-1"'


@pytest.mark.parametrize("value", ['prod" or "x', "prod\\", "a b", "", "-x", "é"])
def test_a_claim_value_that_could_change_a_selector_is_refused(value: str) -> None:
    text = SPEC.read_text().replace(
        'namespace       = "prod"\n      service_account = "worker-1"',
        f'namespace = "{value.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"',
    )
    with pytest.raises(InputError) as caught:
        parse_spec(text, "locks.hcl")
    assert "identity.claims.namespace" in str(caught.value.problems[0])  # type: ignore[attr-defined]


# --- plan -----------------------------------------------------------------------------------


def test_plan_creates_everything_on_an_empty_consul() -> None:
    _golden("plan_create.json", _plan(_identity(), LiveIdentity(), prune=False))


def test_plan_is_a_noop_when_consul_matches() -> None:
    desired = _identity()
    got = _plan(desired, _as_consul_shows(desired), prune=True)
    assert got == {"changes": [], "unchanged": 5, "not_pruned": []}


def test_plan_updates_changed_claims_policies_and_config_and_adopts_by_name() -> None:
    desired = _identity()
    live = _as_consul_shows(desired)
    method = live.methods[0]
    config = {**method.config, "BoundAudiences": ["other"], "ClaimMappings": {"sub": "sub"}}
    live = LiveIdentity(
        (replace(method, description="made by hand", max_token_ttl="1h0m0s", config=config),),
        (replace(live.roles[0], policies=("lock-old",)), live.roles[1]),
        (live.rules[0], replace(live.rules[1], selector='value.namespace == "prod"')),
    )
    _golden("plan_update.json", _plan(desired, live, prune=False))


def test_prune_deletes_only_managed_objects_and_without_it_lists_them() -> None:
    desired = _identity()
    live = _as_consul_shows(desired)
    stale = LiveIdentity(
        (
            *live.methods,
            LiveAuthMethod("old", "jwt", 'lockctl-managed: auth_method "old"', "5m0s"),
            LiveAuthMethod("theirs", "jwt", "someone else's", "5m0s"),
        ),
        (
            *live.roles,
            LiveRole("r-gone", "worker-gone", 'lockctl-managed: worker "gone"', ()),
            LiveRole("r-theirs", "worker-theirs", "someone else's", ()),
        ),
        (
            *live.rules,
            LiveRule(
                "b-gone",
                "k8s",
                'lockctl-managed: worker "gone"',
                'value.x == "y"',
                "role",
                "worker-gone",
            ),
            LiveRule("b-theirs", "k8s", "someone else's", 'value.x == "z"', "role", "theirs"),
        ),
    )
    _golden(
        "plan_prune.json",
        {"prune": _plan(desired, stale, prune=True), "keep": _plan(desired, stale, prune=False)},
    )


def test_an_unmarked_rule_binding_the_workers_role_is_adopted_not_duplicated() -> None:
    desired = _identity()
    live = _as_consul_shows(desired)
    hand = replace(live.rules[0], description="made by hand")
    got = _plan(desired, replace(live, rules=(hand, live.rules[1])), prune=True)
    assert got["changes"] == [
        {
            "action": "update",
            "kind": "binding-rule",
            "name": "worker-1",
            "reason": "adopt: existing object of that name gets lockctl's marker",
        }
    ]


def test_a_method_of_another_type_is_a_conflict_not_an_update() -> None:
    desired = _identity()
    live = _as_consul_shows(desired)
    other = replace(live.methods[0], type="kubernetes")
    with pytest.raises(IdentityConflict, match='type "kubernetes"'):
        plan_identity(desired, replace(live, methods=(other,)), prune=False)


# --- lint -----------------------------------------------------------------------------------


def _spec_with_claims(*claims: dict[str, str], methods: tuple[str, ...] = ("k8s",)) -> str:
    text = SPEC.read_text()
    head = text[: text.index('worker "worker-1"')]
    if len(methods) > 1:
        head += head[: head.index("\nworker") if "\nworker" in head else len(head)].replace(
            'auth_method "k8s"', f'auth_method "{methods[1]}"'
        )
    blocks = []
    for number, pairs in enumerate(claims, start=1):
        method = methods[min(number - 1, len(methods) - 1)]
        inner = "\n".join(f'      {k} = "{v}"' for k, v in pairs.items())
        blocks.append(
            f'worker "w{number}" {{\n  identity {{\n    auth_method = "{method}"\n'
            f"    claims {{\n{inner}\n    }}\n  }}\n}}\n"
        )
    return head + "".join(blocks) + 'job "a" {\n  prefix = "locks/a/"\n  workers = ["w1"]\n}\n'


def _lint(text: str, tmp_path: Path) -> list[str]:
    shutil.copy(GOLDEN / "issuer.pem", tmp_path / "issuer.pem")
    (tmp_path / "locks.hcl").write_text(text)
    return [f.describe("locks.hcl") for f in lint_identities(load_spec(tmp_path / "locks.hcl"))]


def test_lint_flags_a_selector_that_is_a_subset_of_another_workers_claims(tmp_path: Path) -> None:
    text = _spec_with_claims({"namespace": "prod"}, {"namespace": "prod", "service_account": "w2"})
    found = _lint(text, tmp_path)
    assert len(found) == 1
    assert found[0].startswith('locks.hcl:14: error: identity-overlap: worker "w1"\'s binding')
    assert 'a subset of the claims of "w2"' in found[0]


def test_lint_flags_both_workers_with_the_same_claims(tmp_path: Path) -> None:
    same = {"namespace": "prod", "service_account": "x"}
    found = _lint(_spec_with_claims(same, same), tmp_path)
    assert [line.split(": ")[0] for line in found] == ["locks.hcl:14", "locks.hcl:23"]


def test_lint_is_quiet_for_distinct_identities_and_other_methods(tmp_path: Path) -> None:
    assert _lint(_spec_with_claims({"namespace": "a"}, {"namespace": "b"}), tmp_path) == []
    two_methods = _spec_with_claims(
        {"namespace": "prod"}, {"namespace": "prod"}, methods=("k8s", "k9s")
    )
    assert _lint(two_methods, tmp_path) == []
