"""Containment without root: a runner that is not root gets a PID namespace of its own through an
unprivileged user namespace, keeps its uid, and nothing of the job survives its end. The worker's
secret files are covered in the job's mount namespace, and the job, though it runs as the same
user, has no capability left to uncover them (issue 25, item 4).

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
secret = os.path.join(sys.argv[1], "secret.token")  # the runner's, as its token file is
job = "id -u; umount " + secret + " 2>/dev/null; wc -c < " + secret
job += "; setsid sleep {MARK} & exit 0"
child = Child(["sh", "-c", job], dict(os.environ), forks, [secret])
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
    secret = shared_tmp / "secret.token"
    secret.write_text("00000000-0000-0000-0000-00000000beef\n")
    os.chmod(shared_tmp, 0o755)
    subprocess.run(["chmod", "-R", "a+rX", str(shared_tmp)], check=True)
    os.chown(secret, NOBODY, NOBODY)
    secret.chmod(0o600)  # as a token file is: the runner's user alone reads it
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
    uid, seen, report = done.stdout.splitlines()
    assert uid == str(NOBODY)  # the job keeps the runner's uid inside its user namespace
    assert seen.strip() == "0", done.stdout  # the secret reads as empty, even after an umount
    assert "cannot hide" not in done.stderr, done.stderr
    assert secret.stat().st_size > 0  # outside the job it is whole
    assert '"containment": "pid-namespace"' in report and '"warning": null' in report
    assert '"status": 0' in report
    assert pids_with(MARK) == []  # the setsid'd sleep died with the namespace
