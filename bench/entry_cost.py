"""What the console script costs a skipped `lockctl run` and a `lockctl schedule`, this checkout
beside a baseline commit (default: where this branch left main), in one run.

On its own local cluster (started here on --subnet, stopped at the end), both trees run as
`python -m provision` from the same interpreter and virtualenv, each tree first on PYTHONPATH:

  1. skip, tick already taken: worker-1 runs the current tick of an `@every 1h` job; then
     whole `lockctl run` processes on worker-2 that skip it (one read of the tick's record),
     start to exit, and their CPU time (user + system), the two trees alternating run by run
     after one warm-up each.
  2. the scheduler's RSS: `lockctl schedule` with 10 jobs on `* * * * *` (child /bin/true),
     after each job's first tick and a few seconds more: peak (VmHWM) and current (VmRSS)
     RSS, then SIGTERM; the two trees alternating, one scheduler at a time.

    .venv/bin/python bench/entry_cost.py [--baseline REF] [--runs 20] [--rounds 3]
        [--subnet 127.0.13]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.runner import CONTENDER, WAIT, Bench, _median, _spread, _tick_taken
from bench.scheduler import SchedulerBench, _first_ticks_done, _terminate, memory_mb
from provision.cluster.local import ClusterShape, cluster_down, cluster_up
from provision.consul import Consul, ConsulSettings
from provision.system.secrets import read_secret_file

ROOT = Path(__file__).resolve().parents[1]
TREES = ("before", "after")
SCHEDULER_JOBS = 10
SETTLE_SECONDS = 3.0  # after the first ticks: the helper threads and pools are all up by then


@dataclass
class Figures:
    skip_ms: dict[str, list[float]] = field(default_factory=lambda: {t: [] for t in TREES})
    skip_cpu_ms: dict[str, list[float]] = field(default_factory=lambda: {t: [] for t in TREES})
    skip_codes: dict[str, set[int]] = field(default_factory=lambda: {t: set() for t in TREES})
    hwm_mb: dict[str, list[float]] = field(default_factory=lambda: {t: [] for t in TREES})
    rss_mb: dict[str, list[float]] = field(default_factory=lambda: {t: [] for t in TREES})


class EntryBench(SchedulerBench):
    """bench/runner.py's workers (their `tick` job) and bench/scheduler.py's scheduler config."""

    _write_lockctl_config = Bench._write_lockctl_config

    def __init__(self, work: Path, management: Consul, addresses: dict[str, str]) -> None:
        super().__init__(work, management, addresses)
        self.trees: dict[str, Path] = {}

    def lockctl_of(self, tree: str) -> tuple[list[str], dict[str, str]]:
        env = {k: v for k, v in os.environ.items() if k != "LOCKCTL_CONFIG"}
        env["PYTHONPATH"] = str(self.trees[tree])
        env["PYTHONSAFEPATH"] = "1"  # not the working directory first: it may be a checkout
        return [sys.executable, "-m", "provision"], env


def baseline_tree(ref: str, into: Path) -> Path:
    """The baseline's provision/ package, unpacked from git (no worktree, no checkout)."""
    archive = into / "baseline.tar"
    subprocess.run(
        [
            "git",
            "-C",
            str(ROOT),
            "archive",
            "--format=tar",
            f"--output={archive}",
            ref,
            "provision",
        ],
        check=True,
    )
    tree = into / "before"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def check_trees(bench: EntryBench) -> None:
    """Each tree's `python -m provision` imports that tree's package, not the other's."""
    for tree in TREES:
        argv, env = bench.lockctl_of(tree)
        code = "import provision; print(provision.__file__)"
        done = subprocess.run(
            [argv[0], "-c", code], env=env, capture_output=True, text=True, check=True
        )
        if not done.stdout.startswith(str(bench.trees[tree])):
            raise SystemExit(f"bench: the {tree} tree imports {done.stdout.strip()}")


def skip_series(bench: EntryBench, runs: int, figures: Figures) -> None:
    ran = bench.work / "tick-ran"
    if not _tick_taken(bench, ran):
        raise SystemExit("bench: worker-1 could not take the tick")
    config = str(bench.work / f"{CONTENDER}.json")
    for attempt in range(runs + 1):  # the first of each is a warm-up (and compiles the .pyc)
        for tree in TREES:
            lockctl, env = bench.lockctl_of(tree)
            argv = [*lockctl, "run", "--config", config, "--job", "tick", "--", "touch", str(ran)]
            cpu_before, began = _children_cpu_ms(), time.monotonic()
            done = subprocess.run(argv, env=env, capture_output=True, timeout=WAIT, check=False)
            took, cpu = (time.monotonic() - began) * 1000, _children_cpu_ms() - cpu_before
            if ran.exists():
                raise SystemExit(f"bench: the {tree} tree ran the job of a taken tick")
            if attempt > 0:
                figures.skip_ms[tree].append(took)
                figures.skip_cpu_ms[tree].append(cpu)
                figures.skip_codes[tree].add(done.returncode)


def _children_cpu_ms() -> float:
    """User + system CPU of this process's waited-for children: less swayed by a loaded machine
    than the wall time."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1000


def scheduler_rounds(bench: EntryBench, rounds: int, figures: Figures) -> None:
    config = bench.write_scheduler_config(SCHEDULER_JOBS)
    for number in range(rounds):
        for tree in TREES:
            lockctl, env = bench.lockctl_of(tree)
            log = bench.work / f"scheduler-{tree}-{number}.events"
            with log.open("wb") as stderr:
                process = subprocess.Popen(
                    [*lockctl, "schedule", "--config", str(config)],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                )
            bench.processes.append(process)
            try:
                _first_ticks_done(process, log, SCHEDULER_JOBS)
                time.sleep(SETTLE_SECONDS)  # a figure taken once it is all up, not a sync
                figures.hwm_mb[tree].append(memory_mb(process.pid, "VmHWM"))
                figures.rss_mb[tree].append(memory_mb(process.pid, "VmRSS"))
            finally:
                _terminate(process)


def report(figures: Figures, runs: int, rounds: int, baseline: str) -> None:
    print(f"\nbefore: {baseline}; after: this checkout. Medians; p10..p90 for the skip.\n")
    print(f"{'metric':38}{'before':>10}{'after':>10}{'after/before':>14}")
    rows = (
        (f"skip, tick taken, whole run (ms), {runs}x", figures.skip_ms),
        ("  its CPU, user + system (ms)", figures.skip_cpu_ms),
        (f"scheduler peak RSS, VmHWM (MB), {rounds}x", figures.hwm_mb),
        (f"scheduler RSS, VmRSS (MB), {rounds}x", figures.rss_mb),
    )
    for label, series in rows:
        before, after = _median(series["before"]), _median(series["after"])
        print(f"{label:38}{before:10.1f}{after:10.1f}{after / before:14.2f}")
    spread = {tree: _spread(figures.skip_ms[tree]) for tree in TREES}
    print(f"{'  skip p10..p90 (ms)':38}{spread['before']:>14}{spread['after']:>14}")
    codes = {tree: ",".join(map(str, sorted(figures.skip_codes[tree]))) for tree in TREES}
    print(f"{'  skip exit codes':38}{codes['before']:>10}{codes['after']:>10}")


def _merge_base() -> str:
    done = subprocess.run(
        ["git", "-C", str(ROOT), "merge-base", "HEAD", "main"],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="a commit (default: git merge-base HEAD main)")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--subnet", default="127.0.13")
    args = parser.parse_args()
    baseline = args.baseline or _merge_base()
    with tempfile.TemporaryDirectory(prefix="lockctl-bench-entry-") as tmp:
        work = Path(tmp)
        before = baseline_tree(baseline, work)
        state_dir = work / "cluster"
        up = cluster_up(state_dir, ClusterShape(subnet=args.subnet, tls=False))
        bench: EntryBench | None = None
        try:
            layout = up.status.layout
            print(f"cluster up in {up.seconds:.1f} s (Consul {up.consul.version})")
            token = read_secret_file(layout.management_token_file)
            server = layout.servers[0].http_address
            management = Consul(ConsulSettings(address=server, token=token))
            addresses = {agent.name: agent.http_address for agent in layout.agents}
            bench = EntryBench(work, management, addresses)
            bench.trees = {"before": before, "after": ROOT}
            check_trees(bench)
            bench.grant()
            figures = Figures()
            skip_series(bench, args.runs, figures)
            scheduler_rounds(bench, args.rounds, figures)
            report(figures, args.runs, args.rounds, baseline[:12])
            return 0
        finally:
            if bench is not None:
                bench.stop_all()
            cluster_down(state_dir)


if __name__ == "__main__":
    os.environ.pop("CONSUL_HTTP_TOKEN", None)
    sys.exit(main())
