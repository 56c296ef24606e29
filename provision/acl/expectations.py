"""What the spec says each lockctl policy may grant, and what a policy's rules do grant.

A job's lock policy needs exactly its prefix (write) and its control keys (read), a worker's
session policy exactly its node (session write; an agentless worker node write too, to register
that node and nothing else): lint holds a policy to this, so a grant broader than needed is an
error, not a review comment.
"""

from __future__ import annotations

from dataclasses import dataclass

from provision.acl.rules import rule_policy, rule_segment
from provision.spec.hcl import Body
from provision.spec.models import Spec
from provision.spec.names import lock_policy_name, session_policy_name
from provision.system.control_keys import control_prefix


@dataclass(frozen=True)
class Rule:
    """What a rule grants, without its position: `key_prefix "locks/a/"` write."""

    resource: str
    segment: str | None
    policy: str


@dataclass(frozen=True)
class Expectation:
    """What one policy may grant, from the spec: exactly `rules` and nothing more."""

    rules: frozenset[Rule]
    why: str


def expectation_for(spec: Spec, policy_name: str) -> Expectation | None:
    """What the spec says policy `policy_name` needs, or None when it is not a lockctl policy."""
    return _expectations(spec).get(policy_name)


_last_expectations: tuple[Spec, dict[str, Expectation]] | None = None


def _expectations(spec: Spec) -> dict[str, Expectation]:
    """Every lockctl policy of `spec` by name (the first job or worker of a name wins), made
    once per spec: render and lint ask for each of its policies in turn."""
    global _last_expectations  # one spec's index, replaced whole
    last = _last_expectations
    if last is not None and last[0] is spec:
        return last[1]
    found: dict[str, Expectation] = {}
    for job in spec.jobs:
        rule = Rule("key_prefix", job.prefix, "write")
        control = Rule("key_prefix", control_prefix(job.name), "read")
        why = f'job "{job.name}" needs only its prefix and read on its control keys'
        found.setdefault(lock_policy_name(job.name), Expectation(frozenset({rule, control}), why))
    for worker in spec.workers:
        rules = {Rule("session", worker.name, "write")}
        why = f'worker "{worker.name}" needs only its node'
        if worker.agentless:  # it registers its own catalog node, and only that one
            rules.add(Rule("node", worker.name, "write"))
            why += " (sessions on it, and registering it: agentless)"
        found.setdefault(session_policy_name(worker.name), Expectation(frozenset(rules), why))
    _last_expectations = (spec, found)
    return found


@dataclass(frozen=True)
class Grant:
    """One rule of a policy, and the line it stands on."""

    rule: Rule
    line: int


def grants(body: Body) -> list[Grant]:
    """Every rule in the policy as (resource, segment, policy), unparseable ones as written."""
    found = [
        Grant(Rule(a.name, None, a.value if isinstance(a.value, str) else "?"), a.line)
        for a in body.attributes
    ]
    for block in body.blocks:
        policy = rule_policy(block) or "?"
        found.append(Grant(Rule(block.type, rule_segment(block), policy), block.line))
    return found


def show_rule(rule: Rule) -> str:
    if rule.segment is None:
        return f'{rule.resource} = "{rule.policy}"'
    return f'{rule.resource} "{rule.segment}" {{ policy = "{rule.policy}" }}'
