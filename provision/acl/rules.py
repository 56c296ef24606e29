"""Consul ACL rules as lockctl reads them: the resource vocabulary, a rule block's segment and
policy, and whether two rule texts grant the same (the lint, the plan and verify share these)."""

from __future__ import annotations

from typing import Any

from provision.spec.hcl import Attribute, Block, Body, HclSyntaxError
from provision.spec.hcl_parse import parse_hcl

BASIC = ("read", "write", "deny")
KEY_VALUES = ("read", "write", "deny", "list")
# Resources written `resource "segment" { ... }`, and the attributes each block may carry.
SEGMENTED = {
    **dict.fromkeys(
        (
            "agent",
            "agent_prefix",
            "event",
            "event_prefix",
            "identity",
            "identity_prefix",
            "node",
            "node_prefix",
            "query",
            "query_prefix",
            "session",
            "session_prefix",
        ),
        ("policy",),
    ),
    "key": ("policy",),
    "key_prefix": ("policy",),
    "service": ("policy", "intentions"),
    "service_prefix": ("policy", "intentions"),
}
# Enterprise scopes that hold nested rules; their own attributes are listed.
SCOPES = {
    "namespace": ("policy", "intentions"),
    "namespace_prefix": ("policy", "intentions"),
    "partition": ("mesh", "peering"),
    "partition_prefix": ("mesh", "peering"),
}
# Resources written `resource = "policy"`.
UNSEGMENTED = ("acl", "keyring", "mesh", "operator", "peering")
EXACT_TO_PREFIX = {name: f"{name}_prefix" for name in SEGMENTED if not name.endswith("_prefix")}


def rule_segment(block: Block) -> str | None:
    """The block's one quoted segment (`key_prefix "locks/a/"`), or None when it has not one."""
    if len(block.labels) != 1 or not block.labels[0].quoted:
        return None
    return block.labels[0].text


def rule_policy(block: Block) -> str | None:
    """The block's `policy = "..."` value, or None when it has no string policy."""
    for attribute in block.body.attributes:
        if attribute.name == "policy" and isinstance(attribute.value, str):
            return attribute.value
    return None


# --- semantic comparison of rules -----------------------------------------------------------


def rules_equivalent(left: str, right: str) -> bool:
    """Whether two rule texts grant the same: comments, layout and rule order do not count.

    Text that does not parse is compared as written (stripped): it is never "the same" as a
    different text by accident.
    """
    try:
        return canonical_rules(left) == canonical_rules(right)
    except HclSyntaxError:
        return left.strip() == right.strip()


def canonical_rules(text: str) -> tuple[Any, ...]:
    """A sorted, position-free form of parsed rules (the lint's parser)."""
    return _canonical_body(parse_hcl(text))


def _canonical_body(body: Body) -> tuple[Any, ...]:
    attributes = sorted((_canonical_attribute(a) for a in body.attributes), key=repr)
    blocks = sorted((_canonical_block(b) for b in body.blocks), key=repr)
    return (tuple(attributes), tuple(blocks))


def _canonical_attribute(attribute: Attribute) -> tuple[Any, ...]:
    return (attribute.name, attribute.value)


def _canonical_block(block: Block) -> tuple[Any, ...]:
    labels = tuple((label.text, label.quoted) for label in block.labels)
    return (block.type, labels, _canonical_body(block.body))
