"""The wheel as a worker gets it: built from this checkout as `make dist` builds it, installed
with pipx into an empty environment that sees only a wheelhouse (the wheel and its
dependencies' wheels, no index), then `lockctl --version`, `lockctl render` on the example spec
and a `lockctl run` against the live cluster, all from the installed copy.

The wheelhouse is built once per test session: the only step that reaches the package registry,
so the rest does not depend on its speed. Every step is bounded by a timeout; none is timed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from workers_lab import minted_workers, spec_text

from provision import __version__

if TYPE_CHECKING:
    from conftest import LiveCluster

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT = 900  # the wheelhouse: a build, then every dependency's wheel from the registry
INSTALL_TIMEOUT = 600
COMMAND_TIMEOUT = 120


def _run(
    argv: list[str], timeout: float, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd, check=False
    )
    assert done.returncode == 0, f"{argv[:3]}... exit {done.returncode}:\n{done.stderr[-3000:]}"
    return done


@dataclass(frozen=True)
class Wheelhouse:
    folder: Path
    wheel: Path
    sdist: Path


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Wheelhouse:
    """`python -m build` (the sdist, then the wheel from it, as `make dist`), then `pip wheel`
    for the wheel's dependencies and for pipx, into one folder."""
    folder = tmp_path_factory.mktemp("wheelhouse")
    _run([sys.executable, "-m", "build", "--outdir", str(folder), str(ROOT)], BUILD_TIMEOUT)
    (wheel,) = folder.glob("lockctl-*.whl")
    (sdist,) = folder.glob("lockctl-*.tar.gz")
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check"]
    _run([*pip_wheel, "--wheel-dir", str(folder), str(wheel), "pipx", "pip"], BUILD_TIMEOUT)
    return Wheelhouse(folder, wheel, sdist)


@dataclass(frozen=True)
class Installed:
    lockctl: Path
    venv: Path
    env: dict[str, str]  # a user's environment: the installed lockctl first on PATH


def _offline_pip(wheelhouse: Path) -> dict[str, str]:
    """pip sees the wheelhouse only: no index, and none of this machine's pip configuration."""
    return {
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheelhouse),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }


@pytest.fixture(scope="module")
def installed(wheelhouse: Wheelhouse, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """pipx in a venv of its own, then `pipx install` of the wheel, each from the wheelhouse."""
    home = tmp_path_factory.mktemp("pipx")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    base |= _offline_pip(wheelhouse.folder) | {"USE_EMOJI": "0"}
    tool = home / "pipx-venv"
    _run([sys.executable, "-m", "venv", str(tool)], INSTALL_TIMEOUT, env=base)
    _run([str(tool / "bin" / "pip"), "install", "--quiet", "pipx"], INSTALL_TIMEOUT, env=base)
    pipx_env = base | {
        "PIPX_HOME": str(home / "home"),
        "PIPX_BIN_DIR": str(home / "bin"),
        "PIPX_MAN_DIR": str(home / "man"),
    }
    pip_args = f"--pip-args=--no-index --find-links {wheelhouse.folder}"
    command = [str(tool / "bin" / "pipx"), "install", pip_args, str(wheelhouse.wheel)]
    _run(command, INSTALL_TIMEOUT, env=pipx_env)
    user_env = base | {"PATH": f"{home / 'bin'}:/usr/local/bin:/usr/bin:/bin"}
    return Installed(home / "bin" / "lockctl", home / "home" / "venvs" / "lockctl", user_env)


def test_the_wheel_holds_the_package_and_templates_only(wheelhouse: Wheelhouse) -> None:
    names = zipfile.ZipFile(wheelhouse.wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"provision", f"lockctl-{__version__}.dist-info"}
    assert "provision/_templates/worker/lockctl-scheduler.service.j2" in names
    assert not [name for name in names if "__pycache__" in name]


def test_version_from_the_installed_wheel(installed: Installed, tmp_path: Path) -> None:
    done = _run([str(installed.lockctl), "--version"], COMMAND_TIMEOUT, installed.env, tmp_path)
    assert done.stdout == f"lockctl {__version__}\n"
    where = _run(
        [
            str(installed.venv / "bin" / "python"),
            "-c",
            "import provision; print(provision.__file__)",
        ],
        COMMAND_TIMEOUT,
        installed.env,
        tmp_path,
    )
    assert Path(where.stdout.strip()).is_relative_to(installed.venv)  # not the checkout
    script = _run([str(installed.lockctl), "completion", "bash"], COMMAND_TIMEOUT, installed.env)
    assert "complete -F _lockctl lockctl" in script.stdout and "'run --config'" in script.stdout


def test_render_the_example_spec_with_the_packaged_templates(
    installed: Installed, tmp_path: Path
) -> None:
    out = tmp_path / "policies"
    spec = ROOT / "policies" / "locks.hcl"
    argv = [str(installed.lockctl), "render", "--spec", str(spec), "--out", str(out)]
    _run(argv, COMMAND_TIMEOUT, installed.env, tmp_path)  # cwd: no checkout's templates/ here
    rendered = sorted(path.name for path in out.iterdir())
    assert "manifest.json" in rendered and len(rendered) > 1
    for name in rendered:
        assert (out / name).read_text() == (ROOT / "policies" / name).read_text(), name


def test_run_against_the_live_cluster(
    installed: Installed, live_cluster: LiveCluster, tmp_path: Path
) -> None:
    uid = uuid.uuid4().hex[:8]
    prefix = f"test/wheel-{uid}/"
    job = f"wheel-{uid}"
    spec = tmp_path / "locks.hcl"
    workers = ("worker-1", "worker-2")
    spec.write_text(spec_text(live_cluster, workers, {job: {"prefix": json.dumps(prefix)}}))
    with minted_workers(live_cluster, spec, workers, tmp_path, uid, prefix.rstrip("/")) as made:
        argv = [str(installed.lockctl), "run", "--config", str(made.configs["worker-1"])]
        argv += ["--job", job, "--", "sh", "-c", 'echo "ran on $LOCKCTL_WORKER, $LOCK_INDEX"']
        done = _run(argv, COMMAND_TIMEOUT, installed.env, tmp_path)
    assert done.stdout.startswith("ran on worker-1, ")
    events = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert [e["event"] for e in events] == ["acquired", "released"], done.stderr
    assert events[1]["child_status"] == 0 and events[1]["released"] is True
