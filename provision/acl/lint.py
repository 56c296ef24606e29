"""A linter for Consul ACL rules: what Consul accepts silently but grants nothing, or too much.

Consul 1.8 accepts unknown resources (Vault-style `path`), unknown attributes and `session` rules
naming things that are not nodes, so a policy can look right and grant nothing; and one empty
prefix grants everything. Consul will not say so: this module does.

Parsing: ACL rules use the plain `resource "segment" { policy = "..." }` and `resource = "..."`
forms, which HCL1 (what Consul parses with) and HCL2 read the same way. So this reuses the spec's
positioned walk over python-hcl2's tree instead of a second tokenizer: one parser, real line
numbers, and anything outside that common subset is reported rather than guessed at.
"""

from __future__ import annotations

import difflib
import itertools
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from provision.acl.expectations import Expectation, Grant, expectation_for, grants, show_rule
from provision.acl.rules import (
    BASIC,
    EXACT_TO_PREFIX,
    KEY_VALUES,
    SCOPES,
    SEGMENTED,
    UNSEGMENTED,
    rule_policy,
    rule_segment,
)
from provision.durations import format_duration
from provision.errors import InputError
from provision.schedule import Schedule, parse_schedule
from provision.spec.hcl import Attribute, Block, Body, HclSyntaxError
from provision.spec.hcl_parse import parse_hcl
from provision.spec.models import Spec
from provision.system.files import UnreadableFile, read_regular_file
from provision.system.http_call import Target, judge_target
from provision.timings import OVERLAP_CANCEL

Severity = Literal["error", "warning"]
MAX_RULES_BYTES = 1024 * 1024
POLICY_NAME = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


@dataclass(frozen=True)
class Finding:
    """One problem in a policy: where, how bad, which check, why, and how to fix it."""

    severity: Severity
    line: int
    rule: str
    message: str
    fix: str

    def describe(self, path: str) -> str:
        """The one-line form: `FILE:LINE: severity: rule: message (fix: ...)`."""
        return f"{path}:{self.line}: {self.severity}: {self.rule}: {self.message} (fix: {self.fix})"


def lint_file(
    path: Path,
    *,
    declared_nodes: Collection[str] | None = None,
    spec: Spec | None = None,
) -> list[Finding]:
    """Lint the policy file at `path`; its name (without `.hcl`) is the policy's name."""
    try:
        data = read_regular_file(path, MAX_RULES_BYTES)
    except UnreadableFile as exc:
        raise InputError(f"{path}: cannot read: {exc}") from None
    if len(data) > MAX_RULES_BYTES:
        message = f"is larger than {MAX_RULES_BYTES} bytes"
        return [_finding("error", 1, "file", message, "split the policy")]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return [_finding("error", 1, "file", "is not UTF-8", "save the policy as UTF-8")]
    name = path.name.removesuffix(".hcl")
    expected = expectation_for(spec, name) if spec is not None else None
    nodes = declared_nodes if spec is None else [w.name for w in spec.workers]
    return lint_rules(text, name=name, declared_nodes=nodes, expected=expected)


def catchup_findings(spec: Spec, now: datetime) -> list[Finding]:
    """What in the spec itself has no effect: a job with catchup = "latest" whose
    start_deadline is not above its schedule's interval never catches a tick up."""
    found = []
    for job in spec.jobs:
        if job.catchup != "latest" or job.schedule is None:
            continue
        deadline = job.timings.start_deadline
        interval = never_catches_up(parse_schedule(job.schedule, job.timezone), deadline, now)
        if interval is not None:
            message = (
                f'job "{job.name}": catchup = "latest" never runs a tick: start_deadline '
                f"{format_duration(deadline)} is not above the schedule's interval "
                f"{format_duration(interval)}"
            )
            fix = 'raise start_deadline above the interval, or set catchup = "skip"'
            found.append(_finding("warning", job.line, "catchup", message, fix))
    return found


def overlap_findings(spec: Spec, now: datetime) -> list[Finding]:
    """A job with overlap = "cancel" whose kill_grace is over its schedule's shortest interval:
    a run that ignores SIGTERM is killed only after the grace, so the tick that cancelled it
    starts that late, past the next tick's turn, which finds it still running."""
    found = []
    for job in spec.jobs:
        if job.overlap != OVERLAP_CANCEL or job.schedule is None:
            continue
        grace = job.timings.kill_grace
        schedule = parse_schedule(job.schedule, job.timezone)
        interval = min(
            (b - a).total_seconds()
            for a, b in itertools.pairwise(schedule.next_ticks(now, _INTERVALS + 1))
        )
        if grace > interval:
            message = (
                f'job "{job.name}": overlap = "cancel" with kill_grace {format_duration(grace)} '
                f"over the schedule's interval {format_duration(interval)}: a run that ignores "
                "SIGTERM is still running at the next tick"
            )
            fix = 'lower kill_grace below the interval, or set overlap = "skip"'
            found.append(_finding("warning", job.line, "overlap", message, fix))
    return found


def target_findings(spec: Spec) -> list[Finding]:
    """An HTTP job whose URL names another host than the replica's own loopback (judged by
    what the URL says: no lookup), unless the job says allow_remote_target. The spec itself
    refuses link-local and metadata targets; this warns of every other remote one."""
    found = []
    for job in spec.jobs:
        if job.http is None or job.allow_remote_target:
            continue
        if judge_target(job.http.url) is not Target.REMOTE:
            continue
        host = urlsplit(job.http.url).hostname
        message = (
            f'job "{job.name}": http.url calls {host}, not the replica\'s own app on loopback: '
            "the answer's first 2 KB go into the tick record, which every reader of the job's "
            "prefix can read"
        )
        fix = "call the app on 127.0.0.1 or localhost, or set allow_remote_target = true"
        line = job.http_url_line or job.line
        found.append(_finding("warning", line, "remote-target", message, fix))
    return found


# intervals of a schedule looked at: a cron's spacing repeats within a week, which 64 of its
# ticks cover for all but the sparsest
_INTERVALS = 64


def never_catches_up(schedule: Schedule, start_deadline: float, since: datetime) -> float | None:
    """The schedule's shortest interval (seconds) among its next ticks when `start_deadline`
    is not above it: a tick's claim window then closes only at its deadline, after which no
    catch-up may start (ledger/catchup.py); None when a catch-up can happen.

    An interval across a change of the zone's UTC offset (DST) is left out: `0 3 * * *` in
    Europe/Berlin is 24 h apart but for one 23 h night a year, and whether that night is
    among the next ticks would make the warning depend on the day lint runs."""
    pairs = list(itertools.pairwise(schedule.next_ticks(since, _INTERVALS + 1)))
    steady = [(a, b) for a, b in pairs if _offset(a, schedule) == _offset(b, schedule)]
    shortest = min((b - a).total_seconds() for a, b in steady or pairs)
    return shortest if start_deadline <= shortest else None


def _offset(tick: datetime, schedule: Schedule) -> timedelta | None:
    return tick.astimezone(schedule.tz).utcoffset()


def lint_rules(
    text: str,
    *,
    name: str,
    declared_nodes: Collection[str] | None = None,
    expected: Expectation | None = None,
) -> list[Finding]:
    """Every finding for the rules `text` of policy `name`, sorted by line.

    `declared_nodes` (the spec's workers) lets `session` rules be checked against real node
    names; `expected` (from `expectation_for`) flags anything broader than the job needs.
    """
    try:
        body = parse_hcl(text)
    except HclSyntaxError as exc:
        fix = 'write rules as: key_prefix "locks/job/" { policy = "write" }'
        return [_finding("error", exc.line, "syntax", f"column {exc.column}: {exc.message}", fix)]
    findings = _name_findings(name)
    findings += _body_findings(body, declared_nodes)
    if expected is not None:
        findings += _expectation_findings(grants(body), expected, name)
    return sorted(findings, key=lambda f: (f.line, f.rule, f.message))


def has_errors(findings: Iterable[Finding]) -> bool:
    """Whether any finding is an error (warnings alone do not fail a lint)."""
    return any(finding.severity == "error" for finding in findings)


def _finding(severity: Severity, line: int, rule: str, message: str, fix: str) -> Finding:
    return Finding(severity, line, rule, message, fix)


def _name_findings(name: str) -> list[Finding]:
    if POLICY_NAME.fullmatch(name):
        return []
    return [
        _finding(
            "error",
            1,
            "policy-name",
            f'"{name}" is not a valid Consul policy name',
            "use only letters, digits, '-' and '_' (at most 128)",
        )
    ]


# --- structure ------------------------------------------------------------------------------


def _body_findings(body: Body, nodes: Collection[str] | None) -> list[Finding]:
    findings: list[Finding] = []
    for attribute in body.attributes:
        findings += _attribute_rule(attribute)
    seen: dict[tuple[str, str], int] = {}
    for block in body.blocks:
        findings += _block_rule(block, nodes)
        findings += _duplicate(block, seen)
    return findings


def _attribute_rule(attribute: Attribute) -> list[Finding]:
    """`acl = "write"` and friends."""
    name, line = attribute.name, attribute.line
    if name in SEGMENTED or name in SCOPES:
        fix = f'write {name} "<segment>" {{ policy = "read" }}'
        return [_finding("error", line, "rule-syntax", f"{name} needs a segment", fix)]
    if name not in UNSEGMENTED:
        return [_unknown_resource(name, line, None)]
    value = attribute.value
    if not isinstance(value, str) or value not in BASIC:
        return [_invalid_policy(name, value, line, BASIC)]
    return _unsegmented_breadth(name, value, line)


def _unsegmented_breadth(name: str, value: str, line: int) -> list[Finding]:
    if value == "write" and name != "peering":
        why = {
            "acl": "can create tokens and policies, so it can grant itself anything",
            "operator": "can change Raft peers and autopilot: it can break the cluster",
            "keyring": "can replace the gossip encryption keys",
            "mesh": "can change every service mesh setting",
        }[name]
        fix = f'remove {name} = "write"; a lock job needs none of it'
        return [_finding("error", line, "over-broad", f'{name} = "write" {why}', fix)]
    if name == "acl" and value == "read":
        fix = 'remove acl = "read"; a lock job needs none of it'
        return [
            _finding(
                "warning", line, "over-broad", 'acl = "read" lists every token and policy', fix
            )
        ]
    return []


def _block_rule(block: Block, nodes: Collection[str] | None) -> list[Finding]:
    kind = block.type
    if kind in UNSEGMENTED:
        fix = f'write {kind} = "read" (no segment, no block)'
        return [_finding("error", block.line, "rule-syntax", f"{kind} takes no segment", fix)]
    if kind not in SEGMENTED and kind not in SCOPES:
        segment = rule_segment(block)
        return [_unknown_resource(kind, block.line, segment)]
    segment = rule_segment(block)
    if segment is None:
        fix = f'write {kind} "<segment>" {{ policy = "read" }} with one quoted segment'
        return [
            _finding("error", block.line, "rule-syntax", f"{kind} needs one quoted segment", fix)
        ]
    if kind in SCOPES:
        return _scope_rule(block, nodes)
    findings = _rule_attributes(block, SEGMENTED[kind])
    policy = rule_policy(block)
    if policy is not None and policy != "deny":
        findings += _breadth(kind, segment, block.line, nodes)
    return findings


def _scope_rule(block: Block, nodes: Collection[str] | None) -> list[Finding]:
    """Enterprise namespace/partition scopes: check their own attributes and nested rules."""
    findings: list[Finding] = []
    allowed = SCOPES[block.type]
    for attribute in block.body.attributes:
        if attribute.name not in allowed:
            findings.append(_unknown_attribute(block.type, attribute, allowed))
        elif not isinstance(attribute.value, str) or attribute.value not in BASIC:
            findings.append(_invalid_policy(attribute.name, attribute.value, attribute.line, BASIC))
    inner = Body((), block.body.blocks)
    return findings + _body_findings(inner, nodes)


def _rule_attributes(block: Block, allowed: tuple[str, ...]) -> list[Finding]:
    findings: list[Finding] = []
    values = KEY_VALUES if block.type in ("key", "key_prefix") else BASIC
    for attribute in block.body.attributes:
        if attribute.name not in allowed:
            findings.append(_unknown_attribute(block.type, attribute, allowed))
        elif not isinstance(attribute.value, str) or attribute.value not in values:
            findings.append(
                _invalid_policy(attribute.name, attribute.value, attribute.line, values)
            )
    for nested in block.body.blocks:
        if nested.type != "sentinel" or block.type not in ("key", "key_prefix"):
            fix = f'keep only policy = "..." inside {block.type}'
            message = f"unexpected block {nested.type} inside {block.type}: Consul ignores it"
            findings.append(_finding("error", nested.line, "unknown-attribute", message, fix))
    if "policy" not in {a.name for a in block.body.attributes}:
        fix = 'add policy = "read" (or "write", "deny")'
        message = f"{block.type} has no policy: it grants nothing"
        findings.append(_finding("error", block.line, "missing-policy", message, fix))
    return findings


def _duplicate(block: Block, seen: dict[tuple[str, str], int]) -> list[Finding]:
    segment = rule_segment(block)
    if segment is None or block.type not in SEGMENTED:
        return []
    key = (block.type, segment)
    if key not in seen:
        seen[key] = block.line
        return []
    message = f'{block.type} "{segment}" again; the first is on line {seen[key]}'
    return [_finding("warning", block.line, "duplicate-rule", message, "keep one rule per segment")]


def _unknown_resource(kind: str, line: int, segment: str | None) -> Finding:
    message = (
        f"{kind} is not a Consul ACL resource: Consul accepts it silently and it grants nothing"
    )
    if kind == "path":
        target = segment.rstrip("/") + "/" if segment else "locks/<job>/"
        fix = f'path is Vault syntax; for KV use key_prefix "{target}" {{ policy = "write" }}'
    else:
        close = difflib.get_close_matches(kind, [*SEGMENTED, *UNSEGMENTED, *SCOPES], n=1)
        fix = f"did you mean {close[0]}?" if close else "use key, key_prefix, session, node, ..."
    return _finding("error", line, "unknown-resource", message, fix)


def _unknown_attribute(kind: str, attribute: Attribute, allowed: tuple[str, ...]) -> Finding:
    message = f"{attribute.name} is not an attribute of {kind}: Consul ignores it"
    fix = f"use only {', '.join(allowed)}"
    if attribute.name == "capabilities":
        fix = 'capabilities is Vault syntax; write policy = "write"'
    return _finding("error", attribute.line, "unknown-attribute", message, fix)


def _invalid_policy(name: str, value: object, line: int, allowed: tuple[str, ...]) -> Finding:
    shown = f'"{value}"' if isinstance(value, str) else "a non-string value"
    message = f"{name} = {shown} is not a policy value: Consul refuses the policy"
    fix = "use " + ", ".join(f'"{v}"' for v in allowed)
    return _finding("error", line, "invalid-policy", message, fix)


# --- breadth --------------------------------------------------------------------------------


def _breadth(kind: str, segment: str, line: int, nodes: Collection[str] | None) -> list[Finding]:
    """What a granting (non-deny) rule reaches beyond what its author likely meant."""
    if kind.endswith("_prefix") and segment == "":
        base = kind.removesuffix("_prefix")
        message = f'{kind} "" grants every {base}, not one'
        fix = f'name exactly what is needed, e.g. {base} "<name>" or {kind} "<name>/"'
        return [_finding("error", line, "over-broad", message, fix)]
    if kind in EXACT_TO_PREFIX and segment == "":
        return [_empty_exact(kind, line)]
    if kind == "session":
        return _session_node(segment, line, nodes)
    if kind == "session_prefix":
        message = f'session_prefix "{segment}" allows sessions on every node whose name starts so'
        fix = 'use session "<worker node>" for each worker'
        return [_finding("warning", line, "over-broad", message, fix)]
    if kind == "key_prefix" and not segment.endswith("/"):
        message = f'key_prefix "{segment}" also matches "{segment}x..." and any longer sibling'
        return [
            _finding("warning", line, "prefix-without-slash", message, "end the prefix with '/'")
        ]
    return []


def _empty_exact(kind: str, line: int) -> Finding:
    if kind == "session":
        message = 'session "" is an exact match on a node named "", not a prefix: it grants nothing'
        fix = 'name the worker node: session "worker-1" (session_prefix "" would be every node)'
        return _finding("error", line, "session-empty-name", message, fix)
    message = f'{kind} "" is an exact match on the empty name, not a prefix: it grants nothing'
    return _finding("error", line, "empty-exact-name", message, f"name the {kind} exactly")


def _session_node(segment: str, line: int, nodes: Collection[str] | None) -> list[Finding]:
    if nodes is None:
        message = f'session "{segment}": cannot tell whether it is a worker node name'
        fix = "lint with --spec (or --node NAME) so session rules can be checked"
        return [_finding("warning", line, "session-not-a-node", message, fix)]
    if segment in nodes:
        return []
    known = ", ".join(sorted(nodes)) or "none"
    message = (
        f'session "{segment}" names no declared worker node ({known}): session rules match the '
        "node of the agent serving the request, not a session's Name, so it grants nothing"
    )
    fix = 'use session "<worker node>", e.g. session "worker-1"'
    return [_finding("error", line, "session-not-a-node", message, fix)]


# --- against the spec (acl/expectations.py) --------------------------------------------------


def _expectation_findings(found: list[Grant], expected: Expectation, name: str) -> list[Finding]:
    findings: list[Finding] = []
    for grant in found:
        if grant.rule not in expected.rules and grant.rule.policy != "deny":
            shown = show_rule(grant.rule)
            message = f"{shown} is broader than needed: {expected.why}"
            fix = "grant only " + "; ".join(show_rule(r) for r in sorted(expected.rules, key=str))
            findings.append(_finding("error", grant.line, "broader-than-needed", message, fix))
    present = {grant.rule for grant in found}
    for rule in sorted(expected.rules - present, key=str):
        message = f"{name} lacks {show_rule(rule)}: {expected.why}"
        fix = f"add {show_rule(rule)}"
        findings.append(_finding("error", 1, "missing-grant", message, fix))
    return findings
