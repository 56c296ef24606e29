"""Keyed runs on the real cluster: `lockctl run --key K` claims and records under the job's
`keys/K/`, one lock and one ledger per key. Two keys' runs of one tick go on at once; a second
run of the same key and tick skips it (taken); the job's own ledger is not touched; `history
--key` reads a key's ledger and `status` lists the keys seen; a key that breaks the rule is
refused at the flag (exit 2), before any lock."""

from __future__ import annotations

import io
import json
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import pytest
from workers_lab import JobLab, one_job

from provision.keyed import keyed_lock_key
from provision.ledger.records import TickOutcome, TickRecord, tick_name
from provision.ledger.store import Ledger
from provision.schedule import parse_schedule
from tests.lockctl_process import LOCKCTL, eventually

if TYPE_CHECKING:
    from conftest import LiveCluster

WORKERS = ("worker-1",)
WAIT = 60.0
EVERY = "@every 30s"  # a window that outlasts a slow start, whenever the test runs
SCHEDULE = parse_schedule(EVERY, "UTC")
RUN_FOR = "6"  # seconds each run sleeps: the two keys' runs overlap by far more than a start


@pytest.fixture(scope="module")
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobLab]:
    tmp = tmp_path_factory.mktemp("keyed")
    with one_job(live_cluster, tmp, "keyed", WORKERS, {"schedule": f'"{EVERY}"'}) as lab:
        yield lab


def events(path: Path, name: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == name]


def start_run(lab: JobLab, key: str, stderr: IO[str]) -> subprocess.Popen[str]:
    argv = [*LOCKCTL, "run", "--config", str(lab.configs["worker-1"]), "--job", lab.job]
    told = 'echo "$LOCKCTL_KEY $LOCKCTL_IDEMPOTENCY_KEY" >> "$0"; exec sleep "$1"'
    return subprocess.Popen(
        [*argv, "--key", key, "--", "sh", "-c", told, str(lab.tmp / "told"), RUN_FOR],
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        text=True,
    )


def key_records(lab: JobLab, key: str) -> list[TickRecord]:
    return Ledger(lab.cluster.management(), keyed_lock_key(lab.lock_key, key)).records()


def at_next_tick() -> None:
    """Sleep until just after the schedule's next tick (a start, not a synchronisation)."""
    tick = SCHEDULE.next_ticks(datetime.now(timezone.utc), 1)[0]
    time.sleep(max(0.0, tick.timestamp() + 0.05 - time.time()))


def test_each_key_has_its_own_lock_and_ledger(lab: JobLab) -> None:
    logs = {name: lab.tmp / f"{name}.log" for name in ("t1", "t2", "t1-again")}
    at_next_tick()
    with logs["t1"].open("w") as one, logs["t2"].open("w") as two:
        runs = [start_run(lab, "tenant-1", one), start_run(lab, "tenant-2", two)]
    try:

        def both() -> list[list[dict[str, Any]]]:
            found = [events(logs[name], "acquired") for name in ("t1", "t2")]
            return found if all(found) else []

        acquired = eventually(both, WAIT)
        assert acquired, [logs[n].read_text() for n in ("t1", "t2")]
        with logs["t1-again"].open("w") as again:
            second = start_run(lab, "tenant-1", again)  # the same key, the same tick
        assert second.wait(WAIT) == 0, logs["t1-again"].read_text()
        assert [run.wait(WAIT) for run in runs] == [0, 0], [p.read_text() for p in logs.values()]
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.wait(WAIT)
    [[first], [other]] = acquired
    tick = first["tick"]
    assert other["tick"] == tick and first["key"] == "tenant-1" and other["key"] == "tenant-2"
    # at once: each key's run acquired before the other's released
    [released_one], [released_two] = events(logs["t1"], "released"), events(logs["t2"], "released")
    assert other["time"] < released_one["time"] and first["time"] < released_two["time"]
    told = sorted((lab.tmp / "told").read_text().splitlines())  # what each run was told
    assert told == [f"tenant-{n} lockctl:{lab.job}:key:tenant-{n}:{tick}" for n in (1, 2)]
    [skipped] = events(logs["t1-again"], "skipped")
    assert skipped["key"] == "tenant-1" and skipped["tick"] == tick, skipped
    for key in ("tenant-1", "tenant-2"):
        [record] = [r for r in key_records(lab, key) if tick_name(r.tick) == tick]
        assert record.outcome is TickOutcome.SUCCEEDED and record.worker == "worker-1"
    assert [r for r in lab.records() if tick_name(r.tick) == tick] == []  # the job's own ledger
    for path in logs.values():
        text = path.read_text()
        assert "Traceback" not in text and all(secret not in text for secret in lab.secrets)

    history = lab.operator("history", "--job", lab.job, "--key", "tenant-1", "--limit", "2")
    assert history.returncode == 0, history.stderr
    print(f"\n$ lockctl history --job {lab.job} --key tenant-1 --limit 2\n{history.stdout}")
    assert f"{lab.job}, key tenant-1" in history.stdout and tick in history.stdout
    as_json = lab.operator("history", "--job", lab.job, "--key", "tenant-2", "--json")
    [document] = json.loads(as_json.stdout)
    assert document["key"] == "tenant-2"
    assert document["lock_key"] == keyed_lock_key(lab.lock_key, "tenant-2")
    print(f"\n$ lockctl run ... --key tenant-1 -- ...\n{logs['t1'].read_text()}")
    print(f"\n$ lockctl run ... --key tenant-1 (again)\n{logs['t1-again'].read_text()}")
    table = lab.operator("status")
    print(f"\n$ lockctl status\n{table.stdout}")  # for docs
    assert "keys seen" in table.stdout and "tenant-2" in table.stdout
    status = lab.operator("status", "--json")
    [state] = [s for s in json.loads(status.stdout) if s["job"] == lab.job]
    assert (state["keys_seen"], state["keys_seen_count"]) == (["tenant-1", "tenant-2"], 2)


@pytest.mark.parametrize("key", ["../other-job", "a/b", "-rf", "x" * 129])
def test_a_key_that_breaks_the_rule_is_refused_before_any_lock(lab: JobLab, key: str) -> None:
    argv = [*LOCKCTL, "run", "--config", str(lab.configs["worker-1"]), "--job", lab.job]
    refused = subprocess.run(
        [*argv, f"--key={key}", "--", "true"], capture_output=True, text=True, timeout=WAIT
    )
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "--key '" in refused.stderr and "must be 1-128 characters" in refused.stderr
    history = lab.operator("history", "--job", lab.job, f"--key={key}")
    assert history.returncode == 2 and "--key '" in history.stderr, history.stderr


def test_an_abort_of_a_key_stops_that_keys_run(lab: JobLab) -> None:
    log = lab.tmp / "aborted.log"
    argv = [*LOCKCTL, "run", "--config", str(lab.configs["worker-1"]), "--job", lab.job]
    at_next_tick()
    with log.open("w") as stderr:
        run = subprocess.Popen(
            [*argv, "--key", "tenant-3", "--", "sleep", "60"],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            text=True,
        )
    try:
        [acquired] = eventually(lambda: events(log, "acquired"), WAIT)
        unkeyed = lab.operator("abort", lab.job)  # the job's own lock: nothing runs under it
        assert unkeyed.returncode == 1, unkeyed.stderr
        aborted = lab.operator("abort", lab.job, "--key", "tenant-3", "--reason", "stuck")
        assert aborted.returncode == 0, aborted.stderr
        assert run.wait(WAIT) == 143, log.read_text()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(WAIT)
    [record] = [r for r in key_records(lab, "tenant-3") if tick_name(r.tick) == acquired["tick"]]
    assert record.outcome is TickOutcome.ABORTED and record.reason == "stuck"
    [said] = events(log, "aborted")
    assert said["key"] == "tenant-3"


def test_an_embedded_call_runs_each_key_under_its_own_lock(lab: JobLab) -> None:
    from provision.embed import Locker, Outcome, Run

    seen: list[tuple[str | None, int]] = []

    with Locker.from_config(lab.configs["worker-1"], events=io.StringIO()) as locker:

        @locker.singleton(lab.job, key=lambda tenant: tenant)
        def report(run: Run, tenant: str) -> None:
            seen.append((run.key, run.lock_index))

        at_next_tick()
        outcomes = [report("tenant-5"), report("tenant-6"), report("tenant-5")]
        with pytest.raises(ValueError, match=r"key '\.\./x' must be 1-128"):
            locker.call(lab.job, lambda run: None, key="../x")
    assert [o.outcome for o in outcomes] == [Outcome.RAN, Outcome.RAN, Outcome.SKIPPED]
    assert sorted(key for key, _ in seen) == ["tenant-5", "tenant-6"]
    for key in ("tenant-5", "tenant-6"):
        [record] = [r for r in key_records(lab, key) if r.tick == outcomes[0].tick]
        assert record.outcome is TickOutcome.SUCCEEDED
