"""`catchup = "latest"` on the real cluster (issue 21, item 3): after a time with no replica
running, the first one back runs the newest tick nobody ran, once, recorded as a catch-up;
older ticks stay missed; `catchup = "skip"` runs none of them.

Two jobs on @every 5s with a start_deadline of 20s (above the interval: only then can a tick
whose window closed still be run), one "latest" and one "skip", each a process tree (a shell, a
child in the background and one it waits for) that logs the tick it ran ($LOCKCTL_TICK). Three
`lockctl schedule` replicas run both; all are stopped for a few ticks and restarted at once:
the latest job's newest gap tick runs once (one `acquired` across the three, one log line), its
older gap ticks are recorded missed, and the skip job's gap ticks are all missed. `lockctl run`
does the same with two runs started at once after a gap; and a scheduler whose Consul was out
of reach for a few ticks catches up after it answers again. A `catchup = "all"` job runs every
tick of the outage, oldest first, once each across the three replicas.

The decisions around them are tested in virtual time, where a loaded machine cannot move a run
past its tick: a catch-up claims over a `missed` record at the index it read, never at an older
one (tests/contract/test_tick_store.py, on Consul and on the in-memory store alike, and
tests/unit/test_tick_core_offschedule.py), and a tick a pause held is not caught up though the
job was resumed before anyone came back (tests/unit/test_tick_once.py).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from scheduler_lab import SchedulerProcess, free_port
from workers_lab import minted_workers, spec_text

from provision.ledger.records import TickOutcome, TickRecord, tick_name
from provision.ledger.store import Ledger
from provision.schedule import parse_schedule
from tests.lockctl_process import LOCKCTL, eventually, run_lockctl

if TYPE_CHECKING:
    from conftest import LiveCluster

WORKERS = ("worker-1", "worker-2", "worker-3")
EVERY = 5
SCHEDULE = parse_schedule(f"@every {EVERY}s")
DEADLINE = "20s"
WAIT = 60.0
GAP = 4  # ticks with no replica running
JOBS = ("latest", "skip", "run", "outage", "all")


def _command(log: Path) -> str:
    """A process tree: the shell, a background child, and a child it waits for."""
    line = f'echo "$LOCKCTL_TICK $LOCKCTL_WORKER" >> {log}'
    return json.dumps(["/bin/sh", "-c", f"sleep 0.2 & (sleep 0.3; {line}) ; wait"])


@dataclass(frozen=True)
class Lab:
    tmp: Path
    configs: dict[str, Path]
    spec_path: Path
    jobs: dict[str, str]  # short -> job name
    keys: dict[str, str]  # short -> lock key
    logs: dict[str, Path]
    cluster: LiveCluster
    secrets: tuple[str, ...] = field(repr=False)  # pytest prints a failing test's arguments


@pytest.fixture(scope="module")
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("catchup")
    uid = uuid.uuid4().hex[:8]
    kv = f"test/catchup-{uid}/"
    logs = {short: tmp / f"{short}.log" for short in JOBS}
    jobs: dict[str, dict[str, str]] = {}
    for short in JOBS:
        jobs[f"{short}-{uid}"] = {
            "prefix": f'"{kv}{short}/"',
            "schedule": f'"@every {EVERY}s"',
            "start_deadline": f'"{DEADLINE}"',
            "catchup": {"skip": '"skip"', "all": '"all"'}.get(short, '"latest"'),
        }
        if short in ("latest", "skip", "outage", "all"):  # `lockctl schedule` runs only these
            jobs[f"{short}-{uid}"]["command"] = _command(logs[short])
    spec_path = tmp / "locks.hcl"
    spec_path.write_text(spec_text(live_cluster, WORKERS, jobs))
    with minted_workers(live_cluster, spec_path, WORKERS, tmp, uid, kv) as made:
        yield Lab(
            tmp,
            made.configs,
            spec_path,
            {short: f"{short}-{uid}" for short in JOBS},
            {short: f"{kv}{short}/.lock" for short in JOBS},
            logs,
            live_cluster,
            tuple(made.secrets),
        )


def _records(lab: Lab, short: str) -> dict[datetime, TickRecord]:
    ledger = Ledger(lab.cluster.management(), lab.keys[short])
    return {record.tick: record for record in ledger.records()}


def _finished(lab: Lab, short: str) -> list[datetime]:
    return sorted(t for t, r in _records(lab, short).items() if r.finished)


def _logged(lab: Lab, short: str) -> list[str]:
    path = lab.logs[short]
    return path.read_text().split("\n")[:-1] if path.exists() else []


def _at(tick: datetime, offset: float = 0.05) -> None:
    time.sleep(max(0.0, tick.timestamp() + offset - time.time()))


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _acquired(schedulers: list[SchedulerProcess], job: str, tick: datetime) -> list[str]:
    return [
        e["worker"]
        for s in schedulers
        for e in s.events("acquired")
        if e.get("job") == job and e.get("tick") == tick_name(tick)
    ]


def _lockctl(lab: Lab, *args: str) -> subprocess.CompletedProcess[str]:
    connection = ["--address", lab.cluster.address("server-1")]
    connection += ["--token-file", str(lab.cluster.layout.management_token_file)]
    flags = ["--spec", str(lab.spec_path), *connection, *lab.cluster.tls_flags()]
    result = run_lockctl(*args, *flags, drop=("CONSUL_", "FORCE_COLOR"))
    assert "Traceback" not in result.stderr, result.stderr
    for secret in lab.secrets:
        assert secret not in result.stdout + result.stderr
    return result


def _shown(lab: Lab, job: str) -> dict[str, str]:
    """Each tick's outcome as `lockctl history --json` says it (a missed tick whether or not
    a housekeeping has recorded it yet)."""
    history = _lockctl(lab, "history", "--job", job, "--json")
    assert history.returncode in (0, 1), history.stderr
    (found,) = json.loads(history.stdout)
    return {row["tick"]: row["outcome"] for row in found["ticks"]}


def _config_of(lab: Lab, worker: str, *shorts: str) -> Path:
    """A copy of the worker's config with only those jobs, beside it (its paths are absolute):
    each test's schedulers run only its own jobs."""
    raw = json.loads(lab.configs[worker].read_text())
    raw["jobs"] = {lab.jobs[short]: raw["jobs"][lab.jobs[short]] for short in shorts}
    path = lab.configs[worker].with_name(f"{'-'.join(shorts)}.json")
    path.write_text(json.dumps(raw))
    return path


def _start_all(lab: Lab) -> list[SchedulerProcess]:
    return [SchedulerProcess(_config_of(lab, worker, "latest", "skip")) for worker in WORKERS]


def _stop_all(schedulers: list[SchedulerProcess]) -> None:
    for scheduler in schedulers:
        if scheduler.process.poll() is None:
            scheduler.process.send_signal(15)
    for scheduler in schedulers:
        assert scheduler.stop() == 0, scheduler.lines[-5:]


def test_an_outage_of_every_replica_runs_the_latest_missed_tick_once(lab: Lab) -> None:
    latest, skip = lab.jobs["latest"], lab.jobs["skip"]
    first = _start_all(lab)
    try:
        ran = eventually(lambda: len(_finished(lab, "latest")) >= 2, WAIT)
        assert ran and eventually(lambda: len(_finished(lab, "skip")) >= 2, WAIT)
    finally:
        _stop_all(first)
    last = {short: max(_records(lab, short)) for short in ("latest", "skip")}
    # nobody runs them for GAP ticks; then all three come back at once, just after a tick
    back_at = SCHEDULE.next_ticks(max(last.values()) + timedelta(seconds=EVERY * GAP), 1)[0]
    _at(back_at, 0.5)
    second = _start_all(lab)
    try:

        def back(short: str) -> list[datetime]:
            """The ticks the replicas back ran as usual (not as a catch-up), finished."""
            found = _records(lab, short).items()
            return sorted(t for t, r in found if t > last[short] and r.finished and not r.catchup)

        def settled() -> bool:
            caught = [r for r in _records(lab, "latest").values() if r.catchup and r.finished]
            return bool(caught and back("latest") and back("skip"))

        assert eventually(settled, WAIT), (_records(lab, "latest"), second[0].lines[-20:])
    finally:
        _stop_all(second)
    schedulers = first + second

    # the gap: the ticks after the last one run before the outage and before the first one run
    # as usual after it (under load the replicas may take longer than a tick to start)
    def gap(short: str) -> list[datetime]:
        return [t for t in SCHEDULE.next_ticks(last[short], 64) if t < back(short)[0]]

    # the latest job: the newest gap tick ran once, as a catch-up; every older one is missed
    records, newest = _records(lab, "latest"), gap("latest")[-1]
    caught = [tick for tick, record in records.items() if record.catchup]
    assert caught == [newest], {tick_name(t): r.outcome for t, r in records.items()}
    assert newest >= back_at - timedelta(seconds=EVERY)  # the outage's, not an older one
    assert records[newest].outcome is TickOutcome.SUCCEEDED
    assert len(_acquired(schedulers, latest, newest)) == 1  # one replica of three
    assert _logged(lab, "latest").count(tick_name(newest) + " " + records[newest].worker) == 1
    catchups = [e for s in second for e in s.events("catch-up") if e.get("job") == latest]
    assert {e["tick"] for e in catchups} == {tick_name(newest)}
    older = gap("latest")[:-1]
    assert len(older) >= GAP - 1
    assert all(_shown(lab, latest)[tick_name(t)] == "missed" for t in older)
    assert records[back("latest")[0]].outcome is TickOutcome.SUCCEEDED

    # the skip job: none of its gap ticks ran; each is missed (recorded, or soon to be)
    skipped = gap("skip")
    assert len(skipped) >= GAP
    assert all(_shown(lab, skip)[tick_name(t)] == "missed" for t in skipped)
    records = _records(lab, "skip")
    assert not [t for t in skipped if t in records and records[t].outcome is not TickOutcome.MISSED]
    assert not [r for r in records.values() if r.catchup]
    assert not [e for s in schedulers for e in s.events("catch-up") if e.get("job") == skip]
    assert not [line for line in _logged(lab, "skip") if line.split()[0] in map(tick_name, skipped)]

    history = _lockctl(lab, "history", "--job", latest)
    print(f"\nlockctl history --job {latest}\n{history.stdout}")  # for docs/history.md
    assert history.returncode in (0, 1), history.stdout
    assert "succeeded (catch-up)" in history.stdout
    assert "Traceback" not in "\n".join(line for s in schedulers for line in s.lines)


def test_an_outage_of_every_replica_runs_each_missed_tick_once_with_catchup_all(lab: Lab) -> None:
    job = lab.jobs["all"]
    configs = [_config_of(lab, worker, "all") for worker in WORKERS]
    first = [SchedulerProcess(config) for config in configs]
    try:
        assert eventually(lambda: len(_finished(lab, "all")) >= 2, WAIT)
    finally:
        _stop_all(first)
    last = max(_records(lab, "all"))
    back_at = SCHEDULE.next_ticks(last + timedelta(seconds=EVERY * GAP), 1)[0]
    # the outage's ticks: their claim windows (cut at the next tick) closed before any replica
    # was back; the one just before back_at is left out (its window closes as they start)
    outage = [t for t in SCHEDULE.next_ticks(last, 64) if t < back_at - timedelta(seconds=EVERY)]
    assert len(outage) >= GAP - 1
    _at(back_at, 0.5)
    second = [SchedulerProcess(config) for config in configs]
    try:

        def caught_up() -> bool:
            records = _records(lab, "all")
            return all(t in records and records[t].catchup and records[t].finished for t in outage)

        assert eventually(caught_up, WAIT), (_records(lab, "all"), second[0].lines[-20:])
    finally:
        _stop_all(second)
    records = _records(lab, "all")
    for tick in outage:  # each ran once, as a catch-up, on one replica of three
        assert records[tick].outcome is TickOutcome.SUCCEEDED, tick_name(tick)
        assert len(_acquired(second, job, tick)) == 1, tick_name(tick)
        assert _logged(lab, "all").count(f"{tick_name(tick)} {records[tick].worker}") == 1
    # oldest first: in the order of the lock's index (one claim at a time, each a new index);
    # `claimed_at` is no order: each replica's comes from Consul's Date (whole seconds) plus
    # its own clock since, so two claims 10 ms apart on two replicas read in either order
    indexes = [records[t].lock_index or 0 for t in outage]
    assert indexes == sorted(indexes) and len(set(indexes)) == len(indexes), indexes
    assert not [t for t, r in records.items() if r.catchup and t <= last]
    history = _lockctl(lab, "history", "--job", job, "--since", "2m")
    print(f"\nlockctl history --job {job}\n{history.stdout}")  # for docs/schedules.md
    assert "Traceback" not in "\n".join(line for s in first + second for line in s.lines)


def _run(lab: Lab, worker: str, short: str = "run") -> subprocess.CompletedProcess[str]:
    argv = [*LOCKCTL, "run", "--config", str(lab.configs[worker]), "--job", lab.jobs[short]]
    return subprocess.run(
        [*argv, "--", *json.loads(_command(lab.logs[short]))],
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )


def _events(text: str, name: str) -> list[dict[str, Any]]:
    found = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    return [event for event in found if event["event"] == name]


def test_lockctl_run_catches_up_once_when_two_come_back_at_once(lab: Lab) -> None:
    tick = SCHEDULE.next_ticks(_now(), 1)[0]
    _at(tick)
    first = _run(lab, "worker-1")
    assert first.returncode == 0, first.stderr
    (ran,) = _events(first.stderr, "acquired")
    tick = _tick(ran["tick"])  # the tick it ran: a loaded machine may start it one tick late
    assert not _events(first.stderr, "catch-up")  # the tick before it was nobody's: no ledger
    back_at = tick + timedelta(seconds=EVERY * GAP)
    _at(back_at)
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda worker: _run(lab, worker), ("worker-2", "worker-3")))
    for run in runs:
        print(f"\nlockctl run: exit {run.returncode}\n{run.stderr}")  # for docs/runner.md
        assert run.returncode == 0, run.stderr
    # The tick they ran as usual is read from their events, not assumed: on a loaded machine
    # both may start past the next tick, and then that one is due and the one before it is
    # the newest nobody ran. Either way: one catch-up, of the tick just before the due one.
    # Both runs may look for it (a `catch-up` event each); the claim lets one run it.
    (caught_name,) = {e["tick"] for run in runs for e in _events(run.stderr, "catch-up")}
    acquired = [e["tick"] for run in runs for e in _events(run.stderr, "acquired")]
    assert len(acquired) == len(set(acquired)) == 2 and caught_name in acquired, acquired
    (due_name,) = [name for name in acquired if name != caught_name]
    due, previous = _tick(due_name), _tick(caught_name)
    for run in runs:  # a run that looked for the catch-up and did not run it says why
        if _events(run.stderr, "catch-up"):
            ticks = [e["tick"] for e in _events(run.stderr, "acquired")]
            skips = [e["tick"] for e in _events(run.stderr, "skipped")]
            assert caught_name in ticks or caught_name in skips, run.stderr
    assert due >= back_at and previous == due - timedelta(seconds=EVERY), acquired
    records = _records(lab, "run")
    assert records[previous].catchup is True
    assert records[previous].outcome is TickOutcome.SUCCEEDED
    assert records[due].outcome is TickOutcome.SUCCEEDED and not records[due].catchup
    logged = [line.split()[0] for line in _logged(lab, "run")]
    assert logged.count(caught_name) == 1 and logged.count(due_name) == 1
    # the ticks between the first run's and the caught one: nobody's, recorded missed
    steps = range(1, int((previous - tick).total_seconds()) // EVERY)
    older = [tick + timedelta(seconds=EVERY * n) for n in steps]
    assert len(older) >= GAP - 2
    assert eventually(lambda: all(t in _records(lab, "run") for t in older), WAIT)
    records = _records(lab, "run")
    assert all(records[t].outcome is TickOutcome.MISSED for t in older), records


def _tick(name: str) -> datetime:
    """A tick's datetime from its name in an event ("2026-12-07T18:53:10Z")."""
    return datetime.fromisoformat(name.replace("Z", "+00:00"))


def test_a_scheduler_catches_up_after_consul_was_unreachable(lab: Lab) -> None:
    """Consul out of reach of the only replica (its address points where nothing listens,
    reloaded with SIGHUP) for a few ticks, then back: the first tick after it runs, and then
    the newest tick the outage cost, once, as a catch-up; the older ones are missed."""
    job = lab.jobs["outage"]
    config = _config_of(lab, "worker-1", "outage")
    scheduler = SchedulerProcess(config)
    address = json.loads(config.read_text())["consul"]["address"]

    def reconfigure(to: str) -> None:
        raw = json.loads(config.read_text())
        raw["consul"]["address"] = to
        config.write_text(json.dumps(raw))
        scheduler.process.send_signal(signal.SIGHUP)

    def failed() -> list[str]:
        return [e["tick"] for e in scheduler.events("consul-unavailable") if e.get("tick")]

    try:
        # two runs of its own first (and its SIGHUP handler in place: SIGHUP before it ends it)
        assert eventually(lambda: len(scheduler.events("released")) >= 2, WAIT), scheduler.lines
        reconfigure(f"{address.split('://')[0]}://127.0.0.1:{free_port()}")  # nobody there
        assert eventually(lambda: len(failed()) >= 3, WAIT), (
            scheduler.process.poll(),
            scheduler.lines[-10:],
            {tick_name(t): r.outcome.value for t, r in _records(lab, "outage").items()},
        )
        reconfigure(address)
        assert eventually(lambda: scheduler.events("catch-up"), WAIT), scheduler.lines[-10:]
        caught_at = scheduler.events("catch-up")[0]["tick"]
        assert eventually(
            lambda: any(tick_name(t) == caught_at for t in _finished(lab, "outage")), WAIT
        )
        assert scheduler.stop() == 0
    finally:
        scheduler.kill()
    # the outage's ticks: after the last one run before it, before the first one run after it
    # (ticks a failing run spent retrying were skipped as overlap: the outage cost them too)
    records = _records(lab, "outage")
    before = max(t for t in records if tick_name(t) < failed()[0])
    first_back = min(t for t, r in records.items() if tick_name(t) > failed()[-1] and not r.catchup)
    gap = [t for t in SCHEDULE.next_ticks(before, 64) if t < first_back]
    caught = [tick for tick, record in records.items() if record.catchup]
    assert caught == [gap[-1]] and tick_name(gap[-1]) == caught_at, (caught, gap, failed())
    assert records[gap[-1]].outcome is TickOutcome.SUCCEEDED
    assert records[first_back].outcome is TickOutcome.SUCCEEDED
    (catchup,) = scheduler.events("catch-up")
    assert catchup["job"] == job
    # after the first tick that went through again, which ran as usual
    acquired = {e["tick"]: e["time"] for e in scheduler.events("acquired")}
    assert acquired[tick_name(first_back)] < acquired[caught_at]
    assert all(_shown(lab, job)[tick_name(t)] == "missed" for t in gap[:-1])
    logged = [line.split()[0] for line in _logged(lab, "outage")]
    assert logged.count(caught_at) == 1 and len(logged) == len(set(logged))
    assert "Traceback" not in "\n".join(scheduler.lines)
