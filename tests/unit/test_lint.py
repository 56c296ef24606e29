"""The ACL rules linter: what Consul accepts silently but grants nothing, or too much."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from provision.acl.expectations import Expectation, Rule, expectation_for
from provision.acl.lint import Finding, has_errors, lint_file, lint_rules, never_catches_up
from provision.errors import InputError
from provision.schedule import parse_schedule
from provision.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
NODES = ("worker-1", "worker-2")
# The widely copied example: it looks right and grants nothing at all.
COPIED_EXAMPLE = """\
path "job/singleton" {
  policy = "write"
}
session "job-lock" {
  policy = "write"
}
"""


def _summary(findings: list[Finding]) -> list[tuple[str, int, str]]:
    return [(f.severity, f.line, f.rule) for f in findings]


def test_the_widely_copied_example_is_flagged_twice() -> None:
    findings = lint_rules(COPIED_EXAMPLE, name="job-lock", declared_nodes=NODES)
    assert _summary(findings) == [
        ("error", 1, "unknown-resource"),
        ("error", 4, "session-not-a-node"),
    ]
    assert "Vault" in findings[0].fix and 'key_prefix "job/singleton/"' in findings[0].fix
    assert "not a session's Name" in findings[1].message


def test_without_declared_nodes_the_session_rule_is_still_flagged_as_unchecked() -> None:
    findings = lint_rules(COPIED_EXAMPLE, name="job-lock")
    assert _summary(findings) == [
        ("error", 1, "unknown-resource"),
        ("warning", 4, "session-not-a-node"),
    ]
    assert "--spec" in findings[1].fix


CASES = [
    ('key_prefix "locks/a/" {\n  policy = "write"\n}\n', []),
    ('session "worker-1" {\n  policy = "write"\n}\n', []),
    ('key "locks/a/.lock" {\n  policy = "list"\n}\n', []),
    ('key_prefix "locks/a/" {\n  policy = "list"\n}\n', []),
    ('node "worker-1" {\n  policy = "write"\n}\n', []),
    ('service "web" {\n  policy = "read"\n  intentions = "read"\n}\n', []),
    ('operator = "read"\nkeyring = "read"\n', []),
    ('key_prefix "" {\n  policy = "deny"\n}\n', []),
    ('session "job-lock" {\n  policy = "deny"\n}\n', []),
    ('key_prefix "" {\n  policy = "write"\n}\n', [("error", 1, "over-broad")]),
    ('key_prefix "" {\n  policy = "read"\n}\n', [("error", 1, "over-broad")]),
    ('session_prefix "" {\n  policy = "write"\n}\n', [("error", 1, "over-broad")]),
    ('node_prefix "" {\n  policy = "read"\n}\n', [("error", 1, "over-broad")]),
    ('service_prefix "" {\n  policy = "write"\n}\n', [("error", 1, "over-broad")]),
    ('acl = "write"\n', [("error", 1, "over-broad")]),
    ('operator = "write"\n', [("error", 1, "over-broad")]),
    ('keyring = "write"\n', [("error", 1, "over-broad")]),
    ('mesh = "write"\n', [("error", 1, "over-broad")]),
    ('acl = "read"\n', [("warning", 1, "over-broad")]),
    ('session "" {\n  policy = "write"\n}\n', [("error", 1, "session-empty-name")]),
    ('key "" {\n  policy = "write"\n}\n', [("error", 1, "empty-exact-name")]),
    ('session "web-1" {\n  policy = "write"\n}\n', [("error", 1, "session-not-a-node")]),
    ('session_prefix "worker-" {\n  policy = "write"\n}\n', [("warning", 1, "over-broad")]),
    ('key_prefix "locks/a" {\n  policy = "write"\n}\n', [("warning", 1, "prefix-without-slash")]),
    ('path "secret/x" {\n  capabilities = ["read"]\n}\n', [("error", 1, "unknown-resource")]),
    ('keys "locks/a/" {\n  policy = "write"\n}\n', [("error", 1, "unknown-resource")]),
    ('agentt = "read"\n', [("error", 1, "unknown-resource")]),
    ('key_prefix "locks/a/" {\n  policy = "wrte"\n}\n', [("error", 2, "invalid-policy")]),
    ('session "worker-1" {\n  policy = "list"\n}\n', [("error", 2, "invalid-policy")]),
    ('acl = "admin"\n', [("error", 1, "invalid-policy")]),
    ('key_prefix "locks/a/" {\n  policy = write\n}\n', [("error", 2, "invalid-policy")]),
    (
        'key_prefix "locks/a/" {\n  policy = "write"\n  capabilities = ["create"]\n}\n',
        [("error", 3, "unknown-attribute")],
    ),
    ('key_prefix "locks/a/" {\n}\n', [("error", 1, "missing-policy")]),
    (
        'key_prefix "locks/a/" {\n  policy = "write"\n  sub {\n  }\n}\n',
        [("error", 3, "unknown-attribute")],
    ),
    ('key_prefix = "write"\n', [("error", 1, "rule-syntax")]),
    ('acl "x" {\n  policy = "write"\n}\n', [("error", 1, "rule-syntax")]),
    ('key_prefix {\n  policy = "write"\n}\n', [("error", 1, "rule-syntax")]),
    ('key_prefix locks {\n  policy = "write"\n}\n', [("error", 1, "rule-syntax")]),
    (
        'key "a" {\n  policy = "read"\n}\nkey "a" {\n  policy = "read"\n}\n',
        [("warning", 4, "duplicate-rule")],
    ),
    ('key_prefix "a/" {\n  policy = "write"\n', [("error", 2, "syntax")]),
    (
        'namespace "ns" {\n  policy = "read"\n  key_prefix "" {\n    policy = "write"\n  }\n}\n',
        [("error", 3, "over-broad")],
    ),
    ('partition "p" {\n  mesh = "all"\n}\n', [("error", 2, "invalid-policy")]),
]


@pytest.mark.parametrize(("rules", "expected"), CASES)
def test_lint_table(rules: str, expected: list[tuple[str, int, str]]) -> None:
    findings = lint_rules(rules, name="p", declared_nodes=NODES)
    assert _summary(findings) == expected
    assert all(f.message and f.fix and "\n" not in f.describe("x.hcl") for f in findings)


def test_policy_names_consul_refuses_are_flagged() -> None:
    (finding,) = lint_rules('key "a" {\n  policy = "read"\n}\n', name="my policy")
    assert finding.rule == "policy-name"


def test_given_the_spec_anything_broader_than_the_job_needs_is_an_error() -> None:
    spec = load_spec(ROOT / "policies" / "locks.hcl")
    expected = expectation_for(spec, "lock-nightly-ingest")
    assert expected is not None
    assert expected.rules == {
        Rule("key_prefix", "locks/nightly-ingest/", "write"),
        Rule("key_prefix", "lockctl/control/nightly-ingest/", "read"),
    }
    wider = 'key_prefix "locks/" {\n  policy = "write"\n}\n'
    findings = lint_rules(
        wider, name="lock-nightly-ingest", declared_nodes=NODES, expected=expected
    )
    assert _summary(findings) == [
        ("error", 1, "broader-than-needed"),
        ("error", 1, "missing-grant"),
        ("error", 1, "missing-grant"),
    ]
    read_too = (
        'key_prefix "locks/nightly-ingest/" {\n  policy = "write"\n}\n'
        'key_prefix "lockctl/control/nightly-ingest/" {\n  policy = "read"\n}\n'
        'session "worker-1" {\n  policy = "write"\n}\n'
    )
    findings = lint_rules(read_too, name="x", declared_nodes=NODES, expected=expected)
    assert _summary(findings) == [("error", 7, "broader-than-needed")]
    writes_control = read_too.replace('policy = "read"', 'policy = "write"')
    findings = lint_rules(writes_control, name="x", declared_nodes=NODES, expected=expected)
    assert ("error", 4, "broader-than-needed") in _summary(findings)


def test_expectations_exist_only_for_lockctl_policies() -> None:
    spec = load_spec(ROOT / "policies" / "locks.hcl")
    session = expectation_for(spec, "session-worker-3")
    assert session == Expectation(
        frozenset({Rule("session", "worker-3", "write")}), 'worker "worker-3" needs only its node'
    )
    assert expectation_for(spec, "lock-nope") is None
    assert expectation_for(spec, "agent-worker-1") is None


def test_committed_policies_lint_clean_against_the_spec() -> None:
    spec = load_spec(ROOT / "policies" / "locks.hcl")
    files = sorted((ROOT / "policies").glob("*-*.hcl"))
    assert len(files) == 7
    for path in files:
        assert lint_file(path, spec=spec) == [], path


def test_describe_is_file_line_severity_rule_message_fix() -> None:
    finding = Finding("error", 3, "over-broad", 'acl = "write" is bad', "remove it")
    assert finding.describe("p.hcl") == (
        'p.hcl:3: error: over-broad: acl = "write" is bad (fix: remove it)'
    )
    assert has_errors([finding]) and not has_errors([Finding("warning", 1, "r", "m", "f")])


def test_lint_file_reports_encoding_and_refuses_missing_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.hcl"
    bad.write_bytes(b'key "\xff" {}\n')
    assert _summary(lint_file(bad)) == [("error", 1, "file")]
    with pytest.raises(InputError, match="cannot read"):
        lint_file(tmp_path / "missing.hcl")


def test_lint_file_uses_the_file_name_as_policy_name(tmp_path: Path) -> None:
    spec = load_spec(ROOT / "policies" / "locks.hcl")
    path = tmp_path / "lock-hourly-report.hcl"
    path.write_text('key_prefix "locks/" {\n  policy = "write"\n}\n')
    rules = {f.rule for f in lint_file(path, spec=spec)}
    assert rules == {"broader-than-needed", "missing-grant"}


# (schedule, zone, start_deadline, warns): the catch-up warning is the schedule's, not the day's
CATCHUP_CASES = [
    ("0 3 * * *", "Europe/Berlin", 23.5 * 3600, True),  # 24 h apart but one 23 h night a year
    ("0 3 * * *", "Europe/Berlin", 24.5 * 3600, False),
    ("0 3 * * *", "UTC", 23.5 * 3600, True),
    ("0 9,17 * * 1-5", "Europe/Berlin", 10 * 3600, False),  # 17:00 -> 09:00 can catch up
    ("0 9,17 * * 1-5", "Europe/Berlin", 8 * 3600, True),
    ("@every 10s", "Europe/Berlin", 10.0, True),
]
# a day with the spring change among the next 64 ticks, one with the autumn one, one with none
LINT_DAYS = [datetime(2026, 2, 1, tzinfo=timezone.utc), datetime(2026, 9, 1, tzinfo=timezone.utc)]
LINT_DAYS += [datetime(2026, 6, 1, tzinfo=timezone.utc)]


@pytest.mark.parametrize(("schedule", "zone", "deadline", "warns"), CATCHUP_CASES)
@pytest.mark.parametrize("day", LINT_DAYS, ids=["february", "september", "june"])
def test_the_catchup_warning_does_not_depend_on_the_day_lint_runs(
    schedule: str, zone: str, deadline: float, warns: bool, day: datetime
) -> None:
    found = never_catches_up(parse_schedule(schedule, zone), deadline, day)
    assert (found is not None) is warns
