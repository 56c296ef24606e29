"""The policy templates are found from a checkout, an editable install and an installed wheel."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Renders the example spec with whatever templates lookup finds, and says where they were.
PROBE = """
import sys
from pathlib import Path
import provision
from provision.acl.render import check_rendered, render_policies
from provision.spec import load_spec
from provision.system.templates import find_templates_dir
found = find_templates_dir()
result = render_policies(load_spec(Path(sys.argv[1]) / "locks.hcl"), found)
print(Path(provision.__file__).parent)
print(found)
print(repr(check_rendered(result, Path(sys.argv[1]))))
"""


def _probe(cwd: Path, pythonpath: Path | None) -> list[str]:
    env = {"PATH": "/usr/bin:/bin"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(ROOT / "policies")],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.splitlines()


def test_editable_install_uses_the_checkouts_templates(tmp_path: Path) -> None:
    package, templates, diff = _probe(tmp_path, None)
    assert Path(package) == ROOT / "provision"
    assert Path(templates) == ROOT / "templates"
    assert diff == "''"


def test_a_plain_checkout_elsewhere_uses_its_own_templates(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "provision", tmp_path / "provision")
    shutil.copytree(ROOT / "templates", tmp_path / "templates")
    package, templates, diff = _probe(tmp_path, tmp_path)
    assert Path(package) == tmp_path / "provision"
    assert Path(templates) == tmp_path / "templates"
    assert diff == "''"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from this checkout (pip fetches hatchling into its isolated build env)."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("lockctl-*.whl")
    return built


def test_the_wheel_ships_the_policy_templates(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "provision/_templates/policies/lock.hcl.j2" in names
    assert "provision/_templates/policies/session.hcl.j2" in names


def test_an_installed_wheel_renders_from_its_packaged_templates(
    wheel: Path, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    package, templates, diff = _probe(tmp_path, site)
    assert Path(package) == site / "provision"
    assert Path(templates) == site / "provision" / "_templates"
    assert diff == "''"
