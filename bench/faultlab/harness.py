"""Fault scenarios on a namespace cluster, shared by tests/faults/test_faults.py and
bench/faults.py (the soak).

A `FaultLab` is one `lockctl cluster up --netns` cluster with three client agents (worker-1..3),
a token per worker (key write on `faults/`, session write and agent read on its own node: what
both `lockctl run` and `consul lock` need), and an oracle. `run_scenario` runs ONE fault:

    every worker runs its runner on a 1 s schedule (a new one as soon as the last has exited),
    each `--wait`ing for the lock, so the job is always held by one and waited for by the others
    -> the job (bench/faultlab/job.py, a process tree: main, child, TERM-ignoring grandchild,
    setsid'd daemon) enters the oracle, every member of it -> 1.5 s into it, the fault hits the
    holder -> wait for the next holder -> heal -> stop every runner (SIGTERM, by PID) -> checks
    -> scan /proc for survivors, and SIGKILL them (by PID).

The job runs for longer than the takeover bound, so a job that its runner fails to stop (an
orphan, a partitioned holder that does not notice) is still running when the next holder starts,
and the checks see it. Survivors are looked for twice: the holder's tree once its runner ended
(1 s after a kill -9 of the runner; kill grace + 2 s after a runner that exited on its own), and
every process of the run once all runners ended (kill grace + 2 s after the teardown).

`--wait` rather than one attempt per tick: the takeover time then measures the lock tool, not
the tick, `consul lock` (which has no skip mode that cleans up after itself) runs the same way,
and "the leader killed while another worker waits" always has a waiter.

Consul calls are made from the cluster's driver namespace (`ns.entered`), runners inside their
worker's namespace (`ip netns exec`). Everything started here is stopped by PID.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench.faultlab import survivors
from bench.faultlab.job import ROLES
from bench.faultlab.oracle import Holder, Oracle
from provision.cluster import netns as ns
from provision.cluster import tls
from provision.cluster.consul_binary import find_consul
from provision.cluster.layout import AgentSpec, ClusterLayout
from provision.cluster.local import ClusterShape, cluster_down, cluster_status, cluster_up
from provision.consul import Consul
from provision.consul.errors import ConsulError, PermissionDenied
from provision.system.control_keys import CONTROL_ROOT
from provision.system.deadline import Deadline, attempts, retry_until, wait_until
from provision.system.processes import read_pid, stop, terminate
from provision.system.secrets import Secret, read_secret_file, write_secret_file
from provision.workers.config import WorkerTLS

REPO = Path(__file__).resolve().parents[2]
JOB_SCRIPT = Path(__file__).with_name("job.py")
WORKERS = 3
TICK = 1.0  # the schedule: a worker starts a runner each second unless one is running
FAULT_AFTER = 1.5  # seconds into the holder's job
# seconds a holder's tree gets to have every member entered before a fault or the teardown may
# come (on a loaded machine its members' forks and enters can take longer than FAULT_AFTER)
WHOLE_WITHIN = 20.0
HOLDER_EXIT_WAIT = 30.0  # seconds the old holder's runner gets to exit on its own after a fault
PREFIX = "faults"
POLL = 0.05  # seconds between looks at the oracle
KILL9_SURVIVOR_BOUND = 1.0  # seconds after a kill -9 of the runner for its job's tree to be gone
CONSUL_LOCK_KILL_GRACE = 5.0  # `consul lock`'s own SIGTERM-to-SIGKILL grace (not settable)

SCENARIOS = ("kill9-runner", "kill9-both", "sigstop", "cut-host", "kill-leader", "restart-agent")
TOOLS = ("lockctl", "consul-lock")


@dataclass(frozen=True)
class Timings:
    ttl: float
    lock_delay: float
    renew: float | None = None  # None: chosen by the tool
    kill_grace: float | None = None

    @property
    def expiry_bound(self) -> float:
        """A dead holder's lock is free after at most 2 x TTL (lazy expiry) + LockDelay."""
        return 2 * self.ttl + self.lock_delay

    @property
    def survivor_bound(self) -> float:
        """How long after its runner ended a job's process may still be alive: kill grace + 2 s."""
        grace = CONSUL_LOCK_KILL_GRACE if self.kill_grace is None else self.kill_grace
        return grace + 2.0

    @property
    def job_seconds(self) -> float:
        """How long the test job works: past the takeover bound (2 x TTL + LockDelay + 5 s)."""
        return self.expiry_bound + 10.0


LOCKCTL_TIMINGS = Timings(ttl=10.0, lock_delay=5.0, renew=2.0, kill_grace=1.0)
CONSUL_LOCK_TIMINGS = Timings(ttl=15.0, lock_delay=15.0)  # fixed by `consul lock`


def timings_of(tool: str) -> Timings:
    return LOCKCTL_TIMINGS if tool == "lockctl" else CONSUL_LOCK_TIMINGS


@dataclass
class RunResult:
    """What one fault did, and the checks over it."""

    scenario: str
    tool: str
    job: str
    holder: str = ""
    takeover: float | None = None  # seconds from the fault to the next holder's enter
    holder_kept: bool = False  # no takeover because the holder kept the lock through the fault
    bound: float = 0.0
    detection: float | None = None  # cut-host: seconds from the cut to session invalidation
    detection_bound: float | None = None  # cut-host: invalidation + LockDelay + 2 s
    overlaps: int = 0
    overlap_max: float = 0.0
    rejections: int = 0
    late_kills: int = 0
    late_kill_max: float = 0.0
    late_kills_checked: bool = True  # not when the runner itself was paused
    sessions_left: int = 0
    key_held: bool = False
    runner_exits: dict[str, list[int]] = field(default_factory=dict)
    holder_exit: int | None = None  # the holder's runner's exit status (negative: killed by)
    survivors: int = 0  # processes of the run alive past their bound after their runner ended
    survivors_seen: list[str] = field(default_factory=list)  # "4242 daemon: how it was seen"
    notes: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        """Every broken promise; empty when the run kept them all."""
        found = []
        if self.overlaps:
            found.append(f"{self.overlaps} overlap(s), longest {self.overlap_max:.3f} s")
        if self.survivors:
            found.append(
                f"{self.survivors} process(es) outlived their runner: "
                + ", ".join(self.survivors_seen)
            )
        if self.late_kills_checked and self.late_kills:
            found.append(f"{self.late_kills} child(ren) killed late, by {self.late_kill_max:.3f} s")
        if self.takeover is None:
            if not self.holder_kept:
                found.append("no takeover in time")
        elif self.takeover > self.bound:
            found.append(f"takeover {self.takeover:.1f} s > bound {self.bound:.1f} s")
        if self.detection_bound is not None and self.takeover is not None:
            if self.detection is None:
                found.append("the holder's session was never seen invalidated")
            elif self.takeover > self.detection_bound:
                found.append(
                    f"takeover {self.takeover:.1f} s > detection {self.detection:.1f} s + "
                    f"LockDelay + 2 s = {self.detection_bound:.1f} s"
                )
        if self.scenario == "sigstop" and self.tool == "lockctl" and self.rejections < 1:
            found.append("the stale writer was never rejected: the fence was not exercised")
        if self.sessions_left:
            found.append(f"{self.sessions_left} session(s) left behind")
        if self.key_held:
            found.append("the lock key is still held")
        return found


class FaultLab:
    """A namespace cluster with three workers, their tokens, and an oracle."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.state_dir = root / "cluster"
        self.marker = f"faultjob-{uuid.uuid4().hex[:8]}"
        root.mkdir(parents=True, exist_ok=True)
        self.oracle = Oracle(root / "oracle.sock")
        self.layout: ClusterLayout | None = None
        self.token_files: dict[str, Path] = {}
        self.consul_bin = str(find_consul().path)

    # -- life cycle ------------------------------------------------------------------------------
    def up(self) -> FaultLab:
        self.root.mkdir(parents=True, exist_ok=True)
        self.oracle.start()
        result = cluster_up(self.state_dir, ClusterShape(workers=WORKERS, netns=True))
        self.layout = result.status.layout
        with self.driver():
            management = self.management()
            for agent in self.layout.workers:
                self.token_files[agent.name] = self._mint(management, agent)
        return self

    def down(self) -> None:
        try:
            survivors.kill(survivors.marked(self.marker), self.marker)
            self.oracle.stop()
        finally:
            cluster_down(self.state_dir)

    def _mint(self, management: Consul, agent: AgentSpec) -> Path:
        # what lockctl's own policies grant a worker (templates/policies/): its jobs' keys,
        # read on their control keys (pauses, triggers), its node's sessions
        rules = (
            f'key_prefix "{PREFIX}/" {{ policy = "write" }}\n'
            f'key_prefix "{CONTROL_ROOT}" {{ policy = "read" }}\n'
            f'session "{agent.name}" {{ policy = "write" }}\n'
            f'agent "{agent.name}" {{ policy = "read" }}\n'
        )
        policy = management.acl.create_policy(f"faults-{agent.name}", rules)
        token = management.acl.create_token(f"fault tests: {agent.name}", [policy.name])
        assert token.secret is not None
        path = self.root / f"{agent.name}.token"
        write_secret_file(path, token.secret)
        worker = self.client(agent.name, token.secret)
        try:  # a fresh token reaches the followers a moment after the leader
            retry_until(
                Deadline(15.0), worker.acl.read_self_token, retry_on=(PermissionDenied,), pause=0.1
            )
        except PermissionDenied:
            raise AssertionError(f"{agent.name}'s token never worked") from None
        return path

    # -- handles ---------------------------------------------------------------------------------
    @property
    def cluster(self) -> ClusterLayout:
        assert self.layout is not None, "the lab is not up"
        return self.layout

    def driver(self) -> contextlib.AbstractContextManager[None]:
        """Consul calls work only inside this block (the agents live in namespaces)."""
        return ns.entered(self.cluster.driver_netns)

    def agent(self, name: str) -> AgentSpec:
        return next(a for a in self.cluster.agents if a.name == name)

    def client(self, name: str, token: Secret | None) -> Consul:
        address = self.agent(name).http_address
        return Consul(tls.consul_settings(self.cluster, address=address, token=token))

    def consul_of(self, worker: str) -> dict[str, str]:
        """A worker config's `consul` object: its agent, its token file and, on a TLS cluster
        (the default), the CA and its agent's certificate pair, as `worker-config --tls-dir`."""
        consul = {
            "address": self.agent(worker).http_address,
            "token_file": str(self.token_files[worker]),
        }
        if self.cluster.tls:
            consul.update(WorkerTLS.in_folder(self.cluster.tls_dir, worker).record())
        return consul

    def consul_lock_tls(self, worker: str) -> list[str]:
        """The same files as `consul lock` flags (paths, not secrets)."""
        if not self.cluster.tls:
            return []
        files = WorkerTLS.in_folder(self.cluster.tls_dir, worker)
        return [
            f"-ca-file={files.ca_file}",
            f"-client-cert={files.cert_file}",
            f"-client-key={files.key_file}",
        ]

    def management(self, name: str = "server-1") -> Consul:
        return self.client(name, read_secret_file(self.cluster.management_token_file))

    def wait_healthy(self, timeout: float = 90.0) -> None:
        healthy = wait_until(Deadline(timeout), lambda: cluster_status(self.state_dir).healthy, 0.5)
        assert healthy, "the cluster did not become healthy again"

    def recover(self) -> None:
        """Start every agent that is not running and wait until all are healthy (`cluster up`)."""
        cluster_up(self.state_dir, ClusterShape(netns=True))

    def leader(self) -> AgentSpec:
        status = cluster_status(self.state_dir)
        address = status.leader.rsplit(":", 1)[0]
        return next(a for a in self.cluster.servers if a.address == address)

    def stop_agent(self, agent: AgentSpec, *, hard: bool) -> None:
        pid = read_pid(self.cluster.pidfile(agent))
        assert pid is not None
        if hard:
            os.kill(pid, signal.SIGKILL)
        stop([(pid, str(self.cluster.config_file(agent)))])

    # -- one job's runners -----------------------------------------------------------------------
    def write_config(self, job: str, worker: str, folder: Path) -> Path:
        t = LOCKCTL_TIMINGS
        config = {
            "format": 1,
            "worker": worker,
            "consul": self.consul_of(worker),
            "jobs": {
                job: {
                    "lock_key": lock_key(job),
                    "ttl": f"{t.ttl:g}s",
                    "lock_delay": f"{t.lock_delay:g}s",
                    "renew_interval": f"{t.renew:g}s",
                    "kill_grace": f"{t.kill_grace:g}s",
                    "min_hold": None,
                    "schedule": None,
                }
            },
        }
        path = folder / f"{worker}.json"
        path.write_text(json.dumps(config, indent=2))
        return path

    def runner_argv(self, tool: str, job: str, worker: str, folder: Path) -> list[str]:
        job_argv = [
            sys.executable,
            str(JOB_SCRIPT),
            str(self.oracle.path),
            job,
            worker,
            f"{timings_of(tool).job_seconds:g}",
            self.marker,
        ]
        if tool == "lockctl":
            config = self.write_config(job, worker, folder)
            argv = [sys.executable, "-m", "provision", "run", "--config", str(config)]
            argv += ["--job", job, "--wait", "--", *job_argv]
        else:
            argv = [
                self.consul_bin,
                "lock",
                f"-http-addr={self.agent(worker).http_address}",
                f"-token-file={self.token_files[worker]}",
                *self.consul_lock_tls(worker),
                "-shell=false",
                f"{PREFIX}/{job}",
                *job_argv,
            ]
        netns = self.agent(worker).netns
        assert netns is not None
        return ns.exec_argv(netns, argv)


def lock_key(job: str) -> str:
    return f"{PREFIX}/{job}/.lock"


class Schedule:
    """Every worker runs `argv_of(worker)` each TICK unless its last runner is still running."""

    def __init__(self, workers: list[str], argv_of: Callable[[str], list[str]], logs: Path):
        self.workers = workers
        self.argv_of = argv_of
        self.logs = logs
        self.current: dict[str, subprocess.Popen[bytes]] = {}
        self.exits: dict[str, list[int]] = {w: [] for w in workers}
        self.started: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> Schedule:
        self._thread.start()
        return self

    def _loop(self) -> None:
        count = 0
        while True:
            with self._lock:
                if self._stop.is_set():
                    return
                for worker in self.workers:
                    running = self.current.get(worker)
                    if running is not None and running.poll() is None:
                        continue
                    count += 1
                    log = open(self.logs / f"{worker}-{count:03d}.log", "wb")  # noqa: SIM115
                    with log:
                        process = subprocess.Popen(
                            self.argv_of(worker),
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL,
                            cwd=REPO,
                            start_new_session=True,
                        )
                    self.current[worker] = process
                    self.started.append((worker, process))
            self._stop.wait(TICK)

    def wait_for_exit(self, pid: int, timeout: float) -> int | None:
        """Wait for the runner `pid` (one of ours) to exit; its status, or None if still running."""
        with self._lock:
            process = next((p for _, p in self.started if p.pid == pid), None)
        if process is None:
            return None
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def runner_of(self, worker: str) -> int:
        with self._lock:
            return self.current[worker].pid

    def stop(self, grace: float = 20.0) -> None:
        """No new runners; SIGTERM the live ones (they stop their jobs and let go), then SIGKILL."""
        with self._lock:
            self._stop.set()
        self._thread.join()
        live = {p.pid: p for _, p in self.started if p.poll() is None}
        # poll(), not the PID's cmdline: it keeps each runner's exit status for the checks.
        terminate(list(live), lambda pid: live[pid].poll() is None, grace, wake=True)
        for process in live.values():
            process.wait()
        self.exits = {w: [] for w in self.workers}
        for worker, process in self.started:
            self.exits[worker].append(process.returncode)


def descendants(pid: int) -> list[int]:
    """Every living descendant of `pid` (from /proc), children first."""
    parents: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(name))
    found: list[int] = []
    frontier = [pid]
    while frontier:
        children = parents.get(frontier.pop(), [])
        found += children
        frontier += children
    return found


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def run_scenario(lab: FaultLab, scenario: str, tool: str, number: int = 1) -> RunResult:
    """One fault of `scenario` against `tool`'s runners; the result carries every check."""
    timings = timings_of(tool)
    job = f"{scenario}-{tool}-{number}-{uuid.uuid4().hex[:6]}"
    folder = lab.root / "runs" / job
    folder.mkdir(parents=True)
    result = RunResult(scenario, tool, job, bound=timings.expiry_bound + 5.0)
    result.late_kills_checked = scenario != "sigstop"
    workers = [a.name for a in lab.cluster.workers]
    schedule = Schedule(workers, lambda w: lab.runner_argv(tool, job, w, folder), folder)
    schedule.start()
    runner = -1
    found: dict[int, str] = {}  # survivors: pid -> how it was first seen
    try:
        holder = _whole(lab, job, _wait_for_holder(lab, job, timeout=60.0))
        time.sleep(max(0.0, holder.entered + FAULT_AFTER - time.monotonic()))
        holder = _now(lab, job, holder)  # with every member that entered meanwhile
        result.holder = holder.worker
        with lab.driver():
            entry, _ = lab.management().kv.get(lock_key(job), consistency="consistent")
        session = entry.session if entry is not None else None
        runner = schedule.runner_of(holder.worker)
        found = _inject(lab, scenario, tool, holder, schedule, session, result, timings)
        newest = lab.oracle.holders(job)[-1]
        if newest.run != holder.run:  # the takeover's tree, whole before the teardown stops it
            _whole(lab, job, newest)
        # Its own exit status says whether it noticed; a SIGTERM from the teardown would hide
        # that (it may still be cleaning up on a host that was just reconnected).
        if (
            not scenario.startswith("kill9")
            and not result.holder_kept
            and schedule.wait_for_exit(runner, HOLDER_EXIT_WAIT) is not None
        ):
            bound = timings.survivor_bound
            found = _holder_survivors(lab, holder, bound, "after its runner exited") | found
    finally:
        lab.oracle.mark("teardown")
        schedule.stop()
        result.runner_exits = schedule.exits
        found = _run_survivors(lab, job, timings.survivor_bound) | found  # the first sighting
        survivors.kill(found, lab.marker)
    result.survivors = len(found)
    result.survivors_seen = [f"{pid} {how}" for pid, how in sorted(found.items())]
    result.holder_exit = next((p.returncode for _, p in schedule.started if p.pid == runner), None)
    _check(lab, job, result)
    _clean(lab, job, result)
    return result


def _wait_for_holder(lab: FaultLab, job: str, timeout: float) -> Holder:
    for _ in attempts(Deadline(timeout), POLL):
        holder = lab.oracle.open_holder(job)
        if holder is not None and time.monotonic() - holder.entered < FAULT_AFTER:
            return holder
    raise AssertionError(f"{job}: no holder entered the oracle in time")


def _whole(lab: FaultLab, job: str, holder: Holder) -> Holder:
    """`holder` once every member of its tree has entered, or as it is after WHOLE_WITHIN
    (the test then says which members never came): a fault or the teardown that comes while
    the tree still starts would cut it short, which says nothing of the tool."""
    for _ in attempts(Deadline(WHOLE_WITHIN), POLL):
        holder = _now(lab, job, holder)
        if len(holder.sections) >= len(ROLES):
            break
    return holder


def _now(lab: FaultLab, job: str, holder: Holder) -> Holder:
    """`holder` with every member that has entered by now."""
    return lab.oracle.holder(job, holder.run) or holder


def _wait_for_takeover(lab: FaultLab, job: str, since: float, timeout: float) -> float | None:
    for _ in attempts(Deadline(timeout), POLL):
        newer = [h for h in lab.oracle.holders(job) if h.entered > since]
        if newer:
            return newer[0].entered - since
    return None


def _holder_survivors(lab: FaultLab, holder: Holder, bound: float, when: str) -> dict[int, str]:
    """The holder's members still alive `bound` seconds from now (its runner just ended)."""
    holder = _now(lab, holder.first.job, holder)
    left = survivors.wait_gone(lab.marker, bound, job=holder.first.job, pids=holder.pids)
    seen = f"{holder.worker}'s holder, {bound:g} s {when}"
    return {pid: f"{holder.role_of(pid)}: {seen}" for pid in left}


def _run_survivors(lab: FaultLab, job: str, bound: float) -> dict[int, str]:
    """Every process of the run still alive `bound` seconds after all runners ended."""
    left = survivors.wait_gone(lab.marker, bound, job=job)
    roles = {s.pid: s.role for s in lab.oracle.of_job(job)}
    return {
        pid: f"{survivors.describe(argv, roles.get(pid))}: {bound:g} s after every runner ended"
        for pid, argv in left.items()
    }


def _inject(
    lab: FaultLab,
    scenario: str,
    tool: str,
    holder: Holder,
    schedule: Schedule,
    session: str | None,
    result: RunResult,
    timings: Timings,
) -> dict[int, str]:
    """Inject the fault and wait for its outcome; the holder's survivors of a kill -9."""
    runner = schedule.runner_of(holder.worker)
    wait_limit = result.bound + 10.0
    found: dict[int, str] = {}
    if scenario in ("kill9-runner", "kill9-both"):
        victims = [runner] + (descendants(runner) if scenario == "kill9-both" else [])
        at = lab.oracle.mark(scenario)
        _signal(victims, signal.SIGKILL)
        found = _holder_survivors(lab, holder, KILL9_SURVIVOR_BOUND, "after the kill -9")
        result.takeover = _wait_for_takeover(lab, result.job, at, wait_limit)
    elif scenario == "sigstop":
        paused = [runner, *descendants(runner)]
        at = lab.oracle.mark(scenario)
        _signal(paused, signal.SIGSTOP)
        pause = timings.expiry_bound + 3.0
        result.takeover = _wait_for_takeover(lab, result.job, at, pause)
        time.sleep(max(0.0, at + pause - time.monotonic()))
        # The job first: it wakes with its sleep long over and writes at once, as a resumed VM's
        # job may before its runner is scheduled. Only the resource's fencing check stops it.
        _signal(holder.pids, signal.SIGCONT)
        time.sleep(0.3)
        _signal([runner, *paused], signal.SIGCONT)
        if result.takeover is None:
            result.takeover = _wait_for_takeover(lab, result.job, at, wait_limit - pause)
        time.sleep(2.0)  # the stale runner fences and exits
    elif scenario == "cut-host":
        host = lab.cluster.host(lab.agent(holder.worker))
        prefix = lab.cluster.netns_prefix
        assert prefix is not None
        at = lab.oracle.mark(scenario)
        ns.cut(prefix, host)
        try:
            invalidated = _watch_invalidation(lab, session, at, wait_limit)
            result.takeover = _wait_for_takeover(lab, result.job, at, wait_limit)
            time.sleep(2.0)
        finally:
            ns.heal(prefix, host)
        if invalidated is not None:
            result.detection = invalidated - at
            result.detection_bound = result.detection + timings.lock_delay + 2.0
        lab.wait_healthy()
    elif scenario == "kill-leader":
        leader = lab.leader()
        result.notes.append(f"leader {leader.name}")
        at = lab.oracle.mark(scenario)
        lab.stop_agent(leader, hard=True)
        # The holder may keep the lock through the election, or be fenced: then the next
        # holder comes after its session is destroyed plus LockDelay.
        result.takeover = _wait_for_takeover(lab, result.job, at, timings.lock_delay + 8.0)
        lab.recover()
        _takeover_or_kept(lab, holder, at, result, wait_limit)
    elif scenario == "restart-agent":
        at = lab.oracle.mark(scenario)
        lab.stop_agent(lab.agent(holder.worker), hard=False)  # SIGTERM: a graceful leave
        lab.recover()
        _takeover_or_kept(lab, holder, at, result, wait_limit)
    else:
        raise ValueError(f"unknown scenario {scenario!r}")
    time.sleep(1.0)
    return found


def _takeover_or_kept(
    lab: FaultLab, holder: Holder, at: float, result: RunResult, wait_limit: float
) -> None:
    """Either a new holder came, or the old one still holds and writes (it kept the lock)."""
    while result.takeover is None and time.monotonic() < at + wait_limit:
        result.takeover = _wait_for_takeover(lab, result.job, at, 1.0)
        recent = time.monotonic() - holder.last_accepted < 1.0
        if (
            result.takeover is None
            and holder.first.closed is None
            and recent
            and (time.monotonic() > at + lab_settle(result))
        ):
            result.holder_kept = True
            result.notes.append("the holder kept the lock through the fault")
            return


def lab_settle(result: RunResult) -> float:
    """How long after the fault a holder that still writes counts as having kept the lock."""
    return timings_of(result.tool).lock_delay + 5.0


def _watch_invalidation(
    lab: FaultLab, session: str | None, since: float, timeout: float
) -> float | None:
    """Poll (consistent reads at a server) until the holder's session is gone; when it went."""
    if session is None:
        return None
    with lab.driver():
        management = lab.management()
        for _ in attempts(Deadline(since + timeout - time.monotonic()), 0.1):
            with contextlib.suppress(ConsulError):
                if management.session.info(session, consistency="consistent") is None:
                    return time.monotonic()
    return None


def _check(lab: FaultLab, job: str, result: RunResult) -> None:
    overlaps = lab.oracle.overlaps(job)
    result.overlaps = len(overlaps)
    result.overlap_max = max((o.seconds for o in overlaps), default=0.0)
    late = lab.oracle.late_kills(job)
    result.late_kills = len(late)
    result.late_kill_max = max((k.seconds for k in late), default=0.0)
    result.rejections = lab.oracle.rejections(job)
    with lab.driver():
        management = lab.management()
        for _ in attempts(Deadline(3.0), 0.2):  # a runner's destroy may trail its exit a moment
            sessions = management.session.list()
            entry, _ = management.kv.get(lock_key(job), consistency="consistent")
            held = entry is not None and bool(entry.session)
            if not sessions and not held:
                break
    result.sessions_left = len(sessions)
    result.key_held = held


def _clean(lab: FaultLab, job: str, result: RunResult) -> None:
    """Whatever was left is recorded in `result`; remove it so the next run starts clean."""
    with lab.driver():
        management = lab.management()
        for session in management.session.list():
            with contextlib.suppress(ConsulError):
                management.session.destroy(session.id)
        with contextlib.suppress(ConsulError):
            management.kv.delete(f"{PREFIX}/{job}/", recurse=True)
    lab.wait_healthy()


@contextlib.contextmanager
def fault_lab(root: Path) -> Iterator[FaultLab]:
    lab = FaultLab(root)
    try:
        yield lab.up()
    finally:
        lab.down()


def summary(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{min(values):.1f}/{statistics.median(values):.1f}/{max(values):.1f}"
