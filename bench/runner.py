"""`lockctl run` beside `consul lock` (the same Consul binary, the same cluster, the same run).

On its own local cluster (started here on --subnet, stopped at the end), alternating the two
tools run by run, with the same children, the holder on worker-1 and the contender on worker-2:

  (a) hand-over: the holder's child writes a timestamp and exits; the waiting contender's child
      writes one as its first act. The difference is the hand-over (both include one `sh` start).
      Both lockctl runs are plain locks (`--wait`, no schedule): the tick core's pieces
      (runner/plain.py, tick/plain.py): the holder's release, the contender's blocking read of
      the key woken by it, its acquire, its job's go.
  (b) skip path: the lock is held elsewhere; wall time of a whole `lockctl run` that skips vs
      `consul lock -timeout=1ms`, start to exit. Target: at most 3x consul lock's.
  (b') tick already taken: a job with a schedule whose current tick worker-1 has run already;
      a whole `lockctl run` on worker-2 that skips it (one read of the tick's record: no
      session, no child), beside `consul lock -timeout=1ms` again (it has no ticks: the lock
      held elsewhere is its nearest skip), alternating run by run. Target: at most half of the
      223 ms issue 14 measured.
  (c) peak RSS of the runner process while it holds the lock (VmHWM; the child not included).

Both tools get the same session timings: TTL 15s, LockDelay 15s (consul lock's own), renew 5s.

lockctl's modules are byte-compiled first, as pip compiles an installed wheel's: a checkout run
under PYTHONDONTWRITEBYTECODE=1 would otherwise compile every module it imports at every run
(~60 ms of a skip, measured), which no installed worker pays.

    .venv/bin/python bench/runner.py [--runs 20] [--subnet 127.0.9]
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from provision.cluster.consul_binary import find_consul
from provision.cluster.local import ClusterShape, cluster_down, cluster_up
from provision.consul import Consul, ConsulSettings
from provision.consul.errors import PermissionDenied
from provision.system.secrets import Secret, read_secret_file, write_secret_file

HOLDER, CONTENDER = "worker-1", "worker-2"
TOOLS = ("lockctl", "consul lock")
HANDOVER_TARGET_MS = 50.0
TICK_SKIP_TARGET_MS = 223.0 / 2  # issue 14: half of the skip path's cost when it was filed
SKIP_RATIO_TARGET = 3.0  # a whole run that finds the lock held: at most 3x consul lock's
TICK_SCHEDULE = "@every 1h"  # the tick job's: its current tick stays the same for the series
WAIT = 30.0  # seconds: the most any one step may take
TIMINGS = {"ttl": "15s", "lock_delay": "15s", "renew_interval": "5s", "kill_grace": "5s"}


@dataclass
class Results:
    handover_ms: dict[str, list[float]] = field(default_factory=lambda: {t: [] for t in TOOLS})
    skip_ms: dict[str, list[float]] = field(default_factory=lambda: {t: [] for t in TOOLS})
    skip_codes: dict[str, set[int]] = field(default_factory=lambda: {t: set() for t in TOOLS})
    # the skipping process's own CPU (user + system): what a busy host's wall time multiplies
    skip_cpu_ms: dict[str, list[float]] = field(default_factory=lambda: {t: [] for t in TOOLS})
    tick_ms: dict[str, list[float]] = field(default_factory=lambda: {t: [] for t in TOOLS})
    tick_codes: dict[str, set[int]] = field(default_factory=lambda: {t: set() for t in TOOLS})
    rss_mb: dict[str, list[float]] = field(default_factory=lambda: {t: [] for t in TOOLS})


class Bench:
    """The cluster's addresses, each worker's tokens and configs, and how to start each tool."""

    def __init__(self, work: Path, management: Consul, addresses: dict[str, str]) -> None:
        self.work = work
        self.management = management
        self.addresses = addresses
        self.consul = find_consul()
        if self.consul is None:
            raise SystemExit("no consul binary (cluster_up should have installed one)")
        lockctl = Path(sys.executable).parent / "lockctl"
        self.lockctl = [str(lockctl)] if lockctl.exists() else [sys.executable, "-m", "provision"]
        self.processes: list[subprocess.Popen[bytes]] = []
        self.counter = 0

    # -- ACLs: least privilege for lockctl; consul lock also needs agent read (/v1/agent/self)
    def grant(self) -> None:
        acl = self.management.acl
        acl.create_policy("bench-lock", 'key_prefix "bench/" {\n  policy = "write"\n}\n')
        for worker in (HOLDER, CONTENDER):
            acl.create_policy(
                f"bench-session-{worker}", f'session "{worker}" {{ policy = "write" }}'
            )
            acl.create_policy(f"bench-agent-{worker}", f'agent "{worker}" {{ policy = "read" }}')
            lockctl = acl.create_token("bench lockctl", ["bench-lock", f"bench-session-{worker}"])
            consul = acl.create_token(
                "bench consul lock",
                ["bench-lock", f"bench-session-{worker}", f"bench-agent-{worker}"],
            )
            for tool, token in (("lockctl", lockctl), ("consul", consul)):
                assert token.secret is not None
                write_secret_file(self.token_file(tool, worker), token.secret)
                _wait_until_usable(self.management.with_settings(
                    address=self.addresses[worker], token=token.secret
                ))  # fmt: skip
            self._write_lockctl_config(worker)

    def token_file(self, tool: str, worker: str) -> Path:
        return self.work / "secrets" / f"{tool}-{worker}.token"

    def _write_lockctl_config(self, worker: str) -> None:
        jobs: dict[str, dict[str, str]] = {
            name: {"lock_key": f"bench/lockctl/{name}/.lock", **TIMINGS} for name in JOBS
        }
        jobs["tick"] = {**jobs.pop("tick"), "schedule": TICK_SCHEDULE, "start_deadline": "1h"}
        config = {
            "format": 1,
            "worker": worker,
            "consul": {
                "address": self.addresses[worker],
                "token_file": str(self.token_file("lockctl", worker)),
            },
            "jobs": jobs,
        }
        (self.work / f"{worker}.json").write_text(json.dumps(config, indent=2))

    # -- the two tools, asked to do the same thing
    def command(
        self, tool: str, worker: str, job: str, child: list[str], *, wait: bool, try_ms: int = 0
    ) -> list[str]:
        if tool == "lockctl":
            config = str(self.work / f"{worker}.json")
            flags = ["--wait"] if wait else []
            return [*self.lockctl, "run", "--config", config, "--job", job, *flags, "--", *child]
        assert self.consul is not None
        flags = [] if wait else [f"-timeout={try_ms}ms"]
        return [
            str(self.consul.path),
            "lock",
            f"-http-addr={self.addresses[worker]}",
            f"-token-file={self.token_file('consul', worker)}",
            "-shell=false",
            *flags,
            f"bench/consul/{job}",
            *child,
        ]

    def start(self, argv: list[str]) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.processes.append(process)
        return process

    def files(self) -> Iterator[Path]:
        self.counter += 1
        folder = self.work / f"run-{self.counter}"
        folder.mkdir()
        for number in itertools.count():
            yield folder / f"f{number}"

    def stop_all(self) -> None:
        """Only the processes this bench started, by pid."""
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(5)


JOBS = ("handover", "skip", "tick")


def _wait_until_usable(consul: Consul) -> None:
    give_up_at = time.monotonic() + 10
    while True:
        try:
            consul.acl.read_self_token()
            return
        except PermissionDenied:
            if time.monotonic() > give_up_at:
                raise
            time.sleep(0.1)


def _until(predicate: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    give_up_at = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > give_up_at:
            raise SystemExit(f"bench: timed out waiting for {what}")
        time.sleep(0.002)


def _sessions(bench: Bench, node: str) -> set[str]:
    return {s.id for s in bench.management.session.list(node=node)}


def _vm_hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise SystemExit(f"no VmHWM for pid {pid}")


def _holding_child(held: Path, go: Path, end: Path | None = None) -> list[str]:
    stamp = f"; date +%s.%N > {end}" if end else ""
    return ["sh", "-c", f"touch {held}; while [ ! -e {go} ]; do sleep 0.005; done{stamp}"]


def handover_run(bench: Bench, tool: str, results: Results | None) -> None:
    """Holder on worker-1 until `go`; contender on worker-2 waiting; measure the hand-over."""
    names = bench.files()
    held, go, end, began = next(names), next(names), next(names), next(names)
    holder = bench.start(
        bench.command(tool, HOLDER, "handover", _holding_child(held, go, end), wait=True)
    )
    _until(held.exists, f"{tool} holder's child")
    before = _sessions(bench, CONTENDER)
    contender_child = ["sh", "-c", f"date +%s.%N > {began}"]
    contender = bench.start(bench.command(tool, CONTENDER, "handover", contender_child, wait=True))
    _until(lambda: bool(_sessions(bench, CONTENDER) - before), f"{tool} contender's session")
    time.sleep(0.3)  # it has tried once and is now blocked on the key
    rss = _vm_hwm_mb(holder.pid)  # the holder has held the lock for a while now
    go.touch()
    holder.wait(WAIT)
    contender.wait(WAIT)
    _until(began.exists, f"{tool} contender's child")
    if results is not None:
        handover = float(began.read_text()) - float(end.read_text())
        results.handover_ms[tool].append(handover * 1000)
        results.rss_mb[tool].append(rss)


def skip_runs(bench: Bench, runs: int, results: Results) -> None:
    """Both locks held on worker-1; time whole skipping runs on worker-2, alternating tools."""
    names = bench.files()
    holders = {}
    gos = {}
    for tool in TOOLS:
        held, gos[tool], ran = next(names), next(names), next(names)
        holders[tool] = bench.start(
            bench.command(tool, HOLDER, "skip", _holding_child(held, gos[tool]), wait=True)
        )
        _until(held.exists, f"{tool} holder's child")
    ran = next(names)
    jobs = {"lockctl": "skip", "consul lock": "skip"}
    _timed_skips(bench, runs, jobs, ran, results.skip_ms, results.skip_codes, results.skip_cpu_ms)
    if _tick_taken(bench, next(names)):
        jobs = {"lockctl": "tick", "consul lock": "skip"}
        _timed_skips(bench, runs, jobs, ran, results.tick_ms, results.tick_codes, {})
    for tool in TOOLS:
        gos[tool].touch()
        holders[tool].wait(WAIT)


def _tick_taken(bench: Bench, ran: Path) -> bool:
    """worker-1 runs the tick job's current tick, so worker-2's runs find it taken. Not within
    a minute of the next tick: the series must not cross into a tick nobody has taken."""
    left = 3600 - time.time() % 3600  # TICK_SCHEDULE: @every 1h, anchored to the epoch
    if left < 60:
        time.sleep(left + 1)
    argv = bench.command("lockctl", HOLDER, "tick", ["touch", str(ran)], wait=False)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=WAIT, check=False)
    if done.returncode != 0 or not ran.exists():
        print(f"bench: worker-1 did not run the tick job: {done.stderr.strip()}", file=sys.stderr)
        return False
    ran.unlink()
    return True


def _timed_skips(
    bench: Bench,
    runs: int,
    jobs: dict[str, str],
    ran: Path,
    times: dict[str, list[float]],
    codes: dict[str, set[int]],
    cpu: dict[str, list[float]],
) -> None:
    """Whole runs on worker-2 that must skip, `runs` per tool after a warm-up, alternating;
    `cpu` (when it has the tool) gets each run's own CPU time."""
    for attempt in range(runs + 1):  # the first of each is a warm-up
        for tool in TOOLS:
            child = ["touch", str(ran)]
            argv = bench.command(tool, CONTENDER, jobs[tool], child, wait=False, try_ms=1)
            before = _children_cpu()
            began = time.monotonic()
            code = subprocess.run(argv, capture_output=True, timeout=WAIT, check=False).returncode
            took = (time.monotonic() - began) * 1000
            if attempt > 0 and tool in cpu:  # the child never ran: all of it is the tool's
                cpu[tool].append((_children_cpu() - before) * 1000)
            if ran.exists():
                raise SystemExit(f"bench: {tool} ran its child while the lock was held elsewhere")
            if attempt > 0:
                times[tool].append(took)
                codes[tool].add(code)


def _children_cpu() -> float:
    """Seconds of CPU (user + system) this process's waited-for children have used."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _spread(values: list[float]) -> str:
    ordered = sorted(values)
    low = ordered[len(ordered) // 10]
    high = ordered[(len(ordered) * 9) // 10 - 1 if len(ordered) >= 10 else -1]
    return f"{low:.1f}..{high:.1f}"


def report(results: Results, runs: int) -> bool:
    rows = []
    handover = {t: _median(results.handover_ms[t]) for t in TOOLS}
    ok = handover["lockctl"] <= handover["consul lock"] and handover["lockctl"] < HANDOVER_TARGET_MS
    rows.append(
        (
            "hand-over latency (ms)",
            handover,
            f"<= consul lock and < {HANDOVER_TARGET_MS:g} ms: {'met' if ok else 'MISSED'}",
        )
    )
    skip = {t: _median(results.skip_ms[t]) for t in TOOLS}
    codes = {t: ",".join(str(c) for c in sorted(results.skip_codes[t])) for t in TOOLS}
    met = skip["lockctl"] <= SKIP_RATIO_TARGET * skip["consul lock"]
    rows.append(
        (
            "skip path, whole run (ms)",
            skip,
            f"<= {SKIP_RATIO_TARGET:g}x consul lock: {'met' if met else 'MISSED'} (exit codes: "
            f"lockctl {codes['lockctl']}, consul lock {codes['consul lock']})",
        )
    )
    cpu = {t: _median(results.skip_cpu_ms[t]) for t in TOOLS}
    rows.append(
        (
            "skip path, run's CPU (ms)",
            cpu,
            "report (user + system: a busy host multiplies the wall time)",
        )
    )
    if results.tick_ms["lockctl"]:
        tick = {t: _median(results.tick_ms[t]) for t in TOOLS}
        met = tick["lockctl"] <= TICK_SKIP_TARGET_MS
        codes = {t: ",".join(str(c) for c in sorted(results.tick_codes[t])) for t in TOOLS}
        rows.append(
            (
                "skip, tick already taken (ms)",
                tick,
                f"<= {TICK_SKIP_TARGET_MS:g} ms: {'met' if met else 'MISSED'} (exit codes: "
                f"lockctl {codes['lockctl']}, consul lock {codes['consul lock']})",
            )
        )
    rss = {t: _median(results.rss_mb[t]) for t in TOOLS}
    rows.append(("peak RSS while holding (MB)", rss, "report"))
    print(f"\nmedians of {runs} runs each (after one warm-up), tools alternating run by run\n")
    print(f"{'metric':30}{'lockctl':>10}{'consul lock':>13}{'ratio':>8}  target")
    for metric, values, target in rows:
        ratio = values["lockctl"] / values["consul lock"]
        mine, theirs = values["lockctl"], values["consul lock"]
        print(f"{metric:30}{mine:10.1f}{theirs:13.1f}{ratio:8.2f}  {target}")
    print("\np10..p90")
    for metric, series in (
        ("hand-over latency (ms)", results.handover_ms),
        ("skip path, whole run (ms)", results.skip_ms),
        ("skip path, run's CPU (ms)", results.skip_cpu_ms),
        ("skip, tick already taken (ms)", results.tick_ms),
        ("peak RSS while holding (MB)", results.rss_mb),
    ):
        if not series["lockctl"]:
            continue
        print(f"{metric:30}{_spread(series['lockctl']):>16}{_spread(series['consul lock']):>16}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--subnet", default="127.0.9")
    args = parser.parse_args()
    compileall.compile_dir(Path(__file__).resolve().parents[1] / "provision", quiet=1)
    with tempfile.TemporaryDirectory(prefix="lockctl-bench-runner-") as tmp:
        work = Path(tmp)
        state_dir = work / "cluster"
        # as measured before TLS
        up = cluster_up(state_dir, ClusterShape(subnet=args.subnet, tls=False))
        bench: Bench | None = None
        try:
            layout = up.status.layout
            print(f"cluster up in {up.seconds:.1f} s (Consul {up.consul.version})")
            token: Secret = read_secret_file(layout.management_token_file)
            server = layout.servers[0].http_address
            management = Consul(ConsulSettings(address=server, token=token))
            addresses = {agent.name: agent.http_address for agent in layout.agents}
            bench = Bench(work, management, addresses)
            bench.grant()
            results = Results()
            for tool in TOOLS:
                handover_run(bench, tool, None)  # warm-up
            for _ in range(args.runs):
                for tool in TOOLS:
                    handover_run(bench, tool, results)
            skip_runs(bench, args.runs, results)
            return 0 if report(results, args.runs) else 1
        finally:
            if bench is not None:
                bench.stop_all()
            cluster_down(state_dir)


if __name__ == "__main__":
    os.environ.pop("CONSUL_HTTP_TOKEN", None)  # each tool gets its token file, nothing else
    sys.exit(main())
