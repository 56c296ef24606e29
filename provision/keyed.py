"""Keyed jobs: one lock and one ledger per key, the key chosen by the caller at run time (a
tenant, a target server), all under the job's prefix, so the job's policy covers them.

    <prefix>.lock                 the job's own lock (a run without a key)
    <prefix>ticks/                its ledger
    <prefix>keys/<key>/.lock      key <key>'s lock
    <prefix>keys/<key>/ticks/     key <key>'s ledger

A key is a KV path segment: held to KEY_PATTERN and refused otherwise, never escaped (no `/`, no
`..`, nothing a terminal or a shell reads as more than text). Loaded by `lockctl run`: no spec
parser here.
"""

from __future__ import annotations

import re
from collections import Counter

KEY_PATTERN = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,126}[A-Za-z0-9])?$")
KEY_RULE = (
    "1-128 characters: letters, digits, '.', '-' and '_', starting and ending with a letter "
    "or digit, no '..'"
)
KEYS_DIR = "keys/"
LOCK_SUFFIX = ".lock"
MAX_KEYS = 1000  # a job's keys a spec lists (`lockctl schedule` runs each as a job of its own)


def key_problem(key: object) -> str | None:
    """Why `key` cannot be a keyed job's key, or None."""
    if not isinstance(key, str):
        return "must be a string"
    if KEY_PATTERN.fullmatch(key) is None or ".." in key:
        return f"must be {KEY_RULE}"
    return None


def keys_folder(job_lock_key: str) -> str:
    """The folder of a job's keys: `<prefix>keys/` for the job whose lock is `<prefix>.lock`."""
    return f"{job_lock_key.removesuffix(LOCK_SUFFIX)}{KEYS_DIR}"


def keyed_lock_key(job_lock_key: str, key: str) -> str:
    """The lock of `key` of the job whose lock is `job_lock_key`: `<prefix>keys/<key>/.lock`,
    its ledger beside it. `key` must have passed key_problem."""
    if key_problem(key) is not None:
        raise ValueError(f"not a key: {key!r}")
    return f"{keys_folder(job_lock_key)}{key}/{LOCK_SUFFIX}"


def keys_in(names: list[str], folder: str) -> list[str]:
    """The keys a listing of `folder` (`<prefix>keys/`, names cut at the next `/`) shows,
    sorted: what is not a key's folder, or names no key (written by hand), left out."""
    found = set()
    for name in names:
        if not name.startswith(folder) or not name.endswith("/"):
            continue
        key = name[len(folder) : -1]
        if key_problem(key) is None:
            found.add(key)
    return sorted(found)


def keys_problem(value: object) -> str | None:
    """Why `value` cannot be the keys a spec lists for a job (1..MAX_KEYS keys, each taken by
    key_problem, none twice), or None."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(k, str) for k in value):
        return 'must be a list of quoted keys, like ["tenant-1", "tenant-2"]'
    if not value or len(value) > MAX_KEYS:
        return f"must list 1 to {MAX_KEYS} keys"
    bad = next((k for k in value if key_problem(k) is not None), None)
    if bad is not None:
        shown = bad if len(bad) <= 40 and bad.isprintable() else "one"
        return f"{shown!r} {key_problem(bad)}"
    twice = sorted(k for k, count in Counter(value).items() if count > 1)
    if twice:
        return f"lists {', '.join(twice[:5])} more than once"
    return None


def split_unit(unit: str) -> tuple[str, str | None]:
    """A unit's job and key: `report/tenant-1` -> ("report", "tenant-1"); `report` ->
    ("report", None) (a job's name has no `/`)."""
    name, _, key = unit.partition("/")
    return name, key or None
