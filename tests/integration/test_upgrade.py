"""A fleet upgrades one replica at a time: `lockctl schedule` replicas of the previous release
and of this checkout run the same `@every 2s` jobs on the real cluster, each replica on its own
worker with its worker's minted token, all with the worker configs the previous release wrote
(a worker keeps its config through an upgrade).

- Rolling: one previous replica beside two current ones until each job has a dozen ticks and
  each release won some; then one current replica is rolled back (stopped, the previous
  release started on its worker and config) and it goes on, two previous beside one current.
  Over the whole window every tick is recorded once and run once (the jobs' own oracle files),
  none is missed, every record's worker is the one that ran it; the sessions both releases
  make are alike, and so are the lock's value and the ledger's records they write; and
  `lockctl history --json` of either release reads the same ledger the same way.
- Control keys: a pause set by one release's `lockctl pause` is obeyed by the other's
  schedulers (each tick recorded `paused`, with the pause's reason, none run), resumed by the
  other's `lockctl resume`; a `lockctl trigger` of either release runs once in the mixed fleet.

Cost: the previous release is installed once per test session (session fixture): its wheel,
kept in tests/data, into a venv whose dependencies are this venv's (a .pth), with `pip install
--no-deps`: about 1.5 s here, printed, never asserted. The tests then take about 65 s (the
rolling one 50 s, the pause one 15 s), nearly all of it the ticks they wait for; each wait is
bounded, and no duration is asserted.
"""

from __future__ import annotations

import contextlib
import functools
import json
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest
from previous_release import CURRENT, Release, install_previous_release
from scheduler_lab import SchedulerProcess
from workers_lab import minted_workers, spec_text

from provision.consul import Consul
from provision.ledger.holder import RECORD_FIELDS
from provision.ledger.records import TickOutcome, TickRecord, tick_name, ticks_prefix
from provision.ledger.store import Ledger
from provision.schedule import parse_schedule
from provision.system.control_keys import control_prefix, paused_key, pauses_key, trigger_key
from tests.lockctl_process import eventually

if TYPE_CHECKING:
    from conftest import LiveCluster

WORKERS = ("worker-1", "worker-2", "worker-3")
EVERY = 2
SCHEDULE = parse_schedule(f"@every {EVERY}s")
ROLLING = ("alpha", "beta")  # the rolling test's jobs
# the pause test's jobs: which release pauses each (the other resumes it)
PAUSER = {"gamma": "previous", "delta": "current"}
TICKS = 12  # ticks per job and phase of the rolling test
WINS = 2  # ticks each release runs at least, per phase
PHASE_WAIT = 180.0  # a bound, not a speed: a phase takes ~25 s on a quiet machine
WAIT = 60.0
RELEASE_VARIABLE = "UPGRADE_LAB_RELEASE"  # the job writes which release ran it
SUCCEEDED = TickOutcome.SUCCEEDED


class Run(NamedTuple):
    """One line of a job's oracle file: a run of the job."""

    tick: str
    worker: str
    release: str


@dataclass
class Lab:
    cluster: LiveCluster
    tmp: Path
    spec_path: Path
    releases: dict[str, Release]
    configs: dict[str, Path]  # each worker's config, as the previous release wrote it
    jobs: dict[str, str]  # short name -> job name
    lock_keys: dict[str, str]
    oracles: dict[str, Path]  # short name -> the job's oracle file
    secrets: list[str] = field(default_factory=list, repr=False)  # never printed

    @functools.cached_property
    def consul(self) -> Consul:
        """One management client for the test's reads of its own keys (a pool, not one each)."""
        return self.cluster.management()

    def records(self, short: str) -> list[TickRecord]:
        return Ledger(self.consul, self.lock_keys[short]).records()

    def runs(self, short: str) -> list[Run]:
        oracle = self.oracles[short]
        lines = oracle.read_text().splitlines() if oracle.exists() else []
        return [Run(*line.split()) for line in lines]


@pytest.fixture(scope="session")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    began = time.monotonic()
    release = install_previous_release(tmp_path_factory.mktemp("previous-release"))
    print(f"\nthe previous release installed in {time.monotonic() - began:.1f} s")
    return release


@pytest.fixture(scope="module")
def lab(
    live_cluster: LiveCluster, previous_release: Release, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("upgrade")
    uid = uuid.uuid4().hex[:8]
    kv = f"test/upgrade-{uid}/"
    shorts = (*ROLLING, *PAUSER)
    jobs = {short: f"upgrade-{short}-{uid}" for short in shorts}
    oracles = {short: tmp / f"{short}.runs" for short in shorts}
    attributes = {jobs[s]: _job_attributes(f"{kv}{s}/", oracles[s]) for s in shorts}
    spec_path = tmp / "locks.hcl"
    spec_path.write_text(spec_text(live_cluster, WORKERS, attributes))
    with minted_workers(live_cluster, spec_path, WORKERS, tmp, uid, kv) as made:
        releases = {"previous": previous_release, "current": CURRENT}
        lock_keys = {short: f"{kv}{short}/.lock" for short in shorts}
        lab = Lab(live_cluster, tmp, spec_path, releases, {}, jobs, lock_keys, oracles)
        lab.secrets = made.secrets
        lab.configs = _previous_configs(lab)
        try:
            yield lab
        finally:
            for job in jobs.values():
                live_cluster.management().kv.delete(control_prefix(job), recurse=True)


def test_both_releases_write_the_same_worker_config(lab: Lab) -> None:
    """A worker keeps its config through an upgrade, and a rollback may meet a config this
    release wrote: the previous release's `worker-config` and this one's write the same file
    from the same spec (should they differ, a rollback needs a test of its own, and a line in
    docs/operations.md)."""
    for worker in WORKERS:
        ours = json.loads((lab.tmp / "workers" / worker / "lockctl.json").read_text())
        assert json.loads(lab.configs[worker].read_text()) == ours, worker


def _job_attributes(prefix: str, oracle: Path) -> dict[str, str]:
    # the lock is held while the job runs, and its value is cleared by the release: the job
    # lasts long enough for the test's reads to see that value
    line = f'echo "$LOCKCTL_TICK $LOCKCTL_WORKER ${RELEASE_VARIABLE}" >> {oracle}; sleep 0.4'
    return {
        "prefix": json.dumps(prefix),
        "schedule": json.dumps(f"@every {EVERY}s"),
        "command": json.dumps(["/bin/sh", "-c", line]),
        "history_limit": "500",  # the whole window stays in the ledger
    }


def _previous_configs(lab: Lab) -> dict[str, Path]:
    """Every worker's config as the previous release's `worker-config` writes it (the tokens
    minted_workers made are in tmp/secrets)."""
    out = lab.tmp / "previous-workers"
    args = ["worker-config", "--spec", str(lab.spec_path), "--out", str(out), "--all"]
    args += ["--secrets-dir", str(lab.tmp / "secrets"), "--lockctl", "lockctl"]
    if lab.cluster.layout.tls:
        args += ["--tls-dir", str(lab.cluster.layout.tls_dir)]
    done = lockctl(lab, lab.releases["previous"], *args)
    assert done.returncode == 0, done.stderr
    return {worker: out / worker / "lockctl.json" for worker in WORKERS}


def lockctl(lab: Lab, release: Release, *args: str) -> subprocess.CompletedProcess[str]:
    """`lockctl ARGS` of `release`; to every command but worker-config, the spec, the server's
    address and the management token are added. No secret and no traceback may show in its
    output."""
    flags = []
    if args[0] != "worker-config":
        flags = ["--spec", str(lab.spec_path), "--address", lab.cluster.address("server-1")]
        flags += ["--token-file", str(lab.cluster.layout.management_token_file)]
        flags += lab.cluster.tls_flags()
    result = subprocess.run(
        [*release.program, *args, *flags],
        capture_output=True,
        text=True,
        timeout=60,
        env=release.environment(),
        check=False,
    )
    shown = result.stdout + result.stderr
    secrets = [*lab.secrets, lab.cluster.management_token.reveal()]
    assert not any(secret in shown for secret in secrets)
    assert "Traceback" not in result.stderr, result.stderr
    return result


class Replica(SchedulerProcess):
    """`lockctl schedule` of one release on one worker, for some of the lab's jobs."""

    def __init__(self, lab: Lab, release: str, worker: str, shorts: Iterable[str]) -> None:
        self.release, self.worker = release, worker
        config = _config_for(lab, worker, shorts)
        chosen = lab.releases[release]
        env = chosen.environment({RELEASE_VARIABLE: release})
        super().__init__(config, env=env, program=chosen.program)

    def session(self) -> str:
        """Its newest session (all its jobs share one: their timings are the same)."""
        created = self.events("session-created")
        assert created, (self.release, self.worker, self.lines)
        return str(created[-1]["session"])


def _config_for(lab: Lab, worker: str, shorts: Iterable[str]) -> Path:
    """The worker's config with only these jobs; one file per worker and set of jobs, so a
    rolled-back replica takes over its worker's config as an upgraded host would."""
    raw = json.loads(lab.configs[worker].read_text())
    names = [lab.jobs[short] for short in shorts]
    raw["jobs"] = {name: raw["jobs"][name] for name in names}
    path = lab.tmp / f"{worker}-{'-'.join(shorts)}.json"
    path.write_text(json.dumps(raw))
    return path


@contextlib.contextmanager
def fleet(lab: Lab, layout: dict[str, str], shorts: Iterable[str]) -> Iterator[dict[str, Replica]]:
    """A replica per worker of the release `layout` names; each killed by its PID at the end
    (after the test stopped it, or when it failed)."""
    replicas = {w: Replica(lab, release, w, shorts) for w, release in layout.items()}
    everyone = list(replicas.values())
    try:
        yield replicas
    finally:
        for replica in everyone:
            replica.kill()


class LockValues:
    """The lock key's values seen while the replicas run: the holder's record each release's
    scheduler writes when it claims a tick, told apart by the scheduler's pid in it (the
    release empties the value: only a held lock has one)."""

    def __init__(self, lab: Lab, short: str) -> None:
        self.lab, self.key = lab, lab.lock_keys[short]
        self.by_release: dict[str, set[frozenset[str]]] = {}
        self.pids: dict[int, str] = {}

    def look(self, replicas: Iterable[Replica]) -> None:
        self.pids |= {r.process.pid: r.release for r in replicas}
        entry, _ = self.lab.consul.kv.get(self.key)
        if entry is None or not entry.value:
            return
        value = json.loads(entry.value)
        release = self.pids.get(value.get("pid"), "unknown")
        self.by_release.setdefault(release, set()).add(frozenset(value))


def _phase_done(
    lab: Lab, since: datetime, locks: list[LockValues], replicas: list[Replica]
) -> bool:
    """Each rolling job has TICKS finished ticks from `since` on, and each release ran WINS."""
    for lock in locks:
        lock.look(replicas)
    for short in ROLLING:
        finished = [r for r in lab.records(short) if r.tick >= since and r.finished]
        if len(finished) < TICKS:
            return False
    runs = [run for short in ROLLING for run in lab.runs(short) if _tick(run.tick) >= since]
    wins = Counter(run.release for run in runs)
    seen = all(set(lock.by_release) >= set(lab.releases) for lock in locks)
    return seen and all(wins[release] >= WINS for release in lab.releases)


def _tick(name: str) -> datetime:
    return datetime.fromisoformat(name.replace("Z", "+00:00"))


def _session_terms(lab: Lab, replicas: Iterable[Replica]) -> dict[str, set[tuple[Any, ...]]]:
    """Per release, the terms of its replicas' live sessions, their worker's name taken out
    (it is in the name and is the node): TTL, LockDelay, behavior, health checks."""
    terms: dict[str, set[tuple[Any, ...]]] = {}
    for replica in replicas:
        session = lab.consul.session.info(replica.session())
        assert session is not None, (replica.release, replica.worker, replica.lines)
        assert session.node == replica.worker
        name = session.name.replace(replica.worker, "<worker>")
        seen = (name, session.ttl, session.lock_delay_ns, session.behavior, session.checks)
        terms.setdefault(replica.release, set()).add(seen)
    return terms


def _record_fields(lab: Lab, short: str) -> dict[str, set[frozenset[str]]]:
    """Per release, the field names of the succeeded records it wrote (the raw JSON in
    Consul), told apart by the oracle's line for the tick."""
    ran = {run.tick: run.release for run in lab.runs(short)}
    prefix = ticks_prefix(lab.lock_keys[short])
    fields: dict[str, set[frozenset[str]]] = {}
    for entry in lab.consul.kv.tree(prefix):
        raw = json.loads(entry.value or b"{}")
        release = ran.get(entry.key.removeprefix(prefix))
        if release is not None and raw.get("outcome") == TickOutcome.SUCCEEDED.value:
            fields.setdefault(release, set()).add(frozenset(raw))
    return fields


def stop(lab: Lab, replicas: Iterable[Replica]) -> None:
    """SIGTERM, by PID: each exits 0, with no traceback and no secret in what it said."""
    secrets = [*lab.secrets, lab.cluster.management_token.reveal()]
    for replica in replicas:
        code = replica.stop(signal.SIGTERM)
        said = "\n".join(replica.lines)
        assert code == 0, (replica.release, replica.worker, said)
        assert "Traceback" not in said and not any(secret in said for secret in secrets)


def check_window(lab: Lab, short: str, stopped: set[str]) -> list[TickRecord]:
    """The job's ledger against its oracle, from its first record to its last: every scheduled
    tick recorded once; a succeeded one run once, by the worker its record names; a paused one
    not run; an interrupted one (a replica stopped while it ran: `stopped` names the workers)
    run at most once; a manual run (lockctl trigger) run once. The records, oldest first."""
    records = lab.records(short)
    runs = lab.runs(short)
    twice = [tick for tick, count in Counter(run.tick for run in runs).items() if count > 1]
    assert not twice, (short, twice, runs)  # no tick run twice
    by_tick = {run.tick: run for run in runs}
    scheduled = [r.tick for r in records if not r.tick.microsecond]
    expected = SCHEDULE.next_ticks(scheduled[0] - timedelta(seconds=1), 10_000)
    expected = [tick for tick in expected if tick <= scheduled[-1]]
    missing = [tick_name(tick) for tick in expected if tick not in set(scheduled)]
    assert not missing, (short, missing)  # none missing over the window
    for record in records:
        run = by_tick.pop(tick_name(record.tick), None)
        _check_record(record, run, stopped)
    assert not by_tick, (short, "runs without a record", by_tick)
    return records


def _check_record(record: TickRecord, run: Run | None, stopped: set[str]) -> None:
    ran_by = None if run is None else run.worker
    if record.outcome is TickOutcome.SUCCEEDED:
        assert ran_by == record.worker, (record, run)
    elif record.outcome is TickOutcome.PAUSED:
        assert run is None, (record, run)
    elif record.outcome is TickOutcome.INTERRUPTED:
        assert record.worker in stopped and ran_by in (None, record.worker), (record, run)
    else:
        raise AssertionError(f"{record.outcome.value}: {record} (run: {run})")


def compare_histories(lab: Lab, shorts: Iterable[str]) -> dict[str, Any]:
    """`lockctl history --json` of each release for these jobs: the records they read (their
    `recorded` ticks: the unrecorded ones depend on the moment asked) are the same. One
    release's answer, by job."""
    read: dict[str, dict[str, Any]] = {}
    for name, release in lab.releases.items():
        for short in shorts:
            args = ["history", "--job", lab.jobs[short], "--json", "--limit", "500"]
            done = lockctl(lab, release, *args)
            assert done.returncode == 0, (name, done.stderr)
            (job,) = json.loads(done.stdout)
            recorded = [tick for tick in job["ticks"] if tick["recorded"]]
            read.setdefault(name, {})[short] = recorded
    assert read["previous"] == read["current"]
    for short in shorts:
        ledger = {tick_name(r.tick) for r in lab.records(short)}
        assert {tick["tick"] for tick in read["current"][short]} == ledger
    return read["current"]


def test_previous_and_current_replicas_share_the_ticks_of_a_rolling_fleet(lab: Lab) -> None:
    locks = [LockValues(lab, short) for short in ROLLING]
    phases: dict[str, dict[str, str]] = {}
    layout = {"worker-1": "previous", "worker-2": "current", "worker-3": "current"}
    with fleet(lab, layout, ROLLING) as replicas:
        began = datetime.now(timezone.utc)
        live = list(replicas.values())
        assert eventually(lambda: _phase_done(lab, began, locks, live), PHASE_WAIT), _state(lab)
        terms_one = _session_terms(lab, live)
        phases["one previous, two current"] = dict(layout)

        # worker-2 rolled back: the current replica stops, the previous one takes its config
        stop(lab, [replicas["worker-2"]])
        print(f"\nworker-2's current replica stopped at {datetime.now(timezone.utc)}")
        layout["worker-2"] = "previous"
        replicas["worker-2"] = Replica(lab, "previous", "worker-2", ROLLING)
        rolled = datetime.now(timezone.utc)
        live = list(replicas.values())
        assert eventually(lambda: _phase_done(lab, rolled, locks, live), PHASE_WAIT), _state(lab)
        terms_two = _session_terms(lab, live)
        phases["two previous, one current"] = dict(layout)
        stop(lab, live)

    for short in ROLLING:
        records = check_window(lab, short, stopped=set(WORKERS))
        print(f"\n{short}: {len(records)} ticks", Counter(r.worker for r in records))
    wins = Counter(run.release for short in ROLLING for run in lab.runs(short))
    print(f"runs by release: {dict(wins)}; phases: {phases}")
    # both releases make their sessions alike, and write the same lock value and records
    for terms in (terms_one, terms_two):
        assert set(terms) == {"previous", "current"}, terms
        assert terms["previous"] == terms["current"], terms
    for lock in locks:
        assert set(lock.by_release) >= {"previous", "current"}, lock.by_release
        assert lock.by_release["previous"] == lock.by_release["current"], lock.by_release
        assert lock.by_release["current"] == {frozenset(RECORD_FIELDS)}, lock.by_release
    for short in ROLLING:
        fields = _record_fields(lab, short)
        assert set(fields) == {"previous", "current"} and len(fields["current"]) == 1, fields
        assert fields["previous"] == fields["current"], fields
    compare_histories(lab, ROLLING)
    _show(lab, "alpha")


def _show(lab: Lab, short: str) -> None:
    """What a user sees, for the docs: the job's history by each release's CLI, and which
    release ran each of its ticks (the oracle)."""
    job = lab.jobs[short]
    for name, release in lab.releases.items():
        shown = lockctl(lab, release, "history", "--job", job, "--limit", "16")
        print(f"\n$ lockctl history --job {job} --limit 16   # {name}\n{shown.stdout}")
    print("\n".join(" ".join(run) for run in lab.runs(short)))


def _state(lab: Lab) -> dict[str, Any]:
    """What a failed wait shows: each job's outcomes and runs by release."""
    return {
        short: (
            Counter(r.outcome.value for r in lab.records(short)),
            Counter((run.worker, run.release) for run in lab.runs(short)),
        )
        for short in lab.jobs
    }


def test_a_pause_set_by_either_release_is_obeyed_by_the_other(lab: Lab) -> None:
    other = {"previous": "current", "current": "previous"}
    reasons = {short: f"paused by the {pauser} release" for short, pauser in PAUSER.items()}
    layout = {"worker-1": "previous", "worker-2": "current", "worker-3": "previous"}
    with fleet(lab, layout, PAUSER) as replicas:
        began = datetime.now(timezone.utc)
        assert eventually(lambda: _all_succeeded(lab, began, 2), WAIT), _state(lab)
        for short, pauser in PAUSER.items():
            args = ["pause", lab.jobs[short], "--reason", reasons[short]]
            paused = lockctl(lab, lab.releases[pauser], *args)
            assert paused.stdout.startswith(f"job {lab.jobs[short]} paused by "), paused.stderr
        assert_alike_notes(lab, paused_key)  # each written by another release's CLI
        obeyed = {short: other[pauser] for short, pauser in PAUSER.items()}
        assert eventually(lambda: _obeyed(lab, layout, obeyed), PHASE_WAIT), _state(lab)

        for short, pauser in PAUSER.items():  # resumed by the other release
            resumed = lockctl(lab, lab.releases[other[pauser]], "resume", lab.jobs[short])
            assert resumed.stdout == f"job {lab.jobs[short]} resumed\n", resumed.stderr
        assert_alike_notes(lab, pauses_key)
        assert eventually(lambda: _ran_after_pause(lab), WAIT), _state(lab)
        triggers = {}
        for short, pauser in PAUSER.items():  # a manual run asked by either release
            asked = lockctl(lab, lab.releases[pauser], "trigger", lab.jobs[short])
            assert asked.returncode == 0, asked.stderr
            triggers[short] = asked.stdout.split("(trigger ", 1)[1].split(")", 1)[0]
        assert eventually(lambda: _triggered(lab, triggers), WAIT), _state(lab)
        assert_alike_notes(lab, trigger_key)
        stop(lab, replicas.values())

    for short in PAUSER:
        records = check_window(lab, short, stopped=set(WORKERS))
        paused = [r for r in records if r.outcome is TickOutcome.PAUSED]
        between = [r for r in records if paused[0].tick <= r.tick <= paused[-1].tick]
        assert {r.outcome for r in between} == {TickOutcome.PAUSED}, between  # none ran
        assert {r.reason for r in paused} == {reasons[short]} and all(r.by for r in paused)
        (manual,) = [r for r in records if r.trigger == triggers[short]]
        assert manual.outcome is TickOutcome.SUCCEEDED, manual
        print(f"{short}: paused by {PAUSER[short]}, recorded paused by", _workers(paused))
    compare_histories(lab, PAUSER)


def assert_alike_notes(lab: Lab, key_of: Callable[[str], str]) -> None:
    """The control key `key_of(job)` of the pause test's two jobs, each written by another
    release's CLI, holds JSON of the same shape (the same fields, of the same types)."""
    shapes = {}
    for short, pauser in PAUSER.items():
        entry, _ = lab.consul.kv.get(key_of(lab.jobs[short]))
        assert entry is not None and entry.value, (short, key_of(lab.jobs[short]))
        shapes[pauser] = _shape(json.loads(entry.value))
    assert shapes["previous"] == shapes["current"], (key_of("JOB"), shapes)


def _shape(value: Any) -> Any:
    """A JSON value's fields and their types, without the values."""
    if isinstance(value, dict):
        return {name: _shape(item) for name, item in value.items()}
    if isinstance(value, list):
        return [_shape(item) for item in value]
    return type(value).__name__


def _all_succeeded(lab: Lab, since: datetime, count: int) -> bool:
    return all(
        len([r for r in lab.records(s) if r.tick >= since and r.outcome is SUCCEEDED]) >= count
        for s in PAUSER
    )


def _obeyed(lab: Lab, layout: dict[str, str], obeyed: dict[str, str]) -> bool:
    """Each paused job has 3 ticks recorded paused, one of them by a replica of the release
    that did not pause it."""
    for short, release in obeyed.items():
        paused = [r for r in lab.records(short) if r.outcome is TickOutcome.PAUSED]
        by_release = {layout.get(r.worker or "") for r in paused}
        if len(paused) < 3 or release not in by_release:
            return False
    return True


def _ran_after_pause(lab: Lab) -> bool:
    for short in PAUSER:
        records = lab.records(short)
        last = max(r.tick for r in records if r.outcome is TickOutcome.PAUSED)
        if not any(r.tick > last and r.outcome is TickOutcome.SUCCEEDED for r in records):
            return False
    return True


def _triggered(lab: Lab, triggers: dict[str, str]) -> bool:
    return all(
        any(r.trigger == trigger and r.finished for r in lab.records(short))
        for short, trigger in triggers.items()
    )


def _workers(records: Iterable[TickRecord]) -> dict[str, int]:
    return dict(Counter(r.worker or "-" for r in records))
