"""Owners: the marker's owner (format and parse, an earlier lockctl's markers), the spec's
`owner`, and plans over two owners' objects on one cluster (prune deletes only its own; an
object of another owner is refused before anything is planned). Golden plan cases with two
owners: tests/golden/plan/*owner*.json."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from provision.acl.identity_plan import (
    LiveAuthMethod,
    LiveIdentity,
    LiveRole,
    LiveRule,
    plan_identity,
)
from provision.acl.owners import OwnerConflict
from provision.acl.plan import plan_changes
from provision.acl.render import render_policies
from provision.acl.state import (
    Desired,
    LivePolicy,
    LiveState,
    LiveToken,
    TokenFileState,
    desired_from_render,
)
from provision.errors import EXIT_INPUT
from provision.spec import parse_spec
from provision.spec.names import (
    DEFAULT_OWNER,
    Marker,
    managed_description,
    parse_managed,
    parse_token_description,
    token_description,
)
from provision.system.templates import find_templates_dir

IDENTITY = Path(__file__).resolve().parents[1] / "golden" / "identity"

# --- the marker -----------------------------------------------------------------------------

MARKERS = [
    # (owner, source, the description written)
    (DEFAULT_OWNER, 'job "x"', 'lockctl-managed: job "x"'),  # what every earlier lockctl wrote
    ("payments", 'job "x"', 'lockctl-managed (owner payments): job "x"'),
    ("a_b-9", 'worker "w"', 'lockctl-managed (owner a_b-9): worker "w"'),
    ("billing", 'auth_method "k8s"', 'lockctl-managed (owner billing): auth_method "k8s"'),
]


@pytest.mark.parametrize(("owner", "source", "description"), MARKERS)
def test_marker_is_written_and_read_back(owner: str, source: str, description: str) -> None:
    assert managed_description(source, owner) == description
    assert parse_managed(description) == Marker(owner, source)


TOKENS = [
    (DEFAULT_OWNER, "worker-1", "lockctl worker worker-1"),  # an earlier lockctl's, unchanged
    ("payments", "worker-1", "lockctl (owner payments) worker worker-1"),
]


@pytest.mark.parametrize(("owner", "worker", "description"), TOKENS)
def test_token_description_is_written_and_read_back(
    owner: str, worker: str, description: str
) -> None:
    assert token_description(worker, owner) == description
    assert parse_token_description(description) == Marker(owner, worker)


@pytest.mark.parametrize(
    ("description", "expected"),
    [
        ('lockctl-managed: worker "w"', Marker(DEFAULT_OWNER, 'worker "w"')),  # no owner: default
        ('lockctl-managed (owner default): job "x"', Marker(DEFAULT_OWNER, 'job "x"')),
        # An owner no spec could name is still somebody's, never free to adopt.
        ('lockctl-managed (owner Ops Team): job "x"', Marker("Ops Team", 'job "x"')),
        (
            "lockctl-managed: agent token for node n1",
            Marker(DEFAULT_OWNER, "agent token for node n1"),
        ),
        ("lockctl-managed (owner ): job", None),
        ("lockctl-managed job", None),
        ("ops team", None),
        ("", None),
    ],
)
def test_parse_managed(description: str, expected: Marker | None) -> None:
    assert parse_managed(description) == expected


@pytest.mark.parametrize(
    ("description", "expected"),
    [
        ("lockctl worker w1", Marker(DEFAULT_OWNER, "w1")),
        ("lockctl (owner b) worker w1", Marker("b", "w1")),
        ("lockctl worker ", None),
        ("lockctl-managed: agent token for node n1", None),
        ("ops team token", None),
    ],
)
def test_parse_token_description(description: str, expected: Marker | None) -> None:
    assert parse_token_description(description) == expected


def test_another_owners_markers_do_not_look_like_an_earlier_lockctls() -> None:
    """An earlier lockctl knows only `lockctl-managed: ` and `lockctl worker `: it must not take
    another owner's objects for its own (its --prune would delete them)."""
    assert not managed_description('job "x"', "payments").startswith("lockctl-managed: ")
    assert not token_description("w1", "payments").startswith("lockctl worker ")


# --- the spec and render --------------------------------------------------------------------

SPEC = 'worker "w1" {}\njob "a" {\n  prefix = "locks/a/"\n  workers = ["w1"]\n}\n'


def _desired(text: str) -> Desired:
    return desired_from_render(render_policies(parse_spec(text, "s.hcl"), find_templates_dir()))


def test_a_spec_without_owner_renders_the_descriptions_of_before() -> None:
    desired = _desired(SPEC)
    assert desired.owner == DEFAULT_OWNER
    assert [p.description for p in desired.policies] == [
        'lockctl-managed: job "a"',
        'lockctl-managed: worker "w1"',
    ]
    assert [t.description for t in desired.tokens] == ["lockctl worker w1"]


def test_the_owner_is_in_every_description() -> None:
    desired = _desired('owner = "payments"\n' + SPEC)
    assert desired.owner == "payments"
    assert [p.description for p in desired.policies] == [
        'lockctl-managed (owner payments): job "a"',
        'lockctl-managed (owner payments): worker "w1"',
    ]
    assert [t.description for t in desired.tokens] == ["lockctl (owner payments) worker w1"]


def test_the_identity_objects_carry_the_owner() -> None:
    text = (IDENTITY / "locks.hcl").read_text(encoding="utf-8")
    spec = parse_spec('owner = "payments"\n' + text, str(IDENTITY / "locks.hcl"))
    identity = render_policies(spec, find_templates_dir()).identity
    descriptions = [m.description for m in identity.methods]
    descriptions += [r.description for r in identity.roles] + [
        r.description for r in identity.rules
    ]
    assert descriptions and all(
        parse_managed(d) is not None and parse_managed(d).owner == "payments"  # type: ignore[union-attr]
        for d in descriptions
    )


# --- plans over two owners ------------------------------------------------------------------


def _applied(desired: Desired) -> LiveState:
    """What Consul holds after `desired` was applied (rules and hashes as the list shows)."""
    policies = tuple(
        LivePolicy(f"id-{p.name}", p.name, p.description, p.hash, p.rules) for p in desired.policies
    )
    tokens = tuple(
        LiveToken(f"acc-{desired.owner}-{t.worker}", t.description, t.policies)
        for t in desired.tokens
    )
    return LiveState(policies, tokens)


def _both(*states: LiveState) -> LiveState:
    return LiveState(
        tuple(p for s in states for p in s.policies), tuple(t for s in states for t in s.tokens)
    )


A = 'owner = "team-a"\nworker "a1" {}\n' + "".join(
    f'job "a-{n}" {{\n  prefix = "locks/a-{n}/"\n  workers = ["a1"]\n}}\n' for n in ("x", "y")
)
B = (
    'owner = "team-b"\nworker "b1" {}\n'
    'job "b-x" {\n  prefix = "locks/b-x/"\n  workers = ["b1"]\n}\n'
)


def _files(desired: Desired) -> dict[str, TokenFileState]:
    return {t.worker: TokenFileState(f"acc-{desired.owner}-{t.worker}") for t in desired.tokens}


@pytest.mark.parametrize("prune", [True, False])
def test_each_owner_sees_only_its_own_objects(prune: bool) -> None:
    a, b = _desired(A), _desired(B)
    live = _both(_applied(a), _applied(b))
    for mine in (a, b):
        plan = plan_changes(mine, live, token_files=_files(mine), prune=prune)
        assert not plan.has_changes and plan.not_pruned == ()


def test_prune_after_removing_a_job_deletes_only_that_owners_stale_policy() -> None:
    a, b = _desired(A), _desired(B)
    live = _both(_applied(a), _applied(b))
    smaller = _desired(
        A.replace('job "a-y" {\n  prefix = "locks/a-y/"\n  workers = ["a1"]\n}\n', "")
    )
    plan = plan_changes(smaller, live, token_files=_files(smaller), prune=True)
    assert [(c.action, c.name) for c in plan.policies] == [("delete", "lock-a-y")]
    assert [(c.action, c.policies) for c in plan.tokens] == [("update", ("lock-a-x", "session-a1"))]
    untouched = {p.name for p in _applied(b).policies}
    assert untouched.isdisjoint(c.name for c in plan.policies)


@pytest.mark.parametrize(
    ("spec_b", "refused"),
    [
        # a job of the same name: its lock policy is A's
        (B.replace('job "b-x"', 'job "a-x"'), "policy lock-a-x"),
        # a worker of the same name: its session policy and token are A's
        (B.replace('"b1"', '"a1"'), "policy session-a1"),
    ],
)
def test_a_name_the_other_owner_manages_is_refused(spec_b: str, refused: str) -> None:
    a, b = _desired(A), _desired(spec_b)
    live = _both(_applied(a))
    with pytest.raises(OwnerConflict) as caught:
        plan_changes(b, live, token_files={}, prune=True)
    message = str(caught.value)
    assert caught.value.exit_code == EXIT_INPUT
    assert message.startswith(f'{refused} in Consul is managed by owner "team-a", not by')
    assert 'this spec\'s owner "team-b"' in message and "\n" not in message


def test_a_worker_token_of_another_owner_is_refused_even_without_its_policy() -> None:
    a = _desired(A)
    theirs = LiveToken("acc-x", token_description("a1", "team-b"), ("session-a1",))
    with pytest.raises(
        OwnerConflict, match=r'^token of worker a1 in Consul is managed by owner "team-b"'
    ):
        plan_changes(a, LiveState((), (theirs,)), prune=False)


def test_a_default_owner_spec_adopts_what_an_earlier_lockctl_wrote_with_no_change() -> None:
    """The upgrade: the same descriptions, the same hashes; a re-plan is a no-op."""
    old = _desired(SPEC)
    plan = plan_changes(old, _applied(old), token_files=_files(old), prune=True)
    assert not plan.has_changes and plan.unchanged_policies == 2 and plan.unchanged_tokens == 1


def test_a_named_owner_does_not_take_an_earlier_lockctls_objects() -> None:
    """Objects without an owner in their marker are the default owner's: a spec that names an
    owner and wants the same names is refused, not silently re-marked as its own."""
    old = _desired(SPEC)
    with pytest.raises(
        OwnerConflict, match='managed by owner "default", not by this spec\'s owner "payments"'
    ):
        plan_changes(_desired('owner = "payments"\n' + SPEC), _applied(old), prune=False)


# --- identity objects -----------------------------------------------------------------------


def _identity_spec(owner: str) -> Desired:
    text = (IDENTITY / "locks.hcl").read_text(encoding="utf-8")
    spec = parse_spec(f'owner = "{owner}"\n' + text, str(IDENTITY / "locks.hcl"))
    return desired_from_render(render_policies(spec, find_templates_dir()))


def test_prune_of_identity_objects_deletes_only_its_owners() -> None:
    mine = _identity_spec("team-a").identity
    theirs = LiveIdentity(
        roles=(
            LiveRole(
                "r-b",
                "worker-b1",
                managed_description('worker "b1"', "team-b"),
                ("session-b1",),
            ),
            LiveRole("r-old", "worker-old", managed_description('worker "old"', "team-a"), ()),
        ),
        rules=(
            LiveRule(
                "rule-b",
                "k8s-b",
                managed_description('worker "b1"', "team-b"),
                "x",
                "role",
                "worker-b1",
            ),
            LiveRule(
                "rule-old",
                "k8s",
                managed_description('worker "old"', "team-a"),
                "x",
                "role",
                "worker-old",
            ),
        ),
    )
    plan = plan_identity(mine, theirs, prune=True, owner="team-a")
    deleted = [(c.kind, c.id) for c in plan.changes if c.action == "delete"]
    assert deleted == [("binding-rule", "rule-old"), ("role", "r-old")]


def test_a_role_or_auth_method_of_another_owner_is_refused() -> None:
    a = _identity_spec("team-a")
    b = _identity_spec("team-b")
    role = b.identity.roles[0]
    live = LiveState(
        (),
        (),
        LiveIdentity(roles=(LiveRole("r-1", role.name, role.description, role.policies),)),
    )
    with pytest.raises(
        OwnerConflict, match=rf'^role {role.name} in Consul is managed by owner "team-b"'
    ):
        plan_changes(a, live, prune=False)
    method = b.identity.methods[0]
    live = replace(
        live,
        identity=LiveIdentity(
            methods=(LiveAuthMethod(method.name, method.type, method.description, "10m0s"),)
        ),
    )
    with pytest.raises(
        OwnerConflict, match=rf'^auth-method {method.name} in Consul is managed by owner "team-b"'
    ):
        plan_changes(a, live, prune=False)
