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
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from scheduler_lab import SchedulerProcess
from workers_lab import minted_workers, operator_command, spec_text

from provision.consul import Consul, PermissionDenied
from provision.ledger.control import ControlNote, decode_note, decode_pauses
from provision.ledger.records import TickOutcome, TickRecord, timestamp
from provision.ledger.store import Ledger
from provision.system.control_keys import control_prefix, paused_key, pauses_key, trigger_key
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
            live_cluster.management().kv.delete(control_prefix(job), recurse=True)


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


def test_ticks_nobody_ran_while_the_job_was_paused_are_recorded_paused_not_missed(
    lab: Lab, consul: Consul
) -> None:
    """Every replica down: `check` records the ticks of a pause still on `paused` (and does not
    page); resumed while they are still down, the first replica back records the ticks the
    pause held `paused` and the ones after the resume `missed`."""
    began = datetime.now(timezone.utc)
    schedulers = start(lab)
    try:
        # two runs first: `check` judges the newest two ticks that were not paused, and the
        # ticks between the tests before this one were missed (no replica was running)
        assert eventually(lambda: len(_runs_after(lab, began)) >= 2, WAIT), records(lab)
        assert lockctl(lab, "pause", lab.job, "--reason", REASON).returncode == 0
        assert eventually(lambda: paused_since(lab, began), WAIT), records(lab)
        stop(schedulers)
        down = datetime.now(timezone.utc)
        assert eventually(lambda: len(_unrecorded(lab, down)) >= 2, WAIT)  # nobody records them
        check = lockctl(lab, "check", "--job", lab.job)
        assert check.returncode == 0, check.stdout  # they were held, not missed
        assert "missed or paused tick(s) recorded now)" in check.stdout, check.stdout
        by_check = [r for r in records(lab) if r.tick > down]
        assert len(by_check) >= 2 and {r.outcome for r in by_check} == {TickOutcome.PAUSED}
        assert {(r.worker, r.reason) for r in by_check} == {("lockctl check", REASON)}

        resumed = lockctl(lab, "resume", lab.job)
        assert resumed.returncode == 0, resumed.stderr
        kept = consul.kv.get(pauses_key(lab.job))[0]
        assert kept is not None, "resume kept no record of the pause it ended"
        window = decode_pauses(kept.value)[0]  # the newest: the pause just ended
        paused_at, until = window.at, window.until
        assert window.reason == REASON and paused_at is not None and until is not None
        assert eventually(lambda: _unrecorded(lab, until), WAIT)  # a tick after the resume
        schedulers = start(lab)
        back = eventually(lambda: _first_run_after(lab, until), WAIT)
        assert back is not None, records(lab)
        assert eventually(lambda: _all_recorded(lab, by_check[-1].tick, back.tick), WAIT)
        gap = [r for r in records(lab) if by_check[-1].tick < r.tick < back.tick]
        held = {r.tick: r.outcome for r in gap if paused_at <= r.tick < until}
        free = {r.tick: r.outcome for r in gap if r.tick >= until}
        # held: at least the ticks of the last 4 s before `check` (their windows were open)
        assert held and set(held.values()) == {TickOutcome.PAUSED}, gap
        assert free and set(free.values()) == {TickOutcome.MISSED}, gap
        # the metric `lockctl_missed_ticks_recorded_total` (an alert) counts the missed alone
        # (at most: a replica that starts late records its first tick itself, not tidying)
        tidied = [e for s in schedulers for e in s.events("housekeeping")]
        paused_sum = sum(e.get("paused_recorded") or 0 for e in tidied)
        missed_sum = sum(e.get("missed_recorded") or 0 for e in tidied)
        assert paused_sum <= len(held) and missed_sum <= len(free), tidied
        assert paused_sum + missed_sum >= 1, tidied
        history = lockctl(lab, "history", "--job", lab.job, "--limit", "8")
        print(f"\n$ lockctl history --job {lab.job} --limit 8\n{history.stdout}")  # for docs
        stop(schedulers)
    finally:
        for scheduler in schedulers:
            scheduler.kill()


def _ticks_between(lab: Lab, start: datetime, end: datetime) -> list[datetime]:
    """The job's `@every 2s` ticks after `start` and before `end`."""
    first = int(start.timestamp()) // 2 * 2 + 2
    return [datetime.fromtimestamp(s, timezone.utc) for s in range(first, int(end.timestamp()), 2)]


def _unrecorded(lab: Lab, since: datetime) -> list[datetime]:
    """Ticks after `since` nobody recorded, whose claim window and grace (2 s + 2 s) closed."""
    done = {r.tick for r in records(lab)}
    closed = datetime.now(timezone.utc) - timedelta(seconds=4.5)
    return [t for t in _ticks_between(lab, since, closed) if t not in done]


def _runs_after(lab: Lab, moment: datetime) -> list[TickRecord]:
    return [r for r in records(lab) if r.tick > moment and r.outcome is TickOutcome.SUCCEEDED]


def _first_run_after(lab: Lab, moment: datetime) -> TickRecord | None:
    return min(_runs_after(lab, moment), key=lambda r: r.tick, default=None)


def _all_recorded(lab: Lab, after: datetime, before: datetime) -> bool:
    done = {r.tick for r in records(lab)}
    return all(t in done for t in _ticks_between(lab, after, before))


def test_a_time_boxed_pause_ends_by_itself_with_no_resume(lab: Lab, consul: Consul) -> None:
    """`pause --for 15s`: the ticks before its end (Consul's clock) are recorded paused, the ones
    from it on run, while nobody resumes; status, history and check say when it ends. (Long
    enough for `status` and `check`, two processes on a loaded machine, to run inside it: with
    6 s the check came after the end now and then, and said nothing of the pause.)"""
    schedulers = start(lab)
    try:
        began = datetime.now(timezone.utc)
        assert eventually(lambda: _runs_after(lab, began), WAIT), records(lab)
        paused = lockctl(lab, "pause", lab.job, "--for", "15s", "--reason", REASON)
        assert paused.returncode == 0, paused.stderr
        print(f"\n$ lockctl pause {lab.job} --for 15s --reason '{REASON}'\n{paused.stdout}")
        note = read_note(consul, lab.job)
        assert note.ends is not None and note.at is not None
        assert f" until {timestamp(note.ends)}: {REASON}" in paused.stdout
        status = lockctl(lab, "status", "--json")
        (state,) = [s for s in json.loads(status.stdout) if s["job"] == lab.job]
        assert f" until {timestamp(note.ends)}" in state["paused"], state
        check = lockctl(lab, "check", "--job", lab.job)
        print(f"\n$ lockctl check --job {lab.job}\n{check.stdout}")  # for docs
        assert f" until {timestamp(note.ends)}: {REASON})" in check.stdout, check.stdout
        assert eventually(lambda: paused_since(lab, began), WAIT), records(lab)

        ends = note.ends
        first_run = eventually(lambda: _first_run_after(lab, ends - timedelta(seconds=2)), WAIT)
        assert first_run is not None, records(lab)
        assert first_run.tick >= ends  # it ran with the key still there, nobody resumed
        assert consul.kv.get(paused_key(lab.job))[0] is not None
        window = [r for r in records(lab) if began < r.tick < first_run.tick]
        held = [r for r in window if r.outcome is TickOutcome.PAUSED]
        assert held and all(r.tick < ends for r in held), window
        assert all(r.tick < ends for r in window if r.outcome is not TickOutcome.SUCCEEDED)
        history = lockctl(lab, "history", "--job", lab.job, "--limit", "6")
        print(f"\n$ lockctl history --job {lab.job} --limit 6\n{history.stdout}")  # for docs
        assert "(ended; `lockctl resume` removes it)" in history.stdout, history.stdout
        check = lockctl(lab, "check", "--job", lab.job)
        assert check.returncode == 0 and "(paused " not in check.stdout, check.stdout
        resumed = lockctl(lab, "resume", lab.job)
        assert resumed.stdout == f"job {lab.job} resumed\n", resumed.stderr
        stop(schedulers)
    finally:
        for scheduler in schedulers:
            scheduler.kill()
        consul.kv.delete(paused_key(lab.job))


def read_note(consul: Consul, job: str) -> ControlNote:
    entry = consul.kv.get(paused_key(job))[0]
    assert entry is not None, "no pause written"
    return decode_note(entry.value)


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (("--for", "2x"), "--for '2x' is not a duration such as 90s, 15m, 2h, 1h30m, 7d"),
        (("--until", "2020-01-01T00:00:00Z"), "--until: 2020-01-01T00:00:00.000Z is not after"),
        (("--for", "1h", "--until", "2099-01-01T00:00:00Z"), "--for and --until: give one of"),
    ],
)
def test_a_bad_end_is_one_line_naming_its_flag_and_pauses_nothing(
    lab: Lab, consul: Consul, flags: tuple[str, ...], said: str
) -> None:
    refused = lockctl(lab, "pause", lab.job, *flags)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith(f"lockctl: error: {said}"), refused.stderr
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert consul.kv.get(paused_key(lab.job))[0] is None
