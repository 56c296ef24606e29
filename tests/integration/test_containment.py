"""Containment without root: a runner that is not root gets a PID namespace of its own through an
unprivileged user namespace, keeps its uid, and nothing of the job survives its end. The worker's
secret files are covered in the job's mount namespace, and the job, though it runs as the same
user, has no capability left to uncover them (issue 25, item 4).

Run as `nobody` (root only can switch to it: CI runs as root), with the system's Python and a
copy of the package that `nobody` can read.

Where the machine refuses the namespace's /proc (a container: podman masks files of its own /proc,
and the kernel then refuses a user namespace a /proc of its own), the job runs in a process group:
the first job finds it out, says why in words (no line of unshare's or of the init's in the job's
output), and the later ones do not try again; a `lockctl schedule` there says it in one
`containment` event, not on every tick. A mount namespace with a file of /proc covered, as the
container's runtime covers /proc/kcore or /proc/timer_list, is such a machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from procscan import pids_with
from scheduler_lab import SchedulerProcess
from workers_lab import minted_workers, spec_text

import provision
from tests.lockctl_process import eventually

if TYPE_CHECKING:
    from conftest import LiveCluster

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


REFUSING_SCRIPT = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
from provision.runner.child import Child
from provision.runner.forkserver import ForkServer
forks = None
if sys.argv[2] == "forkserver":
    forks = ForkServer()
    forks.start()
for n in range(2):  # the first finds the refusal out, the second does not try again
    child = Child(["sh", "-c", f"echo job {n} ran"], dict(os.environ), forks)
    child.start({"LOCK_INDEX": "1"})
    status = child.wait()
    err = child.output_tails()[1]
    print(json.dumps({"containment": child.containment, "warning": child.warning,
                      "status": status, "stderr": err}), flush=True)
    child.close()
"""
NOBODY_ARGV = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
# A mount namespace in which a file of /proc is covered, as a container's runtime covers its
# masked paths: a user namespace made in it may not mount a /proc of its own (EPERM).
COVERED_PROC = ["unshare", "--mount", "--propagation", "private", "sh", "-c"]
COVERED_PROC += ['mount --bind /dev/null /proc/uptime && exec "$@"', "covered-proc"]
TEXT: dict[str, Any] = {"capture_output": True, "text": True, "timeout": 30, "check": True}


def _nobody_can_read(folder: Path) -> None:
    os.chmod(folder, 0o755)
    subprocess.run(["chmod", "-R", "a+rX", str(folder)], check=True)


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


@pytest.mark.parametrize("start", ["unshare", "forkserver"])
def test_a_refused_proc_is_said_in_words_and_the_jobs_run_in_a_process_group(
    shared_tmp: Path, start: str
) -> None:
    """The first job finds the refusal out and runs in a process group after all; the reason
    names the step (the mount of /proc), and neither unshare's nor the init's words are in
    any job's output, nor on the runner's stderr; the second job does not try again."""
    package = Path(provision.__file__).parent
    shutil.copytree(package, shared_tmp / "provision", ignore=shutil.ignore_patterns("__pycache__"))
    (shared_tmp / "probe.py").write_text(REFUSING_SCRIPT)
    _nobody_can_read(shared_tmp)
    python = shutil.which("python3", path="/usr/bin")
    assert python is not None, "the system's python3 (Debian's) is needed"
    probe = [python, "-I", str(shared_tmp / "probe.py"), str(shared_tmp), start]
    done = subprocess.run(
        [*COVERED_PROC, *NOBODY_ARGV, *probe],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ["PATH"], "HOME": str(shared_tmp)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # no raw line: not unshare's, not the init's
    ran = [line for line in done.stdout.splitlines() if not line.startswith("{")]
    assert ran == ["job 0 ran", "job 1 ran"], done.stdout
    reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["containment"] for r in reports] == ["process-group"] * 2, reports
    assert [r["status"] for r in reports] == [0, 0] and [r["stderr"] for r in reports] == [None] * 2
    why = reports[0]["warning"]
    assert "mount /proc" in why and "Operation not permitted" in why, why
    assert reports[1]["warning"] == why  # remembered, not tried again


def test_a_scheduler_that_is_refused_its_proc_says_why_once_and_runs_every_tick(
    live_cluster: LiveCluster, shared_tmp: Path
) -> None:
    """`lockctl schedule` as `nobody` where /proc is covered (in a container): its ticks run
    in process groups; one `containment` event says why, with the step the machine refused;
    every `acquired` event names the mode; its stderr has nothing but its events."""
    uid = uuid.uuid4().hex[:8]
    prefix = f"test/contain-{uid}/"
    job = f"refused-{uid}"
    attributes = {"prefix": json.dumps(prefix), "schedule": '"@every 1s"'}
    attributes["command"] = json.dumps(["/bin/sh", "-c", "echo tick $LOCKCTL_TICK"])
    spec = shared_tmp / "locks.hcl"
    spec.write_text(spec_text(live_cluster, ["worker-1"], {job: attributes}))
    with minted_workers(live_cluster, spec, ["worker-1"], shared_tmp, uid, prefix) as made:
        os.chmod(shared_tmp, 0o755)  # the folder only: the secrets/ in it stay root's
        config = _nobodys_worker_files(made.configs["worker-1"], shared_tmp / "nobody")
        env = {"PATH": os.environ["PATH"], "HOME": str(shared_tmp), "PYTHONPATH": _code_path()}
        program = [*COVERED_PROC, *NOBODY_ARGV, _system_python(), "-m", "provision"]
        scheduler = SchedulerProcess(config, env=env, program=program)
        try:
            assert eventually(lambda: len(scheduler.events("released")) >= 3, 60), scheduler.lines
            assert scheduler.stop() == 0, scheduler.lines
        finally:
            scheduler.kill()
    assert [line for line in scheduler.lines if not line.startswith("{")] == []
    acquired = scheduler.events("acquired")
    assert {e["containment"] for e in acquired} == {"process-group"}, acquired
    told = scheduler.events("containment")
    assert len(told) == 1 and told[0]["mode"] == "process-group", told
    assert "mount /proc: Operation not permitted" in told[0]["warning"], told
    print("\n" + "\n".join(scheduler.lines))  # for docs/image.md


def _system_python() -> str:
    """The system's Python, which nobody can run (a venv's may be a link into root's home), of
    the venv's minor version: the venv's binary packages are built for it."""
    python = shutil.which("python3", path="/usr/bin")
    assert python is not None, "the system's python3 (Debian's) is needed"
    said = subprocess.run([python, "-c", "import sys; print(sys.version_info[:2])"], **TEXT)
    assert said.stdout.strip() == str(sys.version_info[:2]), (python, said.stdout)
    return python


def _code_path() -> str:
    """The code under test first (a snapshot's, never the editable install's), then the venv's
    packages."""
    return os.pathsep.join(
        [str(Path(provision.__file__).parents[1]), sysconfig.get_path("purelib")]
    )


def _nobodys_worker_files(config: Path, folder: Path) -> Path:
    """The worker's config, token and TLS files in a folder of nobody's (0600 for the files),
    the config's paths rewritten to them."""
    folder.mkdir(mode=0o700)
    raw = json.loads(config.read_text())
    consul = raw["consul"]
    for key in ("token_file", "ca_file", "cert_file", "key_file"):
        if key in consul:
            copy = folder / Path(consul[key]).name
            shutil.copyfile(consul[key], copy)
            consul[key] = str(copy)
    (folder / "lockctl.json").write_text(json.dumps(raw, indent=2))
    for path in [folder, *folder.iterdir()]:
        os.chown(path, NOBODY, NOBODY)
        if path != folder:
            path.chmod(0o600)
    return folder / "lockctl.json"
