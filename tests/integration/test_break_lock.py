"""`lockctl break JOB` on the real cluster: a `lockctl run` on worker-1 holds a job's lock (a
long sleep); break, with an operator's token holding exactly the rules docs/operations.md gives,
refuses while worker-1's node is healthy, and destroys the session with --force --yes; the
holder's run then finds its lock lost (exit 76), a run on worker-2 right after is refused for
the lock-delay, and a waiting run takes the lock once it ends. A worker's token cannot break
another worker's session (403), and a worker's `lockctl break` says it needs an operator's."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from scheduler_lab import SchedulerProcess
from workers_lab import eventually_usable, minted_workers, operator_command, spec_text

from provision.consul import PermissionDenied
from provision.system.secrets import read_secret_file, write_secret_file
from tests.lockctl_process import LOCKCTL, eventually

if TYPE_CHECKING:
    from conftest import LiveCluster

WORKERS = ("worker-1", "worker-2")
LOCK_DELAY = 45.0  # long: the run asked right after the break is inside it, however loaded
SCHEDULED_TTL = 120.0
WAIT = 120.0  # seconds a runner may take at most (a loaded machine; the lock-delay included)


def operator_rules(prefix: str) -> str:
    """The operators' policy of docs/operations.md, for this test's prefix and workers."""
    rules = [
        'key_prefix "lockctl/control/" {\n  policy = "write"\n}',
        f'key_prefix "{prefix}" {{\n  policy = "read"\n}}',
    ]
    for worker in WORKERS:
        rules.append(f'session "{worker}" {{\n  policy = "write"\n}}')
        rules.append(f'node "{worker}" {{\n  policy = "read"\n}}')
    return "\n".join(rules) + "\n"


@dataclass
class Lab:
    cluster: LiveCluster
    spec_path: Path
    job: str
    key: str
    configs: dict[str, Path]
    operator: Path  # the operator's token file
    tmp: Path
    secrets: list[str] = field(default_factory=list, repr=False)  # never printed


@pytest.fixture(scope="module")
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("break")
    uid = uuid.uuid4().hex[:8]
    prefix, job = f"test/break-{uid}/", f"break-{uid}"
    attributes = {"prefix": json.dumps(f"{prefix}plain/"), "lock_delay": f'"{LOCK_DELAY:g}s"'}
    scheduled = {
        "prefix": json.dumps(f"{prefix}nightly/"),
        "schedule": '"@every 2s"',
        "command": json.dumps(["/bin/sleep", "20"]),
        "ttl": f'"{SCHEDULED_TTL:g}s"',  # its replica killed, its session outlives the test
    }
    jobs = {job: attributes, f"nightly-{uid}": scheduled}
    spec_path = tmp / "locks.hcl"
    spec_path.write_text(spec_text(live_cluster, WORKERS, jobs))
    management = live_cluster.management()
    with minted_workers(live_cluster, spec_path, WORKERS, tmp, uid, prefix) as made:
        policy = management.acl.create_policy(f"test-operator-{uid}", operator_rules(prefix))
        token = management.acl.create_token(f"test {uid}: alice (on-call)", [policy.name])
        try:
            assert token.secret is not None
            made.secrets.append(token.secret.reveal())
            write_secret_file(tmp / "operator.token", token.secret)
            eventually_usable(live_cluster.client("server-1", token.secret))
            yield Lab(
                live_cluster,
                spec_path,
                job,
                f"{prefix}plain/.lock",
                made.configs,
                tmp / "operator.token",
                tmp,
                made.secrets,
            )
        finally:
            management.acl.delete_token(token.accessor_id)
            management.acl.delete_policy(policy.id)


def _run(lab: Lab, worker: str, *args: str, command: str) -> list[str]:
    argv = [*LOCKCTL, "run", "--config", str(lab.configs[worker]), "--job", lab.job, *args]
    return [*argv, "--", "sh", "-c", command]


def _events(stderr: str, name: str) -> list[dict[str, Any]]:
    events = (json.loads(line) for line in stderr.splitlines() if line.startswith("{"))
    return [event for event in events if event["event"] == name]


def _holder(lab: Lab, key: str | None = None) -> str | None:
    entry, _ = lab.cluster.management().kv.get(key or lab.key, consistency="consistent")
    return None if entry is None else entry.session


def _break(
    lab: Lab, *args: str, token: Path | None = None, job: str | None = None
) -> subprocess.CompletedProcess[str]:
    job = job or lab.job
    result = operator_command(
        lab.cluster, lab.spec_path, lab.secrets, "break", job, *args, token=token or lab.operator
    )
    print(f"\n$ lockctl break {job} {' '.join(args)}\n{result.stdout}{result.stderr}")
    return result


def test_break_refuses_a_healthy_holder_and_breaks_it_with_force(lab: Lab) -> None:
    holder = subprocess.Popen(
        _run(lab, "worker-1", command="sleep 300"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        session = eventually(lambda: _holder(lab), 60.0)
        assert session, "the holder never took the lock"

        refused = _break(lab, "--yes")
        assert refused.returncode == 1, refused.stderr
        assert "node:       worker-1, serfHealth passing" in refused.stdout
        assert "ttl:        10s" in refused.stdout
        assert f"session:    {session} " in refused.stdout
        assert "not broken: node worker-1 is healthy (serfHealth passing)" in refused.stderr
        assert _holder(lab) == session  # nothing destroyed

        # a worker's token: 403 on the destroy itself; break says it needs an operator's
        worker_2 = read_secret_file(lab.tmp / "secrets" / "worker-2.token")
        with pytest.raises(PermissionDenied):
            lab.cluster.client("worker-2", worker_2).session.destroy(session)
        denied = _break(lab, "--force", "--yes", token=lab.tmp / "secrets" / "worker-2.token")
        assert denied.returncode == 4, denied.stderr
        assert "break needs an operator's token" in denied.stderr
        assert _holder(lab) == session

        broken = _break(lab, "--force", "--yes")
        assert broken.returncode == 0, broken.stderr
        destroyed_at = time.monotonic()
        assert f"session {session} destroyed: the lock may be taken again from about" in (
            broken.stdout
        )
        assert f"(LockDelay {LOCK_DELAY:g}s)" in broken.stdout and "exit 76" in broken.stdout

        # right after: free, but in the lock-delay: a run on worker-2 is refused for it
        early = subprocess.run(
            _run(lab, "worker-2", command="true"),
            capture_output=True,
            text=True,
            timeout=WAIT,
            check=False,
        )
        assert time.monotonic() - destroyed_at < LOCK_DELAY, "asked after it: proves nothing"
        skipped = _events(early.stderr, "skipped")
        assert early.returncode == 0 and skipped, early.stderr
        assert "lock-delay" in skipped[0]["reason"], skipped[0]

        # the holder finds its lock lost: its job stopped, exit 76
        _, held_err = holder.communicate(timeout=WAIT)
        assert holder.returncode == 76, held_err

        # a run that waits takes it once the lock-delay ended: after the refused one
        later = subprocess.run(
            _run(lab, "worker-2", "--wait", "--timeout", f"{WAIT:g}s", command="true"),
            capture_output=True,
            text=True,
            timeout=WAIT + 30,
            check=False,
        )
        assert later.returncode == 0, later.stderr
        assert _events(later.stderr, "acquired"), later.stderr

        nothing = _break(lab, "--yes")
        assert nothing.returncode == 0 and nothing.stdout.startswith("nothing to break")
    finally:
        if holder.poll() is None:
            holder.terminate()
            holder.communicate(timeout=WAIT)


def test_break_shows_the_tick_a_killed_replica_held(lab: Lab) -> None:
    """A `lockctl schedule` replica killed (kill -9) while its job runs: its session lives on
    (its TTL, long here), its node is healthy; break shows the tick from the holder's record
    and checks it against the ledger's, refuses without --force, and breaks it with it."""
    job = lab.job.replace("break-", "nightly-")
    key = lab.key.replace("/plain/", "/nightly/")
    replica = SchedulerProcess(lab.configs["worker-1"])
    try:
        session = eventually(lambda: _holder(lab, key), 60.0)
        assert session, "\n".join(replica.lines)
    finally:
        replica.kill()
    assert _holder(lab, key) == session  # killed: nobody released it

    refused = _break(lab, "--yes", job=job)
    assert refused.returncode == 1, refused.stderr
    assert "not broken: node worker-1 is healthy" in refused.stderr
    assert f'"lockctl schedule on worker-1 (ttl {SCHEDULED_TTL:g}s,' in refused.stdout
    tick = next(line for line in refused.stdout.splitlines() if line.startswith("tick:"))
    assert "running in the ledger, claimed by worker-1 under its session" in tick, tick

    declined = _answered(lab, job, "n")
    assert declined.returncode == 1, declined.stderr
    assert f"destroy session {session} on node worker-1? [y/N]" in declined.stdout
    assert "not broken: not confirmed" in declined.stderr
    assert _holder(lab, key) == session

    broken = _answered(lab, job, "y")
    assert broken.returncode == 0, broken.stderr
    assert f"session {session} destroyed" in broken.stdout
    assert _holder(lab, key) is None


def _answered(lab: Lab, job: str, answer: str) -> subprocess.CompletedProcess[str]:
    """`lockctl break JOB --force` at a terminal (a pseudo-terminal its stdin), `answer` typed
    at its question."""
    flags = ["--spec", str(lab.spec_path), "--address", lab.cluster.address("server-1")]
    flags += ["--token-file", str(lab.operator), *lab.cluster.tls_flags()]
    controller, terminal = pty.openpty()
    try:
        os.write(controller, f"{answer}\n".encode())  # waits in the terminal until read
        result = subprocess.run(
            [*LOCKCTL, "break", job, "--force", *flags],
            stdin=terminal,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(terminal)
        os.close(controller)
    print(f"\n$ lockctl break {job} --force  (answered {answer})\n{result.stdout}{result.stderr}")
    assert not any(secret in result.stdout + result.stderr for secret in lab.secrets)
    assert "Traceback" not in result.stderr, result.stderr
    return result
