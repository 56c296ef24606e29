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
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

# contract (the start of its name) -> (the module that gets the import, what it imports)
PLANTS = {
    # sideways: two siblings of one tier
    "layers:": ("provision/scheduler/timer.py", "provision.verify"),
    "http:": ("provision/ledger/history.py", "requests"),
    "consul:": ("provision/consul/keys.py", "provision.workers.config"),
    "pure:": ("provision/schedule.py", "subprocess"),
    "fencing:": ("provision/runner/fencing.py", "provision.runner.lock"),
    "runner:": ("provision/workers/config.py", "provision.acl.render"),
    "skip:": ("provision/runner/precheck.py", "provision.runner.engine"),
    "bench:": ("bench/scale.py", "tests.unit"),
}


def _planted_copy(tmp: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for tree in ("provision", "bench", "tests"):
        shutil.copytree(ROOT / tree, tmp / tree, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", tmp / "pyproject.toml")
    for module, target in PLANTS.values():
        path = tmp / module
        path.write_text(path.read_text() + f"\nimport {target}  # planted\n")
    return tmp


def test_every_contract_breaks_on_its_planted_import(tmp_path: Path) -> None:
    tree = _planted_copy(tmp_path)
    done = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    report = done.stdout
    assert done.returncode == 1, report + done.stderr
    summary = report[report.index("Contracts\n") : report.index("Broken contracts")]
    sections = report[report.index("Broken contracts") :]
    for contract, (module, target) in PLANTS.items():
        line = next(row for row in summary.splitlines() if row.startswith(contract))
        assert "BROKEN" in summary[summary.index(line) :].split("\n\n")[0], (contract, summary)
        importer = module.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        assert f"{importer} -> {target}" in sections, (contract, sections)
