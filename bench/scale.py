"""A fleet on one Consul cluster (issue 20, item 8): what N jobs on R `lockctl schedule` replicas
cost Consul and the machine, and whether every tick still runs exactly once.

On its own local cluster (3 servers, worker-1..3; started here on --subnet, stopped at the end):
a spec of --jobs jobs on --schedule, each listing all 3 workers, applied (policies and worker
tokens, `lockctl apply`) and written out per worker (`lockctl worker-config`, with the TLS files
on a TLS cluster); then one `lockctl schedule` per worker for --replicas workers, for --duration
seconds, then SIGTERM to each by its PID. Every job is a shell script that appends one line,
"<LOCKCTL_TICK> <LOCKCTL_WORKER> <start, unix seconds.ns>", to its own oracle file (one O_APPEND
write) and exits. Measured, over the window from the schedulers' start to the SIGTERM:

  - Raft entries committed per scheduled tick: the delta of the leader's Stats.raft.commit_index
    (/v1/agent/self) over the window, divided by the ticks scheduled in it (and the same from
    --warmup seconds on: the steady state, without the start-up's session creates);
  - peak Consul sessions (/v1/session/list each second, management token), and those left;
  - ticks run / doubled (two oracle lines for one job and tick) / missing (the tick's claim window
    closed inside the window with no oracle line and no ledger record) / recorded missed /
    unclaimed (no claim 10 s after the tick) from the oracle files and each job's ledger;
  - start lag p50/p99: oracle start time minus the tick's instant (plus its jitter offset, with
    --jitter), over the window and over the ticks after --warmup;
  - per replica: CPU seconds (utime+stime from /proc/<pid>/stat; the jobs it waited for,
    cutime+cstime, apart), CPU % of a core after --warmup, peak RSS (VmHWM), peak threads (sampled
    each second), `fenced` events in its stderr (JSON lines);
  - the SIGTERM time: from the SIGTERM to every replica to the last one's exit;
  - the machine's CPU per job tick after --warmup (every process: replicas, jobs, Consul), and
    the floor of a burst's start lag: before the replicas start, one tick's worth of the job
    (--jobs copies) started at once by one process, with no lockctl and no Consul; the last
    start's delay;
  - job loops that died: "Exception in thread" tracebacks in a replica's stderr (a target of
    every scenario: a scheduler whose job threads died measures as idle but runs nothing).

Scenarios (the issue's targets, printed beside the figures and the "before" of
bench/scale_baseline.json, measured before the change):

    fleet   300 jobs on "@every 10s", 3 replicas, 60 s: 0 doubled, 0 missing, start lag p99 < 1 s,
            <= 2.2 Raft entries per tick, 3 sessions (and SIGTERM within 2 s, item 5)
    minute  300 jobs on "* * * * *", ONE replica, TLS, long enough for 2 minute ticks: every tick
            claimed, no healthy job fenced
    idle    1000 jobs on "@hourly", 3 replicas, 120 s: idle CPU < 1% of a core, RSS < 60 MB each

The cluster is TLS unless --no-tls. Every process started here is stopped by its PID; only
loopback addresses are used.

    .venv/bin/python bench/scale.py --scenario fleet
    .venv/bin/python bench/scale.py --scenario fleet --jobs 20 --duration 25     # a smoke run
    .venv/bin/python bench/scale.py --scenario idle --json
    .venv/bin/python bench/scale.py --scenario minute --save-baseline bench/scale_baseline.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from bench.scheduler import leader_client, parse_stat, parse_status_kb
from provision.cluster import tls as cluster_tls
from provision.cluster.layout import AgentSpec, ClusterLayout
from provision.cluster.local import (
    TLS_VARIABLES,
    ClusterShape,
    cluster_down,
    cluster_env,
    cluster_up,
)
from provision.consul import Consul, ConsulError, PermissionDenied
from provision.ledger.records import tick_name
from provision.ledger.store import Ledger
from provision.ledger.ticks import claim_window
from provision.ledger.turns import jitter_offset
from provision.schedule import Schedule, parse_schedule
from provision.spec.models import DEFAULT_START_DEADLINE
from provision.system.secrets import read_secret_file

LOCKCTL = [sys.executable, "-m", "provision"]
BASELINE = Path(__file__).with_name("scale_baseline.json")
WORKERS = 3
STOP_BOUND = 60.0  # seconds from SIGTERM to SIGKILL of a replica that does not exit
STEP_TIMEOUT = 600.0  # seconds for `apply` and `worker-config` (1,000 jobs, a slow machine)
UNCLAIMED_AGE = 10.0  # seconds after its instant a tick must have been claimed by
CALL_TIMEOUT = 10.0  # seconds for each of the bench's own Consul calls
RAISED = re.compile(r"[A-Za-z_.]*(Error|Exception): ")  # a traceback's last line
JOB_SCRIPT = """#!/bin/sh
# one run of a benchmark job: one line, one write (O_APPEND), to the oracle file "$1"
start=$(date +%s.%N)
printf '%s %s %s\\n' "$LOCKCTL_TICK" "$LOCKCTL_WORKER" "$start" >> "$1"
"""
SPEC_DEFAULTS = {"ttl": "15s", "lock_delay": "15s", "kill_grace": "5s"}  # policies/locks.hcl's


# -- scenarios and targets -------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    key: str
    op: str  # "<", "<=", "=="
    value: float

    def met(self, figures: Mapping[str, Any]) -> bool | None:
        got = figures.get(self.key)
        if got is None:
            return None
        if self.op == "<":
            return bool(got < self.value)
        return bool(got <= self.value) if self.op == "<=" else bool(got == self.value)

    def text(self) -> str:
        return f"{self.op} {self.value:g}"


@dataclass(frozen=True)
class Scenario:
    name: str
    jobs: int
    schedule: str
    replicas: int
    duration: float | None  # None: up to 35 s past the second minute tick in the window
    warmup: float  # seconds after the start before the steady-state figures
    targets: tuple[Target, ...]


SCENARIOS = {
    "fleet": Scenario(
        "fleet",
        300,
        "@every 10s",
        3,
        60.0,
        10.0,
        (
            Target("doubled", "==", 0),
            Target("missing", "==", 0),
            Target("start_lag_p99_s", "<", 1.0),
            Target("raft_per_tick", "<=", 2.2),
            Target("sessions_peak", "<=", 3),
            Target("sigterm_s", "<=", 2.0),
            Target("thread_crashes", "==", 0),
        ),
    ),
    "minute": Scenario(
        "minute",
        300,
        "* * * * *",
        1,
        None,
        10.0,
        (
            Target("unclaimed", "==", 0),
            Target("doubled", "==", 0),
            Target("fenced", "==", 0),
            Target("thread_crashes", "==", 0),
        ),
    ),
    "idle": Scenario(
        "idle",
        1000,
        "@hourly",
        3,
        120.0,
        30.0,
        (
            Target("idle_cpu_pct_max", "<", 1.0),
            Target("rss_peak_mb_max", "<", 60.0),
            Target("thread_crashes", "==", 0),
        ),
    ),
}


# -- the pure part: oracle lines, ledger records -> ticks run, doubled, missing, lag -----------
@dataclass(frozen=True)
class Run:
    """One oracle line: a job's run of a tick."""

    job: str
    tick: str
    worker: str
    start: float  # unix seconds


@dataclass(frozen=True)
class Slot:
    """A tick of a job scheduled inside the window, and when its claim window closes."""

    job: str
    tick: datetime
    closes: float  # unix seconds
    planned: float = 0.0  # seconds after the instant: the tick's jitter (the same everywhere)


@dataclass
class TickFigures:
    scheduled: int = 0
    claimed: int = 0  # a ledger record other than `missed`, or an oracle line
    ran: int = 0  # at least one oracle line
    doubled: int = 0  # (job, tick) with two or more oracle lines, anywhere in the oracle
    missing: int = 0  # window closed inside the window: no oracle line, no ledger record
    recorded_missed: int = 0  # no oracle line, a `missed` record
    claimed_no_run: int = 0  # a claim record, no oracle line
    unclaimed: int = 0  # no claim UNCLAIMED_AGE s after the tick (missing or missed included)
    open: int = 0  # nothing yet, and its claim window still open at the end
    lags: list[float] = field(default_factory=list)  # first start - tick instant, per tick run


def parse_oracle(job: str, text: str) -> list[Run]:
    """The runs of one job's oracle file; a line that is not "<tick> <worker> <start>" (a torn
    write would be one) is left out."""
    runs = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 3:
            continue
        with contextlib.suppress(ValueError):
            runs.append(Run(job, parts[0], parts[1], float(parts[2])))
    return runs


def tick_slots(
    jobs: Iterable[str],
    schedule: Schedule,
    start_deadline: float,
    begin: float,
    end: float,
    jitter: float = 0.0,
) -> list[Slot]:
    """Every job's ticks with begin <= instant < end, each with its claim window's close and
    its planned start (ledger/turns.py's jitter offset, as every replica derives it)."""
    instants = []
    tick = schedule.next_ticks(_utc(begin) - timedelta(microseconds=1), 1)[0]
    while tick.timestamp() < end:
        instants.append(tick)
        tick = schedule.next_ticks(tick, 1)[0]
    windows = {t: claim_window(schedule, t, start_deadline) for t in instants}
    return [
        Slot(job, t, t.timestamp() + windows[t], jitter_offset(job, t, jitter, windows[t]))
        for job in jobs
        for t in instants
    ]


def judge(
    slots: Sequence[Slot],
    runs: Sequence[Run],
    records: Mapping[tuple[str, str], str],
    end: float,
) -> TickFigures:
    """The ticks of `slots` against the oracle's runs and the ledgers' records ((job, tick name)
    -> outcome), as seen at `end`."""
    starts: dict[tuple[str, str], list[float]] = {}
    for run in runs:
        starts.setdefault((run.job, run.tick), []).append(run.start)
    figures = TickFigures(doubled=sum(len(s) > 1 for s in starts.values()))
    for slot in slots:
        _judge_slot(figures, slot, starts.get((slot.job, tick_name(slot.tick)), []), records, end)
    return figures


def _judge_slot(
    figures: TickFigures,
    slot: Slot,
    starts: list[float],
    records: Mapping[tuple[str, str], str],
    end: float,
) -> None:
    figures.scheduled += 1
    outcome = records.get((slot.job, tick_name(slot.tick)))
    instant = slot.tick.timestamp()
    claimed = bool(starts) or (outcome is not None and outcome != "missed")
    figures.claimed += claimed
    if starts:
        figures.ran += 1
        figures.lags.append(min(starts) - instant - slot.planned)
    elif outcome == "missed":
        figures.recorded_missed += 1
    elif outcome is not None:
        figures.claimed_no_run += 1
    elif slot.closes <= end:
        figures.missing += 1
    else:
        figures.open += 1
    if not claimed and instant + UNCLAIMED_AGE <= end:
        figures.unclaimed += 1


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def _utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, timezone.utc)


# -- the cluster, the spec, the workers ------------------------------------------------------
def job_names(count: int) -> list[str]:
    return [f"scale-{n:04d}" for n in range(1, count + 1)]


def spec_text(
    layout: ClusterLayout,
    names: Sequence[str],
    schedule: str,
    script: Path,
    oracle: Path,
    jitter: float = 0.0,
) -> str:
    """The spec: the 3 workers at their agents' addresses; every job on all of them."""
    workers = [agent.name for agent in layout.workers]
    defaults = {**SPEC_DEFAULTS, **({"jitter": f"{jitter:g}s"} if jitter else {})}
    lines = ["defaults {", *(f'  {k} = "{v}"' for k, v in defaults.items()), "}"]
    for agent in layout.workers:
        lines += [f'worker "{agent.name}" {{', f'  address = "{agent.http_address}"', "}"]
    for name in names:
        command = ["/bin/sh", str(script), str(oracle / name)]
        lines += [
            f'job "{name}" {{',
            f'  prefix   = "scale/{name}/"',
            f"  workers  = {json.dumps(workers)}",
            f"  schedule = {json.dumps(schedule)}",
            f"  command  = {json.dumps(command)}",
            "}",
        ]
    return "\n".join(lines) + "\n"


def management_of(layout: ClusterLayout) -> Consul:
    token = read_secret_file(layout.management_token_file)
    settings = cluster_tls.consul_settings(
        layout, address=layout.servers[0].http_address, token=token, timeout=CALL_TIMEOUT
    )
    return Consul(settings)


def cli_env(state_dir: Path) -> dict[str, str]:
    """This environment pointed at the cluster (as `eval "$(lockctl cluster env)"` does)."""
    env = {k: v for k, v in os.environ.items() if k not in ("CONSUL_HTTP_TOKEN", *TLS_VARIABLES)}
    env.update(cluster_env(state_dir).exports)
    return env


def lockctl(argv: list[str], env: Mapping[str, str], what: str) -> float:
    """One lockctl command, its output kept out of sight (it names files, never a secret);
    the seconds it took."""
    began = time.monotonic()
    done = subprocess.run(
        [*LOCKCTL, *argv], env=dict(env), capture_output=True, text=True, timeout=STEP_TIMEOUT
    )
    if done.returncode != 0:
        raise SystemExit(f"bench: {what} exited {done.returncode}: {done.stderr[-600:]}")
    return time.monotonic() - began


def provision_workers(
    work: Path, layout: ClusterLayout, spec: Path
) -> tuple[dict[str, Path], float]:
    """`lockctl apply` and `lockctl worker-config --all`: each worker's lockctl.json, and the
    seconds apply took."""
    env = cli_env(layout.state_dir)
    secrets, out = work / "secrets", work / "workers"
    secrets.mkdir(mode=0o700)
    applied = lockctl(
        ["apply", "--spec", str(spec), "--secrets-dir", str(secrets)], env, "lockctl apply"
    )
    argv = ["worker-config", "--all", "--spec", str(spec), "--out", str(out)]
    argv += ["--secrets-dir", str(secrets)]
    if layout.tls:
        argv += ["--tls-dir", str(layout.tls_dir)]
    lockctl(argv, env, "lockctl worker-config")
    for agent in layout.workers:
        _wait_usable(layout, agent.http_address, secrets / f"{agent.name}.token")
    return {a.name: out / a.name / "lockctl.json" for a in layout.workers}, applied


def _wait_usable(layout: ClusterLayout, address: str, token_file: Path) -> None:
    """A fresh token reaches the followers a moment after the leader (CONSUL_FACTS.md)."""
    settings = cluster_tls.consul_settings(
        layout, address=address, token=read_secret_file(token_file), timeout=CALL_TIMEOUT
    )
    consul, give_up_at = Consul(settings), time.monotonic() + 15
    while True:
        try:
            consul.acl.read_self_token()
            return
        except PermissionDenied:
            if time.monotonic() > give_up_at:
                raise
            time.sleep(0.2)


# -- the replicas and the samples ------------------------------------------------------------
@dataclass
class Replica:
    worker: str
    config: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None
    exited_after: float | None = None  # seconds after the SIGTERM
    killed: bool = False

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONSUL_")}
        with self.log.open("wb") as stderr:
            self.process = subprocess.Popen(
                [*LOCKCTL, "schedule", "--config", str(self.config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=env,
                start_new_session=True,  # a Ctrl-C here reaches the bench, which stops it
            )

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass(frozen=True)
class ProcSample:
    own: int  # clock ticks, utime+stime
    children: int  # clock ticks, cutime+cstime (the children it waited for)
    threads: int
    hwm_kb: int


@dataclass(frozen=True)
class Sample:
    at: float
    sessions: int | None
    commit: int | None
    load: float
    procs: dict[str, ProcSample]
    busy: int = 0  # the machine's busy jiffies so far, every process (/proc/stat)
    agents: dict[str, int] = field(default_factory=dict)  # "server"/"client": their clock ticks


def proc_sample(pid: int) -> ProcSample | None:
    try:
        cpu = parse_stat(Path(f"/proc/{pid}/stat").read_text())
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    # parse_status_kb reads the first number of a field: a count for Threads
    return ProcSample(
        cpu.own,
        cpu.children + _living_children_cpu(pid),
        parse_status_kb(status, "Threads"),
        parse_status_kb(status, "VmHWM"),
    )


def _living_children_cpu(pid: int) -> int:
    """Clock ticks of the replica's children still alive, and of the children they reaped: the
    scheduler's namespace helper (runner/nsserver.py) lives as long as the replica and reaps
    every job's namespace itself, so the jobs' CPU is in its figures, not yet in the replica's
    cutime."""
    total = 0
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            for child in task.read_text().split():
                with contextlib.suppress(OSError):
                    cpu = parse_stat(Path(f"/proc/{child}/stat").read_text())
                    total += cpu.own + cpu.children
    return total


def agent_pid(layout: ClusterLayout, agent: AgentSpec) -> int | None:
    """A local agent's PID, from the pidfile the cluster keeps for it."""
    try:
        return int(layout.pidfile(agent).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def machine_busy() -> int:
    """Jiffies every core spent busy since boot: /proc/stat's first line less idle and iowait."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return sum(fields) - fields[3] - fields[4]


def bare_starts(script: Path, count: int, work: Path) -> float | None:
    """The floor of a burst's start lag: `count` copies of the job started at once by one
    process, no lockctl, no Consul, on this machine as it is (the cluster up, idle). The last
    start's delay after the first spawn, from the job's own timestamps."""
    oracle = work / "bare-starts"
    env = {**os.environ, "LOCKCTL_TICK": "bare", "LOCKCTL_WORKER": "bare"}
    began = time.time()
    pids = [os.posix_spawn("/bin/sh", ["sh", str(script), str(oracle)], env) for _ in range(count)]
    for pid in pids:
        os.waitpid(pid, 0)
    starts = [float(line.split()[2]) for line in oracle.read_text().splitlines()]
    oracle.unlink()
    return max(starts) - began if len(starts) == count else None


class Sampler(threading.Thread):
    """Each second: sessions, the leader's commit index, the load, each replica's /proc."""

    def __init__(self, management: Consul, layout: ClusterLayout, replicas: list[Replica]):
        super().__init__(daemon=True)
        self.management, self.layout, self.replicas = management, layout, replicas
        self.servers = [agent.http_address for agent in layout.servers]
        self.leader = leader_client(management, self.servers)
        self.agent_pids = {agent: agent_pid(layout, agent) for agent in layout.agents}
        self.samples: list[Sample] = []
        self.stopping = threading.Event()

    def take(self) -> Sample:
        sample = Sample(
            time.time(),
            self._sessions(),
            self.commit_index(),
            os.getloadavg()[0],
            {r.worker: s for r in self.replicas if r.alive() and (s := proc_sample(r.pid))},
            machine_busy(),
            self._agents_cpu(),
        )
        self.samples.append(sample)
        return sample

    def _agents_cpu(self) -> dict[str, int]:
        """The Consul agents' own clock ticks so far, servers and clients apart."""
        cpu = {"server": 0, "client": 0}
        for agent, pid in self.agent_pids.items():
            sample = proc_sample(pid) if pid is not None else None
            if sample is not None:
                cpu["server" if agent.server else "client"] += sample.own
        return cpu

    def _sessions(self) -> int | None:
        try:
            return len(self.management.session.list())
        except ConsulError:
            return None

    def commit_index(self) -> int | None:
        """The leader's Stats.raft.commit_index (the leader found again after an error)."""
        for _ in range(2):
            try:
                return int(self.leader.agent.self()["Stats"]["raft"]["commit_index"])
            except (ConsulError, KeyError, ValueError):
                with contextlib.suppress(ConsulError):
                    self.leader = leader_client(self.management, self.servers)
        return None

    def run(self) -> None:
        began = time.monotonic()
        while not self.stopping.wait(1.0 - (time.monotonic() - began) % 1.0):
            self.take()

    def stop(self) -> None:
        self.stopping.set()
        self.join(CALL_TIMEOUT * 3)


def sigterm_all(replicas: list[Replica]) -> float | None:
    """SIGTERM every live replica by its PID; seconds until the last exited (None: one had to
    be SIGKILLed after STOP_BOUND)."""
    live = [r for r in replicas if r.alive()]
    began = time.monotonic()
    for replica in live:
        with contextlib.suppress(ProcessLookupError):
            os.kill(replica.pid, signal.SIGTERM)
    while any(r.alive() for r in live) and time.monotonic() - began < STOP_BOUND:
        for replica in live:
            if replica.exited_after is None and not replica.alive():
                replica.exited_after = time.monotonic() - began
        time.sleep(0.01)
    for replica in live:
        if replica.exited_after is None and not replica.alive():
            replica.exited_after = time.monotonic() - began
    kill_all(live)
    if any(r.killed for r in live):
        return None
    return max((r.exited_after or 0.0 for r in live), default=0.0)


def kill_all(replicas: list[Replica]) -> None:
    """SIGKILL, by PID, whichever replica is still running; reap them all."""
    for replica in replicas:
        if replica.alive():
            assert replica.process is not None
            replica.process.kill()
            replica.killed = True
        if replica.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                replica.process.wait(10)


# -- one measurement -------------------------------------------------------------------------
@dataclass
class Window:
    begin: float = 0.0
    end: float = 0.0
    steady: float = 0.0  # begin + warmup
    sigterm_s: float | None = None
    commit_after_stop: int | None = None
    sessions_left: int | None = None


def duration_of(scenario: Scenario, args: argparse.Namespace, begin: float) -> float:
    """--duration, the scenario's, or (minute) up to 35 s past the second minute tick that
    comes 10 s or more after the start."""
    if args.duration is not None:
        return float(args.duration)
    if scenario.duration is not None:
        return scenario.duration
    first = math.ceil((begin + 10) / 60) * 60
    return first + 60 + 35 - begin


def run_window(
    scenario: Scenario, args: argparse.Namespace, sampler: Sampler, replicas: list[Replica]
) -> Window:
    """Start the replicas, wait out the duration (sampling), SIGTERM them, time it."""
    window = Window(begin=sampler.take().at)
    for replica in replicas:
        replica.start()
    sampler.start()
    window.end = window.begin + duration_of(scenario, args, window.begin)
    window.steady = window.begin + min(args.warmup, (window.end - window.begin) / 2)
    while time.time() < window.end:
        time.sleep(min(1.0, max(0.0, window.end - time.time())))
    sampler.stop()
    window.end = sampler.take().at
    window.sigterm_s = sigterm_all(replicas)
    time.sleep(1.0)  # the last session destroys reach the leader
    window.commit_after_stop = sampler.commit_index()
    window.sessions_left = sampler._sessions()
    return window


def read_records(management: Consul, names: Sequence[str]) -> dict[tuple[str, str], str]:
    """Every job's ledger: (job, tick name) -> outcome."""
    found: dict[tuple[str, str], str] = {}
    for name in names:
        for record in Ledger(management, f"scale/{name}/.lock").records():
            found[(name, tick_name(record.tick))] = record.outcome.value
    return found


def read_runs(oracle: Path, names: Sequence[str]) -> list[Run]:
    runs: list[Run] = []
    for name in names:
        path = oracle / name
        if path.exists():
            runs += parse_oracle(name, path.read_text(errors="replace"))
    return runs


@dataclass
class Events:
    """A replica's stderr: each JSON event's name, the errors of its `consul-unavailable`
    events, and the first line that is not a JSON event (a traceback's, say)."""

    names: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    first_other: str | None = None
    thread_crashes: int = 0  # "Exception in thread": a job loop that died
    raised: Counter[str] = field(default_factory=Counter)  # "ValueError: ..." lines


def _other_line(found: Events, line: str) -> None:
    found.names["(not json)"] += 1
    found.first_other = found.first_other or line[:160]
    found.thread_crashes += line.count("Exception in thread")
    if RAISED.match(line):
        found.raised[line[:120]] += 1


def read_events(log: Path) -> Events:
    found = Events()
    for line in log.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if not isinstance(event, dict):
            _other_line(found, line)
            continue
        found.names[str(event.get("event"))] += 1
        if event.get("event") == "consul-unavailable":
            found.errors[str(event.get("error"))[:120]] += 1
    return found


# -- figures ---------------------------------------------------------------------------------
def tick_figures(
    args: argparse.Namespace,
    window: Window,
    runs: list[Run],
    records: Mapping[tuple[str, str], str],
) -> dict[str, Any]:
    names = job_names(args.jobs)
    schedule = parse_schedule(args.schedule)
    deadline = DEFAULT_START_DEADLINE.seconds
    slots = tick_slots(names, schedule, deadline, window.begin, window.end, args.jitter)
    ticks = judge(slots, runs, records, window.end)
    # after the warm-up: without the first ticks, when every job reads, housekeeps and opens
    # its connections at once because all replicas started together
    steady = tick_slots(names, schedule, deadline, window.steady, window.end, args.jitter)
    steady_lags = judge(steady, runs, records, window.end).lags
    return {
        "ticks_scheduled": ticks.scheduled,
        "ticks_claimed": ticks.claimed,
        "ticks_run": ticks.ran,
        "doubled": ticks.doubled,
        "missing": ticks.missing,
        "recorded_missed": ticks.recorded_missed,
        "claimed_no_run": ticks.claimed_no_run,
        "unclaimed": ticks.unclaimed,
        "open": ticks.open,
        "start_lag_p50_s": _round(percentile(ticks.lags, 50)),
        "start_lag_p99_s": _round(percentile(ticks.lags, 99)),
        "start_lag_max_s": _round(max(ticks.lags, default=None)),
        "start_lag_steady_p50_s": _round(percentile(steady_lags, 50)),
        "start_lag_steady_p99_s": _round(percentile(steady_lags, 99)),
        "steady_ticks": len(steady),
    }


def consul_figures(
    samples: list[Sample], window: Window, figures: Mapping[str, Any]
) -> dict[str, Any]:
    first, last = samples[0], samples[-1]
    steady = next((s for s in samples if s.at >= window.steady), last)
    entries = _delta(first.commit, last.commit)
    steady_entries = _delta(steady.commit, last.commit)
    sessions = [s.sessions for s in samples if s.sessions is not None]
    return {
        "raft_entries": entries,
        "raft_per_tick": _ratio(entries, figures["ticks_scheduled"]),
        "raft_per_claimed_tick": _ratio(entries, figures["ticks_claimed"]),
        "raft_per_tick_steady": _ratio(steady_entries, figures["steady_ticks"]),
        "raft_per_s_steady": _ratio(steady_entries, last.at - steady.at),
        "raft_entries_sigterm": _delta(last.commit, window.commit_after_stop),
        "machine_cpu_ms_per_tick": _ratio(
            (last.busy - steady.busy) * 1000 / os.sysconf("SC_CLK_TCK"),
            figures["steady_ticks"],
        ),
        **cpu_breakdown(steady, last, figures["steady_ticks"]),
        "sessions_peak": max(sessions, default=None),
        "sessions_left": window.sessions_left,
        "sigterm_s": _round(window.sigterm_s),
        "load_peak": _round(max(s.load for s in samples)),
    }


def cpu_breakdown(steady: Sample, last: Sample, ticks: int) -> dict[str, Any]:
    """Where the machine's CPU per tick after the warm-up went: the Consul servers, the client
    agents, the lockctl replicas themselves, and the jobs (with their namespaces' inits and the
    replicas' namespace helpers). The last three parts without lockctl's own: what a burst of
    every job's tick costs the machine whatever lockctl does, spread over all its cores."""

    def ms(ticks_before: int, ticks_after: int) -> float | None:
        return _ratio((ticks_after - ticks_before) * 1000 / os.sysconf("SC_CLK_TCK"), ticks)

    workers = set(steady.procs) & set(last.procs)
    own = [ms(steady.procs[w].own, last.procs[w].own) for w in workers]
    jobs = [ms(steady.procs[w].children, last.procs[w].children) for w in workers]
    parts = {
        "cpu_ms_consul_servers": ms(steady.agents.get("server", 0), last.agents.get("server", 0)),
        "cpu_ms_consul_clients": ms(steady.agents.get("client", 0), last.agents.get("client", 0)),
        "cpu_ms_lockctl": _round(sum(x for x in own if x is not None)) if workers else None,
        "cpu_ms_jobs": _round(sum(x for x in jobs if x is not None)) if workers else None,
    }
    floor = [parts["cpu_ms_consul_servers"], parts["cpu_ms_consul_clients"], parts["cpu_ms_jobs"]]
    known = [x for x in floor if x is not None]
    return {**parts, "cpu_ms_without_lockctl": _round(sum(known)) if len(known) == 3 else None}


def burst_cpu_floor(figures: Mapping[str, Any], jobs: int, jitter: float) -> float | None:
    """With every job's tick at one instant (no jitter): the seconds the machine's cores need
    for the burst's CPU that is not lockctl's own (Consul's, the jobs'). A start lag's p99 can
    not be much below it however little lockctl costs: the last jobs of the burst wait for it."""
    without = figures.get("cpu_ms_without_lockctl")
    if without is None or jitter:
        return None
    return _round(without * jobs / 1000 / (os.cpu_count() or 1))


def replica_figures(samples: list[Sample], window: Window, replica: Replica) -> dict[str, Any]:
    hz = os.sysconf("SC_CLK_TCK")
    mine = [s for s in samples if replica.worker in s.procs]
    if not mine:
        return {"worker": replica.worker, "alive": False}
    last = mine[-1].procs[replica.worker]
    steady = next((s for s in mine if s.at >= window.steady), mine[-1])
    span = mine[-1].at - steady.at
    idle = (last.own - steady.procs[replica.worker].own) / hz / span * 100 if span > 0 else None
    events = read_events(replica.log)
    names = events.names
    return {
        "worker": replica.worker,
        "cpu_s": _round(last.own / hz),
        "children_cpu_s": _round(last.children / hz),
        "cpu_pct": _round(last.own / hz / max(1e-9, mine[-1].at - window.begin) * 100),
        "idle_cpu_pct": _round(idle),
        "rss_peak_mb": _round(max(s.procs[replica.worker].hwm_kb for s in mine) / 1024),
        "threads_peak": max(s.procs[replica.worker].threads for s in mine),
        "fenced": names["fenced"],
        "unavailable": names["consul-unavailable"],
        "tick_failed": names["tick-failed"],
        "not_json_lines": names["(not json)"],
        "thread_crashes": events.thread_crashes,
        "raised": dict(events.raised.most_common(3)),
        "unavailable_errors": dict(events.errors.most_common(3)),
        "first_not_json": events.first_other,
        "exited_after_s": _round(replica.exited_after),
        "killed": replica.killed,
        "exit": None if replica.process is None else replica.process.returncode,
        "died_early": bool(replica.exited_after is None and not replica.killed),
    }


def fleet_maxima(per_replica: list[dict[str, Any]]) -> dict[str, Any]:
    def most(key: str) -> Any:
        values = [r[key] for r in per_replica if r.get(key) is not None]
        return max(values, default=None)

    return {
        "cpu_s_max": most("cpu_s"),
        "idle_cpu_pct_max": most("idle_cpu_pct"),
        "rss_peak_mb_max": most("rss_peak_mb"),
        "threads_peak_max": most("threads_peak"),
        "fenced": sum(r.get("fenced", 0) for r in per_replica),
        "thread_crashes": sum(r.get("thread_crashes", 0) for r in per_replica),
    }


def _delta(before: int | None, after: int | None) -> int | None:
    return None if before is None or after is None else after - before


def _ratio(part: float | None, whole: float) -> float | None:
    return None if part is None or not whole else round(part / whole, 3)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


# -- the run ---------------------------------------------------------------------------------
def code_version() -> str:
    """The commit of the provision package this bench runs ("+dirty" with local changes)."""
    import provision

    root = Path(provision.__file__).resolve().parents[1]
    git = ["git", "-C", str(root)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    )
    commit = head.stdout.strip() or "unknown"
    return f"{commit}{'+dirty' if dirty.stdout.strip() else ''} ({root})"


def measure(scenario: Scenario, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One whole run: the cluster up, the fleet for its window, the figures, the cluster down."""
    state_dir, load_before = work / "cluster", os.getloadavg()[0]
    up = cluster_up(state_dir, ClusterShape(subnet=args.subnet, workers=WORKERS, tls=args.tls))
    replicas: list[Replica] = []
    try:
        layout = up.status.layout
        management = management_of(layout)
        names = job_names(args.jobs)
        configs, apply_s = prepare(work, layout, names, args.schedule, args.jitter)
        workers = [agent.name for agent in layout.workers][: args.replicas]
        replicas = [Replica(w, configs[w], work / f"{w}.events") for w in workers]
        floor_s = bare_starts(work / "job.sh", len(names), work)  # a tick of every job at once
        sampler = Sampler(management, layout, replicas)
        window = run_window(scenario, args, sampler, replicas)
        figures = _header(scenario, args, up.consul.version, window, apply_s)
        figures["bare_starts_s"] = _round(floor_s)
        figures["load_before"] = round(load_before, 2)
        runs, records = read_runs(work / "oracle", names), read_records(management, names)
        figures.update(tick_figures(args, window, runs, records))
        figures.update(consul_figures(sampler.samples, window, figures))
        figures["burst_cpu_floor_s"] = burst_cpu_floor(figures, len(names), args.jitter)
        per_replica = [replica_figures(sampler.samples, window, r) for r in replicas]
        figures.update(fleet_maxima(per_replica), replica_figures=per_replica)
        return figures
    finally:
        kill_all(replicas)
        cluster_down(state_dir)


def prepare(
    work: Path, layout: ClusterLayout, names: list[str], schedule: str, jitter: float = 0.0
) -> tuple[dict[str, Path], float]:
    """The job script, the oracle folder, the spec, applied, and the worker configs."""
    oracle, script, spec = work / "oracle", work / "job.sh", work / "scale.hcl"
    oracle.mkdir()
    script.write_text(JOB_SCRIPT)
    spec.write_text(spec_text(layout, names, schedule, script, oracle, jitter))
    return provision_workers(work, layout, spec)


def _header(
    scenario: Scenario, args: argparse.Namespace, consul: str, window: Window, apply_s: float
) -> dict[str, Any]:
    return {
        "scenario": scenario.name,
        "jobs": args.jobs,
        "schedule": args.schedule,
        "jitter_s": args.jitter,
        "replicas": args.replicas,
        "tls": args.tls,
        "duration_s": round(window.end - window.begin, 1),
        "warmup_s": round(window.steady - window.begin, 1),
        "measured_at": _utc(window.begin).isoformat(timespec="seconds"),
        "code": code_version(),
        "consul": consul,
        "python": platform.python_version(),
        "cores": os.cpu_count(),
        "apply_s": round(apply_s, 2),
    }


# -- the report ------------------------------------------------------------------------------
ROWS = (
    ("ticks scheduled in the window", "ticks_scheduled"),
    ("ticks claimed", "ticks_claimed"),
    ("ticks run (oracle)", "ticks_run"),
    ("doubled (2+ oracle lines)", "doubled"),
    ("missing (no run, no record)", "missing"),
    ("recorded missed", "recorded_missed"),
    ("claimed, no run", "claimed_no_run"),
    (f"unclaimed {UNCLAIMED_AGE:g} s after the tick", "unclaimed"),
    ("nothing yet, claim window open", "open"),
    ("start lag p50 (s)", "start_lag_p50_s"),
    ("start lag p99 (s)", "start_lag_p99_s"),
    ("  after the warm-up: p50 (s)", "start_lag_steady_p50_s"),
    ("  after the warm-up: p99 (s)", "start_lag_steady_p99_s"),
    ("start lag max (s)", "start_lag_max_s"),
    ("  floor: the jobs alone, all at once (s)", "bare_starts_s"),
    ("machine CPU per tick after warm-up (ms)", "machine_cpu_ms_per_tick"),
    ("  Consul servers (ms)", "cpu_ms_consul_servers"),
    ("  Consul client agents (ms)", "cpu_ms_consul_clients"),
    ("  lockctl replicas, their own (ms)", "cpu_ms_lockctl"),
    ("  the jobs, their namespaces and helpers (ms)", "cpu_ms_jobs"),
    ("  all but lockctl's own (ms)", "cpu_ms_without_lockctl"),
    ("  that, for every job's tick at once, over all cores (s)", "burst_cpu_floor_s"),
    ("Raft entries in the window", "raft_entries"),
    ("Raft entries per tick", "raft_per_tick"),
    ("  per tick claimed", "raft_per_claimed_tick"),
    ("  after the warm-up", "raft_per_tick_steady"),
    ("  after the warm-up, per second", "raft_per_s_steady"),
    ("Raft entries of the SIGTERM", "raft_entries_sigterm"),
    ("Consul sessions, peak", "sessions_peak"),
    ("Consul sessions left after", "sessions_left"),
    ("SIGTERM time (s)", "sigterm_s"),
    ("fenced events (all replicas)", "fenced"),
    ("threads died (all replicas)", "thread_crashes"),
    ("CPU % of a core after warm-up, max", "idle_cpu_pct_max"),
    ("peak RSS MB, max", "rss_peak_mb_max"),
    ("peak threads, max", "threads_peak_max"),
    ("load average (1 min), before", "load_before"),
    ("load average (1 min), peak", "load_peak"),
    ("lockctl apply (s)", "apply_s"),
)
REPLICA_ROWS = (
    ("CPU s (own)", "cpu_s"),
    ("CPU s (children: the jobs)", "children_cpu_s"),
    ("CPU % of a core, window", "cpu_pct"),
    ("CPU % of a core, after warm-up", "idle_cpu_pct"),
    ("peak RSS MB (VmHWM)", "rss_peak_mb"),
    ("peak threads", "threads_peak"),
    ("fenced", "fenced"),
    ("consul-unavailable", "unavailable"),
    ("tick-failed", "tick_failed"),
    ("stderr lines not JSON", "not_json_lines"),
    ("threads died (tracebacks)", "thread_crashes"),
    ("exited after SIGTERM (s)", "exited_after_s"),
)


def _show(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def _per_replica(figures: Mapping[str, Any] | None, key: str) -> str:
    if not figures:
        return "-"
    return " / ".join(_show(r.get(key)) for r in figures.get("replica_figures", []))


def verdicts(scenario: Scenario, figures: Mapping[str, Any]) -> dict[str, bool | None]:
    return {t.key: t.met(figures) for t in scenario.targets}


def report(scenario: Scenario, now: dict[str, Any], before: dict[str, Any] | None) -> None:
    targets = {t.key: t for t in scenario.targets}
    print(
        f"\n{scenario.name}: {now['jobs']} jobs on {now['schedule']!r}, {now['replicas']} "
        f"replica(s), {'TLS' if now['tls'] else 'plain HTTP'}, "
        f"jitter {now.get('jitter_s', 0):g} s, {now['duration_s']} s "
        f"(warm-up {now['warmup_s']} s), {now['cores']} cores, Consul {now['consul']}"
    )
    print(f"now:    {now['code']}, {now['measured_at']}")
    if before:
        print(f"before: {before.get('code')}, {before.get('measured_at')}{_unlike(now, before)}")
    print(f"\n{'metric':38}{'before':>16}{'now':>16}  target")
    for label, key in ROWS:
        target = targets.get(key)
        verdict = "" if target is None else f"{target.text()}: {_verdict(target.met(now))}"
        was = _show(before.get(key)) if before else "-"
        print(f"{label:38}{was:>16}{_show(now.get(key)):>16}  {verdict}")
    workers = " / ".join(r["worker"] for r in now["replica_figures"])
    print(f"\nper replica ({workers}): before | now")
    for label, key in REPLICA_ROWS:
        print(f"  {label:32}{_per_replica(before, key):>24} | {_per_replica(now, key)}")
    _report_errors(now)


def _report_errors(now: Mapping[str, Any]) -> None:
    """What went wrong on each replica, now: the commonest Consul errors, a stray line."""
    for replica in now["replica_figures"]:
        for error, count in (replica.get("unavailable_errors") or {}).items():
            print(f"  {replica['worker']}: consul-unavailable x{count}: {error}")
        for raised, count in (replica.get("raised") or {}).items():
            print(f"  {replica['worker']}: raised x{count}: {raised}")
        if replica.get("first_not_json"):
            print(f"  {replica['worker']}: first line not JSON: {replica['first_not_json']}")


SAME_RUN = ("jobs", "schedule", "replicas", "tls")


def _unlike(now: Mapping[str, Any], before: Mapping[str, Any]) -> str:
    """A warning when the baseline was not the same kind of run as this one."""
    differ = [f"{key} {before.get(key)}" for key in SAME_RUN if before.get(key) != now.get(key)]
    return f"  (NOT the same run: before had {', '.join(differ)})" if differ else ""


def _verdict(met: bool | None) -> str:
    return "n/a" if met is None else ("met" if met else "MISSED")


def load_baseline(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def save_baseline(path: Path, figures: dict[str, Any]) -> None:
    """Add (or replace) this scenario's figures in the baseline file."""
    baseline = load_baseline(path) or {
        "about": "bench/scale.py figures measured BEFORE issue 20's change; "
        "`--save-baseline` writes one scenario at a time",
        "scenarios": {},
    }
    baseline["scenarios"][figures["scenario"]] = figures
    path.write_text(json.dumps(baseline, indent=2) + "\n")


def parse_args(argv: list[str] | None = None) -> tuple[Scenario, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="fleet")
    parser.add_argument("--jobs", type=int, help="jobs (default: the scenario's)")
    parser.add_argument("--schedule", help="every job's schedule (default: the scenario's)")
    parser.add_argument("--replicas", type=int, help=f"schedulers, 1..{WORKERS}")
    parser.add_argument("--duration", type=float, help="seconds (default: the scenario's)")
    parser.add_argument(
        "--jitter",
        type=float,
        default=0.0,
        help="every job's jitter in seconds (default 0: all ticks at the same instant); the "
        "start lag is then measured from each tick's planned start",
    )
    parser.add_argument("--warmup", type=float, help="seconds before the steady-state figures")
    parser.add_argument("--subnet", default="127.0.61", help="loopback /24 (default 127.0.61)")
    parser.add_argument("--no-tls", dest="tls", action="store_false", help="plain HTTP cluster")
    parser.add_argument("--baseline", type=Path, default=BASELINE, help="the 'before' figures")
    parser.add_argument("--save-baseline", type=Path, metavar="FILE", help="write them here")
    parser.add_argument("--json", action="store_true", help="print JSON, not the table")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="work here and keep the logs")
    args = parser.parse_args(argv)
    scenario = SCENARIOS[args.scenario]
    args.jobs = args.jobs or scenario.jobs
    args.schedule = args.schedule or scenario.schedule
    args.replicas = args.replicas or scenario.replicas
    args.warmup = scenario.warmup if args.warmup is None else args.warmup
    if not (1 <= args.replicas <= WORKERS and 1 <= args.jobs <= 10_000):
        parser.error(f"--replicas 1..{WORKERS}, --jobs 1..10000")
    if args.duration is not None and not 5 <= args.duration <= 1800:
        parser.error("--duration 5..1800")
    if not args.subnet.startswith("127."):
        parser.error("--subnet: loopback only (127.x.y)")
    return scenario, args


def main(argv: list[str] | None = None) -> int:
    scenario, args = parse_args(argv)
    if args.keep and args.keep.exists():  # a fresh folder: never another run's logs mixed in
        print(f"scale.py: --keep {args.keep}: exists; give a new folder", file=sys.stderr)
        return 2
    if args.keep:
        args.keep.mkdir(parents=True)
        figures = measure(scenario, args, args.keep.resolve())
    else:
        with tempfile.TemporaryDirectory(prefix="lockctl-bench-scale-") as tmp:
            figures = measure(scenario, args, Path(tmp))
    before = load_baseline(args.baseline).get("scenarios", {}).get(scenario.name)
    met = verdicts(scenario, figures)
    if args.save_baseline:
        save_baseline(args.save_baseline, figures)
    if args.json:
        print(json.dumps({"now": figures, "before": before, "targets": met}, indent=2))
    else:
        report(scenario, figures, before)
    return 0 if all(met.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
