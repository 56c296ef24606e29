"""Workload identity in the spec: `auth_method` blocks and each worker's `identity` block.

Every value here ends up in a Consul auth method or inside a binding rule's selector
(`value.namespace == "prod"`), so names and values are held to strict patterns and never
escaped: a quote, a backslash or a space in a claim is refused, not quoted.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

from provision.durations import Duration, DurationSyntaxError, parse_duration
from provision.spec.hcl import Attribute, Block
from provision.spec.models import AuthMethod, Identity
from provision.spec.names import NAME_RULE, is_valid_name
from provision.spec.problems import Problems, shown
from provision.spec.values import read_string

AUTH_METHOD_KEYS = (
    "type",
    "bound_issuer",
    "bound_audiences",
    "jwt_validation_pub_keys_file",
    "max_token_ttl",
)
AUTH_METHOD_BLOCKS = ("claim_mappings",)
IDENTITY_KEYS = ("auth_method",)
IDENTITY_BLOCKS = ("claims",)
METHOD_TYPES = ("jwt",)  # Consul 1.8's OSS types lockctl renders; kubernetes has its own keys
# A name a selector reads as `value.<name>`: go-bexpr takes letters, digits and '_'.
CLAIM_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
CLAIM_NAME_RULE = "1-63 characters: lowercase letters, digits and '_', starting with a letter"
# A claim as Consul's ClaimMappings keys name it: a top-level claim or a JSON pointer.
CLAIM_POINTER = re.compile(r"^/?[A-Za-z0-9_.:-]{1,128}(/[A-Za-z0-9_.:-]{1,128}){0,7}$")
# A value a selector compares with: no quote, backslash, space or control character.
CLAIM_VALUE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@/+=-]{0,252}$")
CLAIM_VALUE_RULE = (
    "1-253 characters: letters, digits and _ . : @ / + = -, starting with a letter or digit"
)
# Issuers and audiences are compared by Consul, not put in a selector; printable ASCII only.
PLAIN_TEXT = re.compile(r"^[\x21-\x7e]{1,512}$")
MIN_TOKEN_TTL = 60.0  # Consul 1.8 refuses a MaxTokenTTL outside 1m..24h (its token TTL bounds)
MAX_TOKEN_TTL = 24 * 3600.0


def read_auth_methods(blocks: list[Block], problems: Problems) -> dict[str, AuthMethod]:
    """Each valid `auth_method "NAME" { ... }` block by name; problems for the rest."""
    methods: dict[str, AuthMethod] = {}
    first: dict[str, int] = {}
    for block in blocks:
        name = _name(block, problems)
        if name is not None and name in first:
            problems.add(
                block.line,
                f'auth_method "{name}"',
                f"duplicate auth_method; the first is on line {first[name]}",
            )
            continue
        if name is not None:
            first[name] = block.line
        method = _auth_method(block, name, problems)
        if method is not None:
            methods[method.name] = method
    return methods


def _name(block: Block, problems: Problems) -> str | None:
    if len(block.labels) != 1:
        problems.add(block.line, "auth_method", 'expected one label: auth_method "NAME" { ... }')
        return None
    label = block.labels[0]
    if label.text is None or not label.quoted:
        problems.add(block.line, "auth_method", 'the name must be a plain quoted string: "NAME"')
        return None
    if not is_valid_name(label.text):
        where = f'auth_method "{shown(label.text)}"'
        problems.add(block.line, where, f"invalid name: {NAME_RULE}")
        return None
    return label.text


def _auth_method(block: Block, name: str | None, problems: Problems) -> AuthMethod | None:
    where = f'auth_method "{shown(name)}"' if name else "auth_method"
    found, nested = _fields(block, where, AUTH_METHOD_KEYS, AUTH_METHOD_BLOCKS, problems)
    kind = _required_string(found, "type", where, block.line, problems)
    if kind is not None and kind not in METHOD_TYPES:
        problems.add(found["type"].line, f"{where}.type", f'"{shown(kind)}": expected "jwt"')
        kind = None
    issuer = _plain(found.get("bound_issuer"), f"{where}.bound_issuer", problems)
    audiences = _audiences(found.get("bound_audiences"), f"{where}.bound_audiences", problems)
    keys = _required_string(found, "jwt_validation_pub_keys_file", where, block.line, problems)
    if keys == "":
        problems.add(found["jwt_validation_pub_keys_file"].line, where, "empty file path")
        keys = None
    ttl = _ttl(found, where, block.line, problems)
    mappings = _claim_mappings(nested.get("claim_mappings"), where, block.line, problems)
    if None in (name, kind, keys, ttl, mappings) or audiences is None:
        return None
    assert name and kind and keys and ttl and mappings is not None
    return AuthMethod(
        name=name,
        type=kind,
        bound_issuer=issuer,
        bound_audiences=audiences,
        jwt_validation_pub_keys_file=keys,
        max_token_ttl=ttl,
        claim_mappings=mappings,
        line=block.line,
        keys_line=found["jwt_validation_pub_keys_file"].line,
    )


def _required_string(
    found: dict[str, Attribute], key: str, where: str, line: int, problems: Problems
) -> str | None:
    if key not in found:
        problems.add(line, where, f"{key} is required")
        return None
    return read_string(found[key], f"{where}.{key}", problems)


def _plain(attribute: Attribute | None, where: str, problems: Problems) -> str | None:
    if attribute is None:
        return None
    text = read_string(attribute, where, problems)
    if text is not None and not PLAIN_TEXT.fullmatch(text):
        problems.add(attribute.line, where, f'"{shown(text)}": 1-512 printable ASCII characters')
        return None
    return text


def _audiences(
    attribute: Attribute | None, where: str, problems: Problems
) -> tuple[str, ...] | None:
    """The audiences Consul requires a JWT to carry one of (none: any)."""
    if attribute is None:
        return ()
    value = attribute.value
    if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
        problems.add(attribute.line, where, 'must be a list of quoted strings, like ["consul"]')
        return None
    texts = [str(v) for v in value]
    bad = [t for t in texts if not PLAIN_TEXT.fullmatch(t)]
    if bad:
        problems.add(attribute.line, where, f'"{shown(bad[0])}": 1-512 printable ASCII characters')
        return None
    return tuple(sorted(set(texts)))


def _ttl(found: dict[str, Attribute], where: str, line: int, problems: Problems) -> Duration | None:
    text = _required_string(found, "max_token_ttl", where, line, problems)
    if text is None:
        return None
    label, at = f"{where}.max_token_ttl", found["max_token_ttl"].line
    try:
        ttl = parse_duration(text)
    except DurationSyntaxError as exc:
        problems.add(at, label, str(exc))
        return None
    if not MIN_TOKEN_TTL <= ttl.seconds <= MAX_TOKEN_TTL:
        problems.add(at, label, f"{text} must be 1m..24h (Consul's token TTL bounds)")
        return None
    return ttl


def _claim_mappings(
    block: Block | None, where: str, line: int, problems: Problems
) -> tuple[tuple[str, str], ...] | None:
    """`claim_mappings { name = "claim" }`: the names selectors may use, and their claims."""
    if block is None:
        problems.add(line, where, 'a claim_mappings { NAME = "CLAIM" } block is required')
        return None
    inner = f"{where}.claim_mappings"
    found, _ = _fields(block, inner, None, (), problems)
    pairs: list[tuple[str, str]] = []
    claims: dict[str, int] = {}
    for key, attribute in found.items():
        label = f"{inner}.{key}"
        if not CLAIM_NAME.fullmatch(key):
            problems.add(attribute.line, label, f"invalid name: {CLAIM_NAME_RULE}")
            continue
        claim = read_string(attribute, label, problems)
        if claim is None:
            continue
        if not CLAIM_POINTER.fullmatch(claim):
            problems.add(
                attribute.line,
                label,
                f'"{shown(claim)}" is not a claim name or a JSON pointer like "/a/b"',
            )
            continue
        if claim in claims:
            problems.add(
                attribute.line, label, f'claim "{claim}" is mapped already on line {claims[claim]}'
            )
            continue
        claims[claim] = attribute.line
        pairs.append((key, claim))
    if not found:
        problems.add(block.line, inner, "maps no claim; name at least one")
        return None
    return tuple(sorted(pairs)) if len(pairs) == len(found) else None


def read_identity(
    block: Block | None,
    where: str,
    methods: dict[str, AuthMethod],
    declared: set[str],
    problems: Problems,
) -> Identity | None:
    """A worker's `identity { auth_method = "NAME" claims { ... } }`, if it has one.

    `declared`: every auth_method name the spec declares (valid or not), so an invalid method
    is reported once, on its own block, not again on each worker naming it."""
    if block is None:
        return None
    inner = f"{where}.identity"
    if block.labels:
        problems.add(block.line, inner, "takes no label: identity { ... }")
    found, nested = _fields(block, inner, IDENTITY_KEYS, IDENTITY_BLOCKS, problems)
    method_name = _required_string(found, "auth_method", inner, block.line, problems)
    method = methods.get(method_name) if method_name is not None else None
    if method_name is not None and method_name not in declared:
        problems.add(
            found["auth_method"].line,
            f"{inner}.auth_method",
            f'"{shown(method_name)}" is not a declared auth_method',
        )
    claims = _claims(nested.get("claims"), inner, block.line, method, problems)
    if method is None or claims is None:
        return None
    return Identity(method.name, claims, block.line)


def _claims(
    block: Block | None, where: str, line: int, method: AuthMethod | None, problems: Problems
) -> tuple[tuple[str, str], ...] | None:
    if block is None:
        problems.add(line, where, 'a claims { NAME = "VALUE" } block is required')
        return None
    inner = f"{where}.claims"
    found, _ = _fields(block, inner, None, (), problems)
    if not found:
        problems.add(block.line, inner, "names no claim; a selector needs at least one")
        return None
    mapped = {name for name, _ in method.claim_mappings} if method else None
    pairs: list[tuple[str, str]] = []
    for key, attribute in found.items():
        label = f"{inner}.{key}"
        if mapped is not None and key not in mapped:
            hint = difflib.get_close_matches(key, sorted(mapped), n=1)
            known = f" (did you mean {hint[0]}?)" if hint else ""
            problems.add(
                attribute.line,
                label,
                f'not in auth_method "{method.name if method else ""}"\'s claim_mappings{known}; '
                f"expected one of: {', '.join(sorted(mapped))}",
            )
            continue
        value = read_string(attribute, label, problems)
        if value is None:
            continue
        if not CLAIM_VALUE.fullmatch(value):
            problems.add(attribute.line, label, f'"{shown(value)}": {CLAIM_VALUE_RULE}')
            continue
        pairs.append((key, value))
    return tuple(sorted(pairs)) if len(pairs) == len(found) else None


def _fields(
    block: Block,
    where: str,
    allowed: tuple[str, ...] | None,
    nested_allowed: tuple[str, ...],
    problems: Problems,
) -> tuple[dict[str, Attribute], dict[str, Block]]:
    """The block's attributes and nested blocks by name; unknown (unless `allowed` is None:
    any name) and duplicate ones reported."""
    found: dict[str, Attribute] = {}
    for attribute in block.body.attributes:
        label = f"{where}.{attribute.name}"
        if allowed is not None and attribute.name not in allowed:
            problems.add(attribute.line, label, _unknown("attribute", attribute.name, allowed))
        elif attribute.name in found:
            first = found[attribute.name].line
            problems.add(attribute.line, label, f"set twice; the first is on line {first}")
        else:
            found[attribute.name] = attribute
    nested: dict[str, Block] = {}
    for inner in block.body.blocks:
        label = f"{where}.{inner.type}"
        if inner.type not in nested_allowed:
            problems.add(inner.line, label, f"unexpected block inside {where}")
        elif inner.labels:
            problems.add(inner.line, label, f"takes no label: {inner.type} {{ ... }}")
        elif inner.type in nested:
            first = nested[inner.type].line
            problems.add(inner.line, label, f"duplicate block; the first is on line {first}")
        else:
            nested[inner.type] = inner
    return found, nested


def _unknown(kind: str, name: str, allowed: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(allowed), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"unknown {kind}{hint}; expected one of: {', '.join(allowed)}"
