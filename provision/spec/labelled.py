"""A job's (or `defaults`') blocks of one type, each named by one quoted label and holding a
fixed set of attributes (`blackout "NAME" { ... }`, `notify "NAME" { ... }`): the names checked
and read once each, the attributes by name; each problem reported at its line.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from provision.spec.hcl import Attribute, Block
from provision.spec.names import NAME_RULE, is_valid_name
from provision.spec.problems import Problems, shown


@dataclass(frozen=True)
class Kind:
    """A type of labelled block: what its problems call it and the attributes it may set."""

    type: str  # the block's type, as written: "blackout"
    duplicate: str  # what a second block of a name is: "blackout window"
    usage: str  # said when the block has no one quoted name
    keys: tuple[str, ...]  # the attributes it may set
    unknown: str = ""  # added to an unknown attribute's problem


@dataclass(frozen=True)
class Named:
    """One block of a kind whose name is valid and its first: `here` names it in problems."""

    block: Block
    name: str
    here: str


def named_blocks(
    block: Block, where: str, kind: Kind, first: dict[str, int], problems: Problems
) -> Iterator[Named]:
    """The block's blocks of `kind` with a valid name not seen before; `first` holds the line
    of each name's first block (seeded with those a caller already has), valid or not."""
    for nested in (b for b in block.body.blocks if b.type == kind.type):
        label = nested.labels[0].text if len(nested.labels) == 1 else None
        if label is not None and label in first:
            message = f"duplicate {kind.duplicate}; the first is on line {first[label]}"
            problems.add(nested.line, f'{where}.{kind.type} "{shown(label)}"', message)
            continue
        if label is not None:
            first[label] = nested.line
        named = _named(nested, where, kind, problems)
        if named is not None:
            yield named


def _named(block: Block, where: str, kind: Kind, problems: Problems) -> Named | None:
    label = block.labels[0] if len(block.labels) == 1 else None
    if label is None or label.text is None or not label.quoted:
        problems.add(block.line, f"{where}.{kind.type}", kind.usage)
        return None
    here = f'{where}.{kind.type} "{shown(label.text)}"'
    if not is_valid_name(label.text):
        problems.add(block.line, here, f"invalid name: {NAME_RULE}")
        return None
    return Named(block, label.text, here)


def read_attributes(named: Named, kind: Kind, problems: Problems) -> dict[str, Attribute]:
    """The block's attributes by name, reporting unknown and duplicate ones and nested blocks."""
    found: dict[str, Attribute] = {}
    here = named.here
    for attribute in named.block.body.attributes:
        if attribute.name not in kind.keys:
            expected = ", ".join(kind.keys)
            message = f"unknown attribute; expected one of: {expected}{kind.unknown}"
            problems.add(attribute.line, f"{here}.{attribute.name}", message)
        elif attribute.name in found:
            first = found[attribute.name].line
            message = f"set twice; the first is on line {first}"
            problems.add(attribute.line, f"{here}.{attribute.name}", message)
        else:
            found[attribute.name] = attribute
    for nested in named.block.body.blocks:
        message = f"unexpected block inside a {kind.type} block"
        problems.add(nested.line, f"{here}.{nested.type}", message)
    return found
