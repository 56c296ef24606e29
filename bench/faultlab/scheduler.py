"""Fault scenarios for `lockctl schedule`, on the same namespace cluster and oracle as the
runner's (bench/faultlab/harness.py), shared by tests/faults/test_scheduler_faults.py and
`bench/faults.py --tools scheduler`.

Three schedulers, one per worker, each in its worker's namespace, run two jobs on `@every 5s`:
a short one (1 s, well inside its interval) and a long one (8 s: it outlasts its interval, so
the tick after each run waits for that run's end while its claim window is open, and the tick
after that passes whole meanwhile: skipped, and recorded missed). Both jobs are
the oracle's process tree (bench/faultlab/job.py), which now also tells the oracle its tick
(LOCKCTL_TICK). One fault per scenario hits the scheduler whose long job is running, 1.5 s into
it:

    kill9-runner   SIGKILL of that `lockctl schedule` (the scheduler is the runner here)
    sigstop        SIGSTOP of it and its jobs until another replica runs the job (at least
                   2 x TTL + LockDelay + 3 s), then SIGCONT, the job first
    cut-host       its host cut off until the takeover, then healed
    kill-leader    the raft leader SIGKILLed, then restarted
    restart-agent  its client agent stopped (a graceful leave) and started again

Then every scheduler gets SIGTERM, and the checks: the oracle's (no overlap, the fence rejected
the resumed stale job in `sigstop`, no process of a job outlives its bound) and the ledger's, per
tick (bench/faultlab/ticks.py: run at most once, run or recorded missed, missed only inside the
takeover bound around the fault or during the long job's own overlap).

`run_soak` is the issue's "done means": the short job alone for a few minutes, with a SIGTERM
hand-over (the very next tick runs on another replica) and a kill -9 of the active scheduler
(the ticks it loses are recorded missed, all inside the takeover bound), each replica restarted.
Everything started here is stopped by PID.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from bench.faultlab import harness, survivors
from bench.faultlab.harness import (
    FAULT_AFTER,
    JOB_SCRIPT,
    KILL9_SURVIVOR_BOUND,
    LOCKCTL_TIMINGS,
    POLL,
    REPO,
    FaultLab,
    RunResult,
    descendants,
    lock_key,
)
from bench.faultlab.oracle import Holder
from bench.faultlab.ticks import RAN, Excuse, TickVerdict, judge_ticks
from provision.cluster import netns as ns
from provision.consul.errors import ConsulError
from provision.ledger.records import TickRecord
from provision.ledger.store import Ledger
from provision.outcomes import Outcome
from provision.schedule import parse_schedule
from provision.system.deadline import Deadline, attempts
from provision.system.processes import terminate

TOOL = "scheduler"
SCENARIOS = ("kill9-runner", "sigstop", "cut-host", "kill-leader", "restart-agent")
EVERY = 5
SCHEDULE = parse_schedule(f"@every {EVERY}s")
SHORT, LONG = 1.0, 8.0  # seconds each job works
FLEET_WORK = 0.5  # seconds each of the `fleet` jobs works
TIMINGS = LOCKCTL_TIMINGS  # TTL 10 s, LockDelay 5 s, renew 2 s, kill grace 1 s: as for `run`
# From a fault to the next run of the job: the lock free (2 x TTL + LockDelay), the next tick
# (one interval), and slack for a loaded machine. The ticks in between are the ones it may miss.
TAKEOVER_BOUND = TIMINGS.expiry_bound + EVERY + 5.0
STARTUP_SLACK = 2.0  # seconds of a tick's claim window a scheduler needs to try it at its start
SETTLE = 45.0  # seconds after the takeover for the ledger to decide every tick before it
STOP_GRACE = 20.0


@dataclass
class SchedulerResult(RunResult):
    """A scheduler fault's checks: the runner's, and each tick's."""

    verdicts: list[TickVerdict] = field(default_factory=list)
    handover: str | None = None  # soak: the tick after the SIGTERM, and who ran it
    handover_ok: bool = True

    @property
    def missed(self) -> int:
        return sum(v.missed for v in self.verdicts)

    @property
    def ran(self) -> int:
        return sum(v.ran for v in self.verdicts)

    @property
    def twice(self) -> int:
        return sum(len(v.twice) for v in self.verdicts)

    def describe(self) -> str:
        """One line: what the fault cost, per job."""
        took = "-" if self.takeover is None else f"{self.takeover:.1f} s"
        named = [v for v in self.verdicts if _short_name(v.job) != "fleet"]
        fleet = [v for v in self.verdicts if _short_name(v.job) == "fleet"]
        jobs = "; ".join(
            f"{_short_name(v.job)}: {v.checked} ticks, {v.ran} ran, {v.missed} missed "
            f"({v.missed_by_overlap} by overlap) {' '.join(v.missed_ticks[:8])}"
            for v in named
        )
        if fleet:
            jobs += (
                f"; {len(fleet)} fleet jobs: {sum(v.checked for v in fleet)} ticks, "
                f"{sum(v.ran for v in fleet)} ran, {sum(v.missed for v in fleet)} missed"
            )
        return (
            f"{self.scenario} on {self.holder}: next run {took} after the fault, "
            f"{self.rejections} stale writes refused; {jobs}"
            + (f"; hand-over: {self.handover}" if self.handover else "")
        )

    def problems(self) -> list[str]:
        found = super().problems()
        for verdict in self.verdicts:
            found += verdict.problems()
        if self.scenario == "sigstop" and self.rejections < 1:
            found.append("the resumed stale job was never rejected: the fence was not exercised")
        if not self.handover_ok:
            found.append(f"SIGTERM hand-over: {self.handover}")
        return found


def _short_name(job: str) -> str:
    if "-fleet-" in job:
        return "fleet"
    last = job.rsplit("-", 1)[-1]
    return last if last in ("short", "long") else "job"


class SchedulerFleet:
    """One `lockctl schedule` per worker, in its worker's namespace, with its pidfile and log."""

    def __init__(self, lab: FaultLab, jobs: dict[str, float], folder: Path) -> None:
        self.lab, self.jobs, self.folder = lab, jobs, folder
        self.workers = [a.name for a in lab.cluster.workers]
        self.configs = {w: self._write_config(w) for w in self.workers}
        self.current: dict[str, subprocess.Popen[bytes]] = {}
        self.started: list[tuple[str, subprocess.Popen[bytes]]] = []

    def _write_config(self, worker: str) -> Path:
        t = TIMINGS
        jobs = {
            job: {
                "lock_key": lock_key(job),
                "ttl": f"{t.ttl:g}s",
                "lock_delay": f"{t.lock_delay:g}s",
                "renew_interval": f"{t.renew:g}s",
                "kill_grace": f"{t.kill_grace:g}s",
                "min_hold": None,
                "schedule": SCHEDULE.text,
                "start_deadline": f"{EVERY}s",
                "history_limit": 200,
                "command": self._job_argv(job, worker, seconds),
            }
            for job, seconds in self.jobs.items()
        }
        config = {
            "format": 1,
            "worker": worker,
            "consul": self.lab.consul_of(worker),
            "jobs": jobs,
        }
        path = self.folder / f"{worker}.json"
        path.write_text(json.dumps(config, indent=2))
        return path

    def _job_argv(self, job: str, worker: str, seconds: float) -> list[str]:
        oracle = str(self.lab.oracle.path)
        return [
            sys.executable,
            str(JOB_SCRIPT),
            oracle,
            job,
            worker,
            f"{seconds:g}",
            self.lab.marker,
        ]

    def start(self, worker: str) -> int:
        argv = [
            sys.executable,
            "-m",
            "provision",
            "schedule",
            "--config",
            str(self.configs[worker]),
        ]
        netns = self.lab.agent(worker).netns
        assert netns is not None
        count = sum(1 for w, _ in self.started if w == worker) + 1
        with open(self.folder / f"{worker}-{count}.log", "wb") as log:
            process = subprocess.Popen(
                ns.exec_argv(netns, argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=REPO,
                start_new_session=True,
            )
        (self.folder / f"{worker}.pid").write_text(f"{process.pid}\n")
        self.current[worker] = process
        self.started.append((worker, process))
        return process.pid

    def start_all(self) -> None:
        for worker in self.workers:
            self.start(worker)

    def pid(self, worker: str) -> int:
        return self.current[worker].pid

    def signal(self, worker: str, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.current[worker].send_signal(signum)

    def wait(self, worker: str, timeout: float) -> int | None:
        try:
            return self.current[worker].wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop_all(self, grace: float = STOP_GRACE) -> dict[str, list[int]]:
        """SIGTERM every live scheduler (each hands over and exits 0), SIGKILL after `grace`;
        every scheduler's exit status, by worker."""
        live = {p.pid: p for _, p in self.started if p.poll() is None}
        terminate(list(live), lambda pid: live[pid].poll() is None, grace, wake=True)
        for process in live.values():
            process.wait()
        exits: dict[str, list[int]] = {w: [] for w in self.workers}
        for worker, process in self.started:
            exits[worker].append(process.returncode)
        return exits


def run_scenario(lab: FaultLab, scenario: str, number: int = 1, fleet: int = 0) -> SchedulerResult:
    """One fault of `scenario` against three schedulers; the result carries every check.
    `fleet`: that many more jobs in every scheduler (short ones, `fleet-NN`), checked alike:
    a fault then hits a replica that holds many jobs' locks under one session."""
    base = f"sch-{scenario}-{number}-{uuid.uuid4().hex[:6]}"
    jobs = {f"{base}-short": SHORT, f"{base}-long": LONG}
    jobs |= {f"{base}-fleet-{i:02d}": FLEET_WORK for i in range(fleet)}
    target = f"{base}-long"
    folder = lab.root / "runs" / base
    folder.mkdir(parents=True)
    result = SchedulerResult(scenario, TOOL, target, bound=TAKEOVER_BOUND)
    result.late_kills_checked = scenario != "sigstop"
    fleet = SchedulerFleet(lab, jobs, folder)
    found: dict[int, str] = {}
    excuses: list[Excuse] = []
    try:
        fleet.start_all()
        holder = _wait_for_holder(lab, target, 3 * EVERY + 15.0)
        time.sleep(max(0.0, holder.entered + FAULT_AFTER - time.monotonic()))
        holder = harness._now(lab, target, holder)
        result.holder = holder.worker
        session = _lock_session(lab, target)
        fault_at = datetime.now(timezone.utc)
        found = _inject(lab, fleet, scenario, holder, session, result)
        excuses.append(_excuse(fault_at, scenario))
        excuses += _startup_excuse(folder)
        _settle(lab, list(jobs), fault_at + timedelta(seconds=result.takeover or 0.0))
        _settle_a_skip(lab, target)
    finally:
        result.runner_exits = fleet.stop_all()
        for job in jobs:
            found = harness._run_survivors(lab, job, TIMINGS.survivor_bound) | found
        survivors.kill(found, lab.marker)
    result.survivors = len(found)
    result.survivors_seen = [f"{pid} {how}" for pid, how in sorted(found.items())]
    _check(lab, list(jobs), result, excuses)
    return result


def _excuse(fault_at: datetime, what: str) -> Excuse:
    """The ticks a fault at `fault_at` may cost: from the one before it to the takeover bound."""
    start = fault_at - timedelta(seconds=EVERY)
    return Excuse(start, fault_at + timedelta(seconds=TAKEOVER_BOUND), what)


def _startup_excuse(folder: Path) -> list[Excuse]:
    """The ticks whose claim window had less than STARTUP_SLACK left when the last scheduler
    said `started` (the current tick is tried at start: with 50 jobs it can close first)."""
    started = []
    for log in folder.glob("*-1.log"):
        for line in log.read_text(errors="replace").splitlines():
            if '"event":"started"' in line:
                started.append(datetime.fromisoformat(json.loads(line)["time"]))
                break
    if not started:
        return []
    until = max(started) + timedelta(seconds=STARTUP_SLACK - EVERY)
    return [Excuse(datetime.min.replace(tzinfo=timezone.utc), until, "start-up")]


def _wait_for_holder(lab: FaultLab, job: str, timeout: float) -> Holder:
    """A holder of `job` that entered the oracle less than FAULT_AFTER ago."""
    for _ in attempts(Deadline(timeout), POLL):
        holder = lab.oracle.open_holder(job)
        if holder is not None and time.monotonic() - holder.entered < FAULT_AFTER:
            return holder
    raise AssertionError(f"{job}: no scheduler ran it in time")


def _wait_for_next(
    lab: FaultLab, job: str, after: Holder, since: float, timeout: float
) -> float | None:
    """Seconds from `since` to the first holder of `job` after `after` (any replica)."""
    for _ in attempts(Deadline(timeout), POLL):
        newer = [h for h in lab.oracle.holders(job) if h.entered > after.entered]
        if newer:
            return newer[0].entered - since
    return None


def _lock_session(lab: FaultLab, job: str) -> str | None:
    with lab.driver():
        entry, _ = lab.management().kv.get(lock_key(job), consistency="consistent")
    return entry.session if entry is not None else None


def _inject(
    lab: FaultLab,
    fleet: SchedulerFleet,
    scenario: str,
    holder: Holder,
    session: str | None,
    result: SchedulerResult,
) -> dict[int, str]:
    """The fault, and the wait for the job's next run; the holder's survivors of a kill -9."""
    pid = fleet.pid(holder.worker)
    limit = result.bound + 10.0
    found: dict[int, str] = {}
    at = lab.oracle.mark(f"scheduler {scenario}")
    if scenario == "kill9-runner":
        fleet.signal(holder.worker, signal.SIGKILL)
        found = _tree_survivors(lab, holder.worker, KILL9_SURVIVOR_BOUND, "after the kill -9")
        result.takeover = _wait_for_next(lab, result.job, holder, at, limit)
    elif scenario == "sigstop":
        paused = [pid, *descendants(pid)]
        harness._signal(paused, signal.SIGSTOP)
        # Paused until another replica runs the job, so the resumed job meets a newer LockIndex.
        result.takeover = _wait_for_next(lab, result.job, holder, at, limit)
        time.sleep(max(0.0, at + TIMINGS.expiry_bound + 3.0 - time.monotonic()))
        time.sleep(1.0)
        harness._signal(holder.pids, signal.SIGCONT)  # the job first: it writes at once
        time.sleep(0.3)
        harness._signal(paused, signal.SIGCONT)
        time.sleep(2.0)  # the stale scheduler fences its job
    elif scenario == "cut-host":
        host = lab.cluster.host(lab.agent(holder.worker))
        prefix = lab.cluster.netns_prefix
        assert prefix is not None
        ns.cut(prefix, host)
        try:
            invalidated = harness._watch_invalidation(lab, session, at, limit)
            result.takeover = _wait_for_next(lab, result.job, holder, at, limit)
            time.sleep(2.0)
        finally:
            ns.heal(prefix, host)
        if invalidated is not None:
            result.detection = invalidated - at
            # the lock free after LockDelay, then the next tick: at most one interval
            result.detection_bound = result.detection + TIMINGS.lock_delay + EVERY + 2.0
        lab.wait_healthy()
    elif scenario == "kill-leader":
        leader = lab.leader()
        result.notes.append(f"leader {leader.name}")
        lab.stop_agent(leader, hard=True)
        time.sleep(TIMINGS.lock_delay)
        lab.recover()
        result.takeover = _wait_for_next(lab, result.job, holder, at, limit)
    elif scenario == "restart-agent":
        lab.stop_agent(lab.agent(holder.worker), hard=False)
        lab.recover()
        result.takeover = _wait_for_next(lab, result.job, holder, at, limit)
    else:
        raise ValueError(f"unknown scheduler scenario {scenario!r}")
    return found


def _tree_survivors(lab: FaultLab, worker: str, bound: float, when: str) -> dict[int, str]:
    """Every member of `worker`'s live holders (any job) still alive `bound` s from now."""
    found: dict[int, str] = {}
    for section in list(lab.oracle.sections):
        if section.worker == worker and section.closed is None:
            left = survivors.wait_gone(lab.marker, bound, job=section.job, pids=[section.pid])
            for pid in left:
                found[pid] = f"{section.role}: {worker}'s job {section.job}, {bound:g} s {when}"
    return found


def _settle(lab: FaultLab, jobs: list[str], takeover_at: datetime) -> None:
    """Wait until each job ran a tick after the takeover and its ledger decided the ticks before
    that tick (missed ticks are recorded by the run after their window closed)."""
    for _ in attempts(Deadline(SETTLE), 1.0):
        if all(_decided(lab, job, takeover_at) for job in jobs):
            return


def _settle_a_skip(lab: FaultLab, job: str) -> None:
    """Wait until the long job has a tick recorded missed before one of its runs (what the
    judge counts). A fault need not cost a tick (a quick takeover, or a run ended by its fence
    early), and its own overlap skips one tick in three: the tick after a run waits for its end
    while its window is open, and the one after that passes whole during the late run."""
    for _ in attempts(Deadline(SETTLE), 1.0):
        records = _records(lab, job)
        missed = [r.tick for r in records if r.outcome is Outcome.MISSED]
        ran = [r.tick for r in records if r.finished_at is not None and r.outcome in RAN]
        if missed and ran and min(missed) < max(ran):
            return


def _decided(lab: FaultLab, job: str, since: datetime) -> bool:
    records = _records(lab, job)
    runs = [r for r in records if r.finished_at is not None and r.tick >= since]
    if not runs or not records:
        return False
    names = {r.tick for r in records}
    tick = min(names)
    while tick < since:
        if tick not in names:
            return False
        tick = SCHEDULE.next_ticks(tick, 1)[0]
    return True


def _records(lab: FaultLab, job: str) -> list[TickRecord]:
    with lab.driver():
        try:
            return Ledger(lab.management(), lock_key(job)).records()
        except ConsulError:
            return []


def _check(lab: FaultLab, jobs: list[str], result: SchedulerResult, excuses: list[Excuse]) -> None:
    """The oracle's checks on each job (the target's in `result`), each job's ticks, and what
    was left in Consul."""
    for job in jobs:
        overlaps = lab.oracle.overlaps(job)
        result.overlaps += len(overlaps)
        result.overlap_max = max([result.overlap_max, *(o.seconds for o in overlaps)])
        late = lab.oracle.late_kills(job)
        result.late_kills += len(late)
        result.late_kill_max = max([result.late_kill_max, *(k.seconds for k in late)])
        result.rejections += lab.oracle.rejections(job)
        verdict = judge_ticks(job, SCHEDULE, lab.oracle.holders(job), _records(lab, job), excuses)
        result.verdicts.append(verdict)
    _leftovers(lab, jobs, result)


def _leftovers(lab: FaultLab, jobs: list[str], result: SchedulerResult) -> None:
    with lab.driver():
        management = lab.management()
        for _ in attempts(Deadline(5.0), 0.2):
            sessions = management.session.list()
            held = []
            for job in jobs:
                entry, _ = management.kv.get(lock_key(job), consistency="consistent")
                held.append(entry is not None and bool(entry.session))
            if not sessions and not any(held):
                break
        result.sessions_left = len(sessions)
        result.key_held = any(held)
        for session in sessions:
            with contextlib.suppress(ConsulError):
                management.session.destroy(session.id)
        for job in jobs:
            with contextlib.suppress(ConsulError):
                management.kv.delete(f"{harness.PREFIX}/{job}/", recurse=True)
    lab.wait_healthy()


# -- the soak: the "done means" ----------------------------------------------------------
def run_soak(lab: FaultLab, seconds: float, number: int = 1) -> SchedulerResult:
    """The short job on three schedulers for `seconds`: a SIGTERM hand-over a third of the way,
    a kill -9 of the active scheduler two thirds of the way, each replica started again."""
    job = f"sch-soak-{number}-{uuid.uuid4().hex[:6]}"
    folder = lab.root / "runs" / job
    folder.mkdir(parents=True)
    result = SchedulerResult("soak", TOOL, job, bound=TAKEOVER_BOUND)
    fleet = SchedulerFleet(lab, {job: SHORT}, folder)
    began = time.monotonic()
    excuses: list[Excuse] = []
    found: dict[int, str] = {}
    try:
        fleet.start_all()
        time.sleep(max(0.0, began + seconds / 3 - time.monotonic()))
        _sigterm_handover(lab, fleet, job, result)
        time.sleep(max(0.0, began + 2 * seconds / 3 - time.monotonic()))
        holder = _wait_for_holder(lab, job, 3 * EVERY)
        time.sleep(max(0.0, holder.entered + 0.5 - time.monotonic()))
        fault_at = datetime.now(timezone.utc)
        at = lab.oracle.mark("scheduler soak kill -9")
        fleet.signal(holder.worker, signal.SIGKILL)
        found = _tree_survivors(lab, holder.worker, KILL9_SURVIVOR_BOUND, "after the kill -9")
        fleet.wait(holder.worker, 5.0)
        fleet.start(holder.worker)  # its flock went with it
        result.holder = holder.worker
        result.takeover = _wait_for_next(lab, job, holder, at, result.bound + 10.0)
        excuses.append(_excuse(fault_at, "kill -9"))
        time.sleep(max(0.0, began + seconds - time.monotonic()))
        _settle(lab, [job], fault_at + timedelta(seconds=result.takeover or 0.0))
    finally:
        result.runner_exits = fleet.stop_all()
        found = harness._run_survivors(lab, job, TIMINGS.survivor_bound) | found
        survivors.kill(found, lab.marker)
    result.survivors = len(found)
    result.survivors_seen = [f"{pid} {how}" for pid, how in sorted(found.items())]
    _check(lab, [job], result, excuses)
    return result


def _sigterm_handover(
    lab: FaultLab, fleet: SchedulerFleet, job: str, result: SchedulerResult
) -> None:
    """SIGTERM the scheduler whose job runs; the very next tick must run on another replica."""
    holder = _wait_for_holder(lab, job, 3 * EVERY)
    time.sleep(max(0.0, holder.entered + 0.3 - time.monotonic()))
    fleet.signal(holder.worker, signal.SIGTERM)
    code = fleet.wait(holder.worker, STOP_GRACE)
    assert holder.tick is not None
    tick = datetime.strptime(holder.tick, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    following = SCHEDULE.next_ticks(tick, 1)[0]
    name = following.strftime("%Y-%m-%dT%H:%M:%SZ")
    ran_by = None
    for _ in attempts(Deadline(EVERY + 10.0), POLL):
        ran_by = next((h.worker for h in lab.oracle.holders(job) if h.tick == name), None)
        if ran_by is not None:
            break
    fleet.start(holder.worker)
    result.handover = (
        f"{holder.worker} (exit {code}) stopped during tick {holder.tick}; "
        f"tick {name} ran on {ran_by}"
    )
    result.handover_ok = code == 0 and ran_by is not None and ran_by != holder.worker
