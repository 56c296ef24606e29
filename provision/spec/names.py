"""Name rules and the names lockctl derives from them (policies, tokens), shared by all layers.

Consul policy names allow only letters, digits, `-` and `_`; job and worker names become part of
policy names, so they are held to a stricter lowercase pattern and are never escaped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NAME_PATTERN = re.compile(r"^[a-z0-9]([a-z0-9_-]{0,62}[a-z0-9])?$")
NAME_RULE = (
    "1-64 characters: lowercase letters, digits, '-' and '_', starting and ending with a letter "
    "or digit"
)
LOCK_POLICY_PREFIX = "lock-"
SESSION_POLICY_PREFIX = "session-"
MANAGED_MARKER = "lockctl-managed"  # in the description of every object lockctl manages
TOKEN_DESCRIPTION_PREFIX = "lockctl worker "  # noqa: S105 - a label, not a secret
# The owner of a spec that names none, and of every object an earlier lockctl wrote (their
# markers carry no owner): its descriptions are written as before, so an upgrade changes nothing.
DEFAULT_OWNER = "default"
LOCK_KEY_SUFFIX = ".lock"


def is_valid_name(name: str) -> bool:
    """Whether `name` may be a job or worker name (and so part of a policy name)."""
    return NAME_PATTERN.fullmatch(name) is not None


def lock_policy_name(job: str) -> str:
    """The policy granting job `job` its lock prefix: `lock-<job>`."""
    return f"{LOCK_POLICY_PREFIX}{job}"


def session_policy_name(worker: str) -> str:
    """The policy letting worker `worker` make sessions on its own node: `session-<worker>`."""
    return f"{SESSION_POLICY_PREFIX}{worker}"


def token_description(worker: str, owner: str = DEFAULT_OWNER) -> str:
    """The description marking the token lockctl manages for `worker` of `owner`'s spec:
    `lockctl worker w` (the default owner), `lockctl (owner payments) worker w`.

    Another owner's does not start with `lockctl worker `, so an earlier lockctl, which knows
    no owners, never takes it for one of its own (its --prune would delete it)."""
    if owner == DEFAULT_OWNER:
        return f"{TOKEN_DESCRIPTION_PREFIX}{worker}"
    return f"lockctl (owner {owner}) worker {worker}"


def managed_description(source: str, owner: str = DEFAULT_OWNER) -> str:
    """The description marking a policy, auth method, role or binding rule as `owner`'s:
    `lockctl-managed: job "x"` (the default owner), `lockctl-managed (owner payments): job "x"`.

    Another owner's does not start with `lockctl-managed: `, so an earlier lockctl never takes
    it for one of its own."""
    if owner == DEFAULT_OWNER:
        return f"{MANAGED_MARKER}: {source}"
    return f"{MANAGED_MARKER} (owner {owner}): {source}"


@dataclass(frozen=True)
class Marker:
    """What a live object's description says: whose it is, and what it was made from
    (`job "x"`, `worker "w"`, `auth_method "k"`; a token's: its worker's name)."""

    owner: str
    source: str


# The owner text is taken as it is (not held to the name rule): a marker someone wrote by hand
# with an odd owner is still someone else's, never an object free to adopt.
_MANAGED = re.compile(rf"^{MANAGED_MARKER}(?: \(owner ([^()]+)\))?: (.*)$", re.DOTALL)
_TOKEN = re.compile(r"^lockctl (?:\(owner ([^()]+)\) )?worker (.+)$", re.DOTALL)


def parse_managed(description: str) -> Marker | None:
    """The marker of a policy's, auth method's, role's or binding rule's description; None for
    an object lockctl does not manage. No owner (an earlier lockctl's) is the default owner."""
    match = _MANAGED.match(description)
    if match is None:
        return None
    return Marker(match.group(1) or DEFAULT_OWNER, match.group(2))


def parse_token_description(description: str) -> Marker | None:
    """The owner and worker of a worker token's description; None for any other token."""
    match = _TOKEN.match(description)
    if match is None:
        return None
    return Marker(match.group(1) or DEFAULT_OWNER, match.group(2))


def lock_key(prefix: str) -> str:
    """The key a job's lock lives at: `<prefix>.lock`."""
    return f"{prefix}{LOCK_KEY_SUFFIX}"


ROLE_PREFIX = "worker-"


def role_name(worker: str) -> str:
    """The ACL role a login as worker `worker` gets: `worker-<worker>`."""
    return f"{ROLE_PREFIX}{worker}"
