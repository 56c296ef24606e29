"""`lockctl pause` and `lockctl resume` on the real cluster (issue 21, item 4): three `lockctl
schedule` replicas run an `@every 2s` job whose command is a process tree; paused, none of them
runs its ticks, each tick is recorded `paused` (who paused it, when, why) and shown so by
`history`, `status` shows the pause and `check` does not page; the pause survives a restart of
every replica; resumed, the next tick runs. A worker's token may read the job's control keys
and not write them (403), so it can neither pause, resume nor trigger."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from scheduler_lab import SchedulerProcess
from workers_lab import minted_workers, operator_command, spec_text

from provision.consul import Consul, PermissionDenied
from provision.ledger.control import ControlNote
from provision.ledger.records import TickOutcome, TickRecord, timestamp
from provision.ledger.store import Ledger
from provision.system.control_keys import paused_key, trigger_key
from provision.system.secrets import read_secret_file
from tests.lockctl_process import eventually

if TYPE_CHECKING:
    from conftest import LiveCluster

WORKERS = ("worker-1", "worker-2", "worker-3")
WAIT = 40.0
REASON = "disk swap on db-1"
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass
class Lab:
    cluster: LiveCluster
    spec_path: Path
    job: str
    lock_key: str
    configs: dict[str, Path]
    runs: Path  # one line per run of the job, written by its process tree
    tmp: Path
    secrets: list[str] = field(default_factory=list, repr=False)  # never printed


@pytest.fixture(scope="module")
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("pause")
    uid = uuid.uuid4().hex[:8]
    job, runs = f"paused-{uid}", tmp / "runs.log"
    # a process tree: a child in the background that the shell waits for
    script = f"(sleep 0.1; echo ran >> {runs}) & wait"
    command = json.dumps(["/bin/sh", "-c", script])
    attributes = {"prefix": f'"test/pause-{uid}/"', "schedule": '"@every 2s"', "command": command}
    spec_path = tmp / "locks.hcl"
    spec_path.write_text(spec_text(live_cluster, WORKERS, {job: attributes}))
    with minted_workers(live_cluster, spec_path, WORKERS, tmp, uid, f"test/pause-{uid}/") as made:
        lab = Lab(
            live_cluster,
            spec_path,
            job,
            f"test/pause-{uid}/.lock",
            made.configs,
            runs,
            tmp,
            made.secrets,
        )
        try:
            yield lab
        finally:
            live_cluster.management().kv.delete(f"lockctl/control/{job}/", recurse=True)


def lockctl(lab: Lab, *args: str, token: Path | None = None) -> subprocess.CompletedProcess[str]:
    """An operator's command, with the management token (as `apply` takes it) unless told."""
    return operator_command(lab.cluster, lab.spec_path, lab.secrets, *args, token=token)


def records(lab: Lab) -> list[TickRecord]:
    return Ledger(lab.cluster.management(), lab.lock_key).records()


def paused_since(lab: Lab, moment: datetime) -> list[TickRecord]:
    return [r for r in records(lab) if r.tick > moment and r.outcome is TickOutcome.PAUSED]


def run_count(lab: Lab) -> int:
    return len(lab.runs.read_text().splitlines()) if lab.runs.exists() else 0


def start(lab: Lab) -> list[SchedulerProcess]:
    return [SchedulerProcess(lab.configs[worker]) for worker in WORKERS]


def stop(schedulers: list[SchedulerProcess]) -> None:
    for scheduler in schedulers:
        assert scheduler.stop() == 0, scheduler.lines
        assert not any("Traceback" in line for line in scheduler.lines), scheduler.lines


def test_a_paused_job_runs_none_of_its_ticks_until_resumed(lab: Lab) -> None:
    schedulers = start(lab)
    try:
        assert eventually(lambda: run_count(lab) >= 1, WAIT), "\n".join(schedulers[0].lines)

        paused = lockctl(lab, "pause", lab.job, "--reason", REASON)
        assert paused.returncode == 0, paused.stderr
        print(f"\n$ lockctl pause {lab.job} --reason '{REASON}'\n{paused.stdout}")  # for docs
        assert paused.stdout.startswith(f"job {lab.job} paused by ")
        assert paused.stdout.rstrip().endswith(f": {REASON}")
        again = lockctl(lab, "pause", lab.job, "--reason", "another")
        assert again.returncode == 0 and "was already paused" in again.stdout
        assert again.stdout.rstrip().endswith(f": {REASON}")  # the first pause's note is kept

        # the first paused tick: from then on no run, whatever each replica's turn
        first = eventually(lambda: paused_since(lab, EPOCH), WAIT)
        assert first, records(lab)
        since, ran = first[0].tick, run_count(lab)
        assert eventually(lambda: len(paused_since(lab, since)) >= 3, WAIT), records(lab)
        assert run_count(lab) == ran
        later = [r for r in records(lab) if r.tick >= since]
        assert {r.outcome for r in later} == {TickOutcome.PAUSED}, later
        record = later[-1]
        assert record.by and record.reason == REASON and record.asked_at is not None
        when = timestamp(record.asked_at)
        assert record.worker in WORKERS and record.exit_status is None

        skips = [e for s in schedulers for e in s.events("skipped")]
        assert any(e.get("paused_by") == record.by for e in skips), skips

        history = lockctl(lab, "history", "--job", lab.job, "--limit", "5")
        assert history.returncode == 0, history.stderr
        print(f"\n$ lockctl history --job {lab.job} --limit 5\n{history.stdout}")  # for docs
        assert "paused (by " in history.stdout and REASON in history.stdout
        check = lockctl(lab, "check", "--job", lab.job)
        print(f"\n$ lockctl check --job {lab.job}\n{check.stdout}")  # for docs
        assert check.returncode == 0, check.stdout  # paused ticks are no missed runs
        assert check.stdout.rstrip().endswith(f" (paused by {record.by} at {when}: {REASON})")
        status = lockctl(lab, "status", "--json")
        (state,) = [s for s in json.loads(status.stdout) if s["job"] == lab.job]
        assert state["paused"].startswith(f"by {record.by} at ") and REASON in state["paused"]

        # every replica stopped and started again: the pause is in Consul, not in them
        stop(schedulers)
        restarted = datetime.now().astimezone()
        schedulers = start(lab)
        assert eventually(lambda: len(paused_since(lab, restarted)) >= 2, WAIT), records(lab)
        assert run_count(lab) == ran

        resumed = lockctl(lab, "resume", lab.job)
        assert resumed.returncode == 0 and resumed.stdout == f"job {lab.job} resumed\n"
        at = datetime.now().astimezone()
        assert eventually(
            lambda: any(r.tick > at and r.outcome is TickOutcome.SUCCEEDED for r in records(lab)),
            WAIT,
        ), records(lab)
        assert run_count(lab) > ran
        again = lockctl(lab, "resume", lab.job)
        assert again.returncode == 0 and again.stdout == f"job {lab.job} was not paused\n"
        stop(schedulers)
    finally:
        for scheduler in schedulers:
            scheduler.kill()


def test_a_worker_token_reads_its_job_s_control_keys_and_cannot_write_them(lab: Lab) -> None:
    secret = read_secret_file(lab.tmp / "secrets" / "worker-1.token")
    worker = lab.cluster.client("worker-1", secret)
    assert worker.kv.get(paused_key(lab.job))[0] is None  # read: allowed (absent)
    note = ControlNote("worker-1", None, "not mine to say").encode()
    for key in (paused_key(lab.job), trigger_key(lab.job)):
        with pytest.raises(PermissionDenied):
            worker.kv.put(key, note)
    with pytest.raises(PermissionDenied):
        worker.kv.delete(paused_key(lab.job))
    with pytest.raises(PermissionDenied):  # nor another job's
        worker.kv.get(paused_key("another-job"))


def test_pause_refuses_an_unknown_job_and_a_bad_reason_before_any_write(
    lab: Lab, consul: Consul
) -> None:
    unknown = lockctl(lab, "pause", "no-such-job")
    assert unknown.returncode == 2
    assert unknown.stderr == f"lockctl: error: job 'no-such-job' is not in {lab.spec_path}\n"
    bad = lockctl(lab, "pause", lab.job, "--reason", "two\nlines")
    assert bad.returncode == 2
    assert bad.stderr == (
        "lockctl: error: --reason has a control character or a character that is not printable\n"
    )
    assert consul.kv.get(paused_key(lab.job))[0] is None
    denied = lockctl(lab, "pause", lab.job, token=lab.tmp / "secrets" / "worker-1.token")
    assert denied.returncode == 4, denied.stderr  # a worker's token: 403
    assert consul.kv.get(paused_key(lab.job))[0] is None
