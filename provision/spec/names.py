"""Name rules and the names lockctl derives from them (policies, tokens), shared by all layers.

Consul policy names allow only letters, digits, `-` and `_`; job and worker names become part of
policy names, so they are held to a stricter lowercase pattern and are never escaped.
"""

from __future__ import annotations

import re

NAME_PATTERN = re.compile(r"^[a-z0-9]([a-z0-9_-]{0,62}[a-z0-9])?$")
NAME_RULE = (
    "1-64 characters: lowercase letters, digits, '-' and '_', starting and ending with a letter "
    "or digit"
)
LOCK_POLICY_PREFIX = "lock-"
SESSION_POLICY_PREFIX = "session-"
MANAGED_MARKER = "lockctl-managed"  # in the description of every object lockctl manages
TOKEN_DESCRIPTION_PREFIX = "lockctl worker "  # noqa: S105 - a label, not a secret
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


def token_description(worker: str) -> str:
    """The description marking the token lockctl manages for `worker`."""
    return f"{TOKEN_DESCRIPTION_PREFIX}{worker}"


def lock_key(prefix: str) -> str:
    """The key a job's lock lives at: `<prefix>.lock`."""
    return f"{prefix}{LOCK_KEY_SUFFIX}"


ROLE_PREFIX = "worker-"


def role_name(worker: str) -> str:
    """The ACL role a login as worker `worker` gets: `worker-<worker>`."""
    return f"{ROLE_PREFIX}{worker}"
