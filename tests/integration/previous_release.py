"""The previous release of lockctl, for the upgrade tests: its wheel, kept in tests/data (built
once from the release's commit, below), installed with pip into a venv of its own. That venv
finds its dependencies in this venv's site-packages (a .pth file) rather than downloading them:
the releases share their dependency pins, and nothing here reaches the network. The wheel is
kept rather than built here so the test needs neither the repository's history (a shallow
clone has none) nor a build backend.

The previous release's `provision` package sits in its venv's own site-packages, which comes
before the .pth's folder on sys.path, so it never sees this checkout's code; its processes also
run without this process's PYTHON* variables (a PYTHONPATH naming the checkout would win)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.lockctl_process import LOCKCTL

# The release a fleet upgrades from: the commit it was cut from, and its wheel, made with
#   git archive PREVIOUS_RELEASE | tar -x -C src
#   pip wheel --no-deps --no-build-isolation --wheel-dir tests/data/previous-release src
# (sha256 9b4ea46a8b1e14e3ef42d9a635a40e06eee799a2ea78a06b346bba8f2ee87610). A new release
# moves both on.
PREVIOUS_RELEASE = "8407647ed413ea2ed1a7f54468849b8ae04e10c3"
PREVIOUS_WHEEL = (
    Path(__file__).resolve().parents[1] / "data/previous-release/lockctl-0.1.0-py3-none-any.whl"
)
STEP_TIMEOUT = 300  # seconds: each of the venv's making and the wheel's install
# pip sees nothing but what it is given: no index, no configuration of this machine's
OFFLINE_PIP = {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1"}
OFFLINE_PIP |= {"PIP_DISABLE_PIP_VERSION_CHECK": "1"}


@dataclass(frozen=True)
class Release:
    """One lockctl to run: its name in the tests, its program, and whether its processes must
    not see this interpreter's PYTHON* variables (another install's must not)."""

    name: str
    program: tuple[str, ...]
    isolated: bool = False

    def environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """This process's environment as it is now (the cluster's TLS variables included),
        less PYTHON* and VIRTUAL_ENV for an isolated release, plus `extra`."""
        env = dict(os.environ)
        if self.isolated:
            env = {k: v for k, v in env.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        return env | dict(extra or {})


CURRENT = Release("current", tuple(LOCKCTL))


def _run(
    argv: list[str],
    env: Mapping[str, str] | None = None,
    stdin: bytes | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[bytes]:
    done = subprocess.run(
        argv, input=stdin, capture_output=True, timeout=STEP_TIMEOUT, env=env, cwd=cwd, check=False
    )
    stderr = done.stderr.decode(errors="replace")[-3000:]
    assert done.returncode == 0, f"{argv[:4]}... exit {done.returncode}:\n{stderr}"
    return done


def install_previous_release(folder: Path) -> Release:
    """The previous release's wheel installed into a venv of its own under `folder`."""
    venv = folder / "venv"
    offline = {**os.environ, **OFFLINE_PIP}
    pip = [sys.executable, "-m", "pip"]
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    _lend_dependencies(venv / "bin" / "python")
    install = ["--python", str(venv / "bin" / "python"), "install", "--quiet", "--no-deps"]
    _run([*pip, *install, str(PREVIOUS_WHEEL)], env=offline)
    release = Release("previous", (str(venv / "bin" / "lockctl"),), isolated=True)
    _check_installed(release, venv)
    return release


def _lend_dependencies(python: Path) -> None:
    """A .pth in the new venv naming this venv's site-packages: the dependencies, as installed."""
    ask = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(_run([str(python), "-c", ask]).stdout.decode().strip())
    ours = dict.fromkeys(sysconfig.get_paths()[name] for name in ("purelib", "platlib"))
    (site / "_lockctl_dependencies.pth").write_text("".join(f"{path}\n" for path in ours))


def _check_installed(release: Release, venv: Path) -> None:
    """Its `provision` is the one in its venv, not this checkout's (asked from the venv's folder:
    `python -c` puts the current folder first on sys.path; its console script does not)."""
    ask = [str(venv / "bin" / "python"), "-c", "import provision; print(provision.__file__)"]
    where = _run(ask, release.environment(), cwd=venv)
    assert Path(where.stdout.decode().strip()).is_relative_to(venv), where.stdout
