"""The import contracts (pyproject.toml [tool.importlinter]) catch what they say they catch: a
copy of the tree with one planted import per contract, and lint-imports must call every
contract broken, each naming its own planted import. Without this a contract can silently check
nothing (a `:` between layers made them siblings that may import each other; a forbidden module
outside the graph is never seen)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# lint-imports on the copy only: the editable install puts a checkout on sys.path too (this one,
# or another worktree's), and `tests` and `bench` are namespace packages, whose portions in both
# trees would merge (grimp then reads either one's modules, the planted or the real): every
# checkout on it (a pyproject.toml beside a `provision` folder) but the copy is left out
LINT_COPY = (
    "import os, sys; root = sys.argv.pop(1); here = os.getcwd(); "
    "checkout = lambda p: all(os.path.exists(os.path.join(p, f)) for f in ('provision', "
    "'pyproject.toml')); "
    "sys.path[:] = [p for p in sys.path if p.rstrip('/') != root and "
    "(p in ('', here) or not checkout(p))]; "
    "from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
)

# contract (the start of its name) -> (the module that gets the import, what it imports)
PLANTS = {
    # sideways: two siblings of one tier
    "layers:": ("provision/scheduler/triggers.py", "provision.verify"),
    "http:": ("provision/ledger/history.py", "requests"),
    "consul:": ("provision/consul/keys.py", "provision.workers.config"),
    "pure:": ("provision/schedule.py", "subprocess"),
    "fencing:": ("provision/fencing.py", "provision.runner.plain"),
    "notify:": ("provision/notify/message.py", "provision.consul"),
    "runner:": ("provision/workers/config.py", "provision.acl.render"),
    "skip:": ("provision/runner/precheck.py", "provision.runner.plain"),
    "cli tiers:": ("provision/cli/app.py", "provision.cli.entry"),
    "fast path:": ("provision/cli/runjob.py", "typer"),
    "bench:": ("bench/scale.py", "tests.unit.test_bench_scale"),
}


def _planted_copy(tmp: Path, module: str, target: str) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for tree in ("provision", "bench", "tests"):
        shutil.copytree(ROOT / tree, tmp / tree, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", tmp / "pyproject.toml")
    path = tmp / module
    path.write_text(path.read_text() + f"\nimport {target}  # planted\n")
    return tmp


def test_every_contract_breaks_on_its_own_planted_import(tmp_path: Path) -> None:
    # one copy per plant, linted at once: each contract is shown to break on its own import
    # (with all of them in one tree, grimp's chains through the others can hide one)
    runs = {}
    for n, (contract, (module, target)) in enumerate(PLANTS.items()):
        tree = _planted_copy(tmp_path / str(n), module, target)
        runs[contract] = subprocess.Popen(
            [sys.executable, "-c", LINT_COPY, str(ROOT), "--no-cache"],
            cwd=tree,
            env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    for contract, run in runs.items():
        report, _ = run.communicate(timeout=120)
        module, target = PLANTS[contract]
        assert run.returncode == 1, report
        summary = report[report.index("Contracts\n") : report.index("Broken contracts")]
        assert _verdict(summary, contract) == "BROKEN", (contract, summary)
        importer = module.removesuffix(".py").replace("/", ".")
        assert f"{importer} -> {target}" in report, (contract, report)


def _verdict(summary: str, contract: str) -> str:
    """KEPT or BROKEN: the first word of either after the contract's name (a long name wraps)."""
    words = " ".join(summary.split())
    rest = words[words.index(contract) :]
    found = {word: rest.find(word) for word in ("KEPT", "BROKEN") if word in rest}
    return min(found, key=found.__getitem__)
