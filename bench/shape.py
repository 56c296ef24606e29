"""provision/'s size now against a base commit, net of the new capabilities added since.

The tick-core issue's measured shape: provision/ ends at least 1,000 lines smaller than at the
base (8407647, before the tick core), not counting the in-memory store, the simulator, and the
capabilities other issues added since. This prints each figure it sums, so the net can be checked
by hand.

What it counts: every line of every ``*.py`` file under provision/ (``wc -l`` style: blank lines,
comments and docstrings included), read from git (the working tree's committed HEAD is not
required: the "now" side reads the files on disk, the base side ``git show BASE:path``).

What it leaves out, and why (``EXCLUDED`` below, each with its reason):
- a file or folder named by a capability is left out whole, at its size now;
- a capability's commits also added lines to files shared with older code (the CLI command, the
  spec's parsing, the scheduler's wiring): each commit's net lines in provision/ outside the files
  already left out (``git show --numstat``), summed. A later commit that shrinks such a line is
  counted in the "now" figure, not taken back from the capability: the net errs toward
  crediting the capability, which the printed list lets a reader judge.

Also printed: the count of functions in provision/ over 7 parameters (every named parameter but
``self`` and ``cls``; ``*args`` and ``**kwargs`` not counted), as ruff's PLR0913 counts them,
which it already refuses, so it should print 0.

Usage: python bench/shape.py [--base COMMIT]
"""

from __future__ import annotations

import argparse
import ast
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "provision"
DEFAULT_BASE = "8407647"
# The target: this many lines fewer than the base, net of what is excluded.
TARGET_SHRINK = 1000
MAX_PARAMETERS = 7


@dataclass(frozen=True)
class Excluded:
    """A capability left out of the count: its own files whole, its commits' other lines."""

    name: str
    why: str
    paths: tuple[str, ...] = ()
    commits: tuple[str, ...] = ()


EXCLUDED = (
    Excluded(
        "in-memory store",
        "the tick store's model for virtual-time tests and the simulator (the rule names it); "
        "the simulator itself is bench/simulate.py, outside provision/",
        paths=("provision/tick/memory.py",),
    ),
    Excluded(
        "embed and HTTP jobs' safety",
        "its own issue: an isolated body under a warden in a PID namespace, HTTP jobs' "
        "attempt and idempotency headers, run.check()'s judgment, nsinit's forwarded signal",
        paths=("provision/embed/warden.py",),
        commits=("441d703", "f1943eb", "80f35c2"),
    ),
    Excluded(
        "notifications",
        "notify blocks and ping URL files: a new capability (docs/notifications.md)",
        paths=(
            "provision/notify",
            "provision/runner/notified.py",
            "provision/spec/notify_block.py",
            "provision/system/notify_rules.py",
        ),
        commits=(
            "3d1f90c",
            "884144d",
            "cbc86f6",
            "27f6996",
            "7aaab7a",
            "bbe9528",
            "4c759d7",
            "9c2e399",  # embed's decorated calls and locker.tick() tell theirs too
            "9e7a75c",  # repeat suppression and repeat_after
        ),
    ),
    Excluded(
        "spec owners",
        "a spec's owner marks its Consul objects (two teams on one cluster): a new capability",
        paths=("provision/acl/owners.py",),
        commits=("9bcceca", "7e48620", "c7f5378", "5387955", "f6787bb"),
    ),
    Excluded(
        "lockctl break",
        "an operator breaks a gone replica's lock, and verify's token-break checks: a new command",
        paths=("provision/ledger/breaking.py",),
        commits=(
            "e5f4464",
            "7d75204",
            "78d6244",
            "cbeadf1",
            "c5ff524",
            "2d7ab95",
            "3bc5f64",
            "1e654e0",
        ),
    ),
    Excluded(
        "datacenters",
        "a local federation of datacenters, a worker's datacenter and a job's scope: the first "
        "slice of a new capability (docs/datacenters.md)",
        paths=("provision/cluster/federation.py", "provision/spec/datacenters.py"),
        commits=("9b6e510", "6ff4668", "05f5e48", "e289285"),
    ),
    Excluded(
        "lockctl backfill",
        "an operator runs a past range's ticks once each: a new command (docs/schedules.md)",
        paths=(
            "provision/cli/backfill.py",
            "provision/ledger/backfill.py",
            "provision/ledger/backfilling.py",
        ),
        commits=("6d03123", "f5b4427", "d7a2766", "bd6cc91"),
    ),
)


def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout


def lines_now(path: str) -> int:
    """Lines of a file, or of every .py file under a folder, on disk now (0 if it is gone)."""
    target = ROOT / path
    files = sorted(target.rglob("*.py")) if target.is_dir() else [target]
    return sum(len(f.read_text().splitlines()) for f in files if f.is_file())


def lines_at(commit: str, folder: str) -> int:
    names = git("ls-tree", "-r", "--name-only", commit, folder).split()
    return sum(
        len(git("show", f"{commit}:{name}").splitlines()) for name in names if name.endswith(".py")
    )


def under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root + "/") for root in roots)


def commit_lines(commit: str, left_out: tuple[str, ...]) -> int:
    """A commit's net lines (added less deleted) in provision/'s .py files not left out whole."""
    net = 0
    for row in git("show", "--numstat", "--format=", commit, "--", PACKAGE).splitlines():
        added, deleted, path = row.split("\t")
        if path.endswith(".py") and not under(path, left_out) and added != "-":
            net += int(added) - int(deleted)
    return net


def wide_functions() -> list[str]:
    """Functions in provision/ with more than MAX_PARAMETERS named parameters."""
    found = []
    for source in sorted((ROOT / PACKAGE).rglob("*.py")):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                named = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
                if len([x for x in named if x not in ("self", "cls")]) > MAX_PARAMETERS:
                    found.append(f"{source.relative_to(ROOT)}:{node.lineno} {node.name}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=DEFAULT_BASE, help="the commit to compare with")
    base = parser.parse_args().base
    left_out = tuple(p for e in EXCLUDED for p in e.paths)
    now, then = lines_now(PACKAGE), lines_at(base, PACKAGE)
    print("lines counted: every line of provision/**/*.py (wc -l style, blank lines included)")
    print(f"provision/ at {base}: {then:>7,}")
    print(f"provision/ now:{' ' * (len(base) - 3)} {now:>7,}   ({now - then:+,})")
    excluded_total = 0
    for e in EXCLUDED:
        own = {p: lines_now(p) for p in e.paths}
        wiring = {c: commit_lines(c, left_out) for c in e.commits}
        total = sum(own.values()) + sum(wiring.values())
        excluded_total += total
        print(f"\nexcluded: {e.name}: {total:,} lines ({e.why})")
        for path, n in own.items():
            print(f"  {n:>6,}  {path}")
        for commit, n in wiring.items():
            print(f"  {n:>+6,}  commit {commit}'s lines outside those files")
    net = now - excluded_total - then
    print(f"\nexcluded in all: {excluded_total:,}")
    print(f"net: now {now:,} - excluded {excluded_total:,} - base {then:,} = {net:+,} lines")
    print(f"target: {-TARGET_SHRINK:+,} or fewer; {'met' if net <= -TARGET_SHRINK else 'not met'}")
    print(f"  still to remove for the target: {max(0, net + TARGET_SHRINK):,} lines")
    wide = wide_functions()
    print(f"\nfunctions over {MAX_PARAMETERS} parameters (self and cls not counted): {len(wide)}")
    for name in wide:
        print(f"  {name}")


if __name__ == "__main__":
    main()
