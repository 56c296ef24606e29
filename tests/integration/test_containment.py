"""Containment without root: a runner that is not root gets a PID namespace of its own through an
unprivileged user namespace, keeps its uid, and nothing of the job survives its end.

Run as `nobody` (root only can switch to it: CI runs as root), with the system's Python and a
copy of the package that `nobody` can read.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from procscan import pids_with

import provision

NOBODY = 65534
MARK = f"300.{os.getpid()}"
SCRIPT = f"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
from provision.runner.child import Child
from provision.runner.forkserver import ForkServer
forks = None
if sys.argv[2] == "forkserver":  # as `lockctl schedule` makes them: forked by its helper
    forks = ForkServer()
    forks.start()
child = Child(["sh", "-c", "id -u; setsid sleep {MARK} & exit 0"], dict(os.environ), forks)
child.start({{"LOCK_INDEX": "1"}})
status = child.wait()
print(json.dumps({{"containment": child.containment, "warning": child.warning, "status": status}}))
"""


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder nobody can read (pytest's own tmp_path lies under a 0700 folder of root's)."""
    folder = Path(tempfile.mkdtemp(prefix="lockctl-nonroot-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become nobody")
@pytest.mark.parametrize("start", ["unshare", "forkserver"])
def test_a_runner_that_is_not_root_still_gets_a_pid_namespace(shared_tmp: Path, start: str) -> None:
    package = Path(provision.__file__).parent
    shutil.copytree(package, shared_tmp / "provision", ignore=shutil.ignore_patterns("__pycache__"))
    (shared_tmp / "probe.py").write_text(SCRIPT)
    os.chmod(shared_tmp, 0o755)
    subprocess.run(["chmod", "-R", "a+rX", str(shared_tmp)], check=True)
    python = shutil.which("python3", path="/usr/bin")
    assert python is not None, "the system's python3 (Debian's) is needed"
    become_nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    done = subprocess.run(
        [*become_nobody, python, "-I", str(shared_tmp / "probe.py"), str(shared_tmp), start],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": os.environ["PATH"], "HOME": str(shared_tmp)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    uid, report = done.stdout.splitlines()
    assert uid == str(NOBODY)  # the job keeps the runner's uid inside its user namespace
    assert '"containment": "pid-namespace"' in report and '"warning": null' in report
    assert '"status": 0' in report
    assert pids_with(MARK) == []  # the setsid'd sleep died with the namespace
