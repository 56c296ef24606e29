"""A fleet-sized spec, whole process: `render`, `plan` and `apply` of N jobs (default 10,000).

Generates a spec of N jobs on 50 declared workers (each job with its own prefix, 3-50 workers
listed, a schedule and a command), starts its own local cluster (3 servers, 3 client agents,
TLS, its own loopback subnet and a temporary state folder), and times each CLI command as a
whole process, the way an operator or CI runs it (interpreter start, imports, spec parse and
validation, render and lint, Consul calls, output):

    lockctl render --spec F --out DIR        (target: 10 s)
    lockctl plan   (nothing applied yet: every object to create)
    lockctl apply  (the first, real one: N + 50 policies, 50 tokens, 50 token files; once)
    lockctl plan   (no-op: Consul matches the spec)   (target: 10 s)
    lockctl apply  (no-op)                            (target: 10 s)

render, the no-op plan and the no-op apply run --runs times (median shown); the first apply
once, since undoing it means deleting N policies. Then each command runs once more under
cProfile, and the functions it spends its time in are printed. The cluster is stopped at the end.

    .venv/bin/python bench/spec_scale.py [--jobs 10000] [--runs 3] [--subnet 127.0.4]
        [--no-profile] [--keep DIR] [--tree DIR]

--tree runs the commands from another checkout of lockctl (PYTHONPATH=DIR), to compare a change
side by side with the same spec and cluster.
"""

from __future__ import annotations

import argparse
import os
import pstats
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from provision.cluster.local import ClusterShape, cluster_down, cluster_env, cluster_up

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 10.0
WORKERS = 50
MIN_PER_JOB, MAX_PER_JOB = 3, 50
SCHEDULES = ("@hourly", "*/5 * * * *", "0 2 * * *", "@every 10s", "15 * * * *", "@daily")
PROFILE_LINES = 14


def generated_spec(jobs: int, workers: int = WORKERS, seed: int = 20) -> str:
    """N jobs on `workers` declared workers, deterministic for a seed."""
    rng = random.Random(seed)
    names = [f"w{n:02d}" for n in range(1, workers + 1)]
    lines = ["defaults {", '  ttl = "15s"', "}"]
    lines += [f'worker "{w}" {{}}' for w in names]
    for n in range(1, jobs + 1):
        count = rng.randint(MIN_PER_JOB, min(MAX_PER_JOB, workers))
        runs_on = ",".join(f'"{w}"' for w in sorted(rng.sample(names, count)))
        lines += [
            f'job "j{n:05d}" {{',
            f'  prefix = "locks/j{n:05d}/"',
            f"  workers = [{runs_on}]",
            f'  schedule = "{SCHEDULES[n % len(SCHEDULES)]}"',
            f'  command = ["/usr/local/bin/job", "{n}"]',
            "}",
        ]
    return "\n".join(lines) + "\n"


@dataclass
class Figures:
    """Seconds per command, each run."""

    runs: dict[str, list[float]] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)

    def add(self, name: str, seconds: float, note: str = "") -> None:
        self.runs.setdefault(name, []).append(seconds)
        if note:
            self.notes[name] = note


@dataclass
class Command:
    env: dict[str, str]
    work: Path
    exits: list[int] = field(default_factory=list)

    @property
    def last_exit(self) -> int:
        return self.exits[-1]

    def argv(self, name: str, *extra: str) -> list[str]:
        spec = str(self.work / "spec.hcl")
        if name == "render":
            return ["render", "--spec", spec, *extra]
        return [name, "--spec", spec, "--secrets-dir", str(self.work / "secrets"), *extra]

    def run(self, name: str, *extra: str, ok: tuple[int, ...] = (0,)) -> tuple[float, str]:
        """Run `lockctl NAME ...` as a whole process; its wall time and its last output line."""
        argv = [sys.executable, "-m", "provision", *self.argv(name, *extra)]
        began = time.perf_counter()
        done = subprocess.run(
            argv, env=self.env, cwd=self.work, capture_output=True, text=True, check=False
        )
        seconds = time.perf_counter() - began
        self.exits.append(done.returncode)
        if done.returncode not in ok:
            tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
            raise SystemExit(f"lockctl {name} exited {done.returncode}:\n" + "\n".join(tail))
        lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        if done.returncode == 0:
            lines = [line for line in done.stdout.splitlines() if line.strip()]
        return seconds, lines[-1][:110] if lines else ""

    def profile(self, name: str, *extra: str, ok: tuple[int, ...] = (0,)) -> pstats.Stats:
        out = self.work / f"{name}.prof"
        argv = [sys.executable, "-m", "cProfile", "-o", str(out), "-m", "provision"]
        argv += self.argv(name, *extra)
        done = subprocess.run(
            argv, env=self.env, cwd=self.work, capture_output=True, text=True, check=False
        )
        if done.returncode not in ok:
            raise SystemExit(f"profiled lockctl {name} exited {done.returncode}: {done.stderr}")
        return pstats.Stats(str(out))


def environment(state_dir: Path, tree: Path | None) -> dict[str, str]:
    """`eval "$(lockctl cluster env)"`, plus PYTHONPATH for --tree."""
    found = cluster_env(state_dir)
    env = {k: v for k, v in os.environ.items() if k not in found.unset}
    env.update(dict(found.exports))
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    return env


def print_profile(name: str, stats: pstats.Stats) -> None:
    """The functions with the most time of their own, and the lockctl ones by cumulative time."""
    raw = stats.stats  # type: ignore[attr-defined]
    total = max((v[3] for v in raw.values()), default=0.0)
    print(f"\n--- profile: lockctl {name} ({total:.2f} s under cProfile)")
    own = sorted(raw.items(), key=lambda item: item[1][2], reverse=True)[:PROFILE_LINES]
    print(f"  {'own s':>7} {'cum s':>7} {'calls':>9}  function (most time of its own)")
    for (path, line, func), (_, calls, tottime, cumtime, _) in own:
        print(f"  {tottime:7.2f} {cumtime:7.2f} {calls:9d}  {_where(path, line, func)}")
    mine = [item for item in raw.items() if "/provision/" in item[0][0]]
    mine.sort(key=lambda item: item[1][3], reverse=True)
    print(f"  {'':>7} {'cum s':>7} {'calls':>9}  lockctl's functions (cumulative)")
    for (path, line, func), (_, calls, _, cumtime, _) in mine[:PROFILE_LINES]:
        print(f"  {'':>7} {cumtime:7.2f} {calls:9d}  {_where(path, line, func)}")


def _where(path: str, line: int, func: str) -> str:
    for marker in ("/provision/", "/site-packages/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    else:
        path = Path(path).name
    return f"{path}:{line}({func})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--subnet", default="127.0.4")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--tree", type=Path, help="run lockctl from this checkout (PYTHONPATH)")
    parser.add_argument(
        "--keep", type=Path, help="work in this folder and keep it (not the cluster)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lockctl-bench-spec-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        spec_text = generated_spec(args.jobs)
        (work / "spec.hcl").write_text(spec_text)
        listed = sum(line.count('"w') for line in spec_text.splitlines() if "workers" in line)
        print(
            f"spec: {args.jobs} jobs, {WORKERS} workers, {listed} worker listings, "
            f"{spec_text.count(chr(10))} lines, {len(spec_text.encode()) / 1e6:.2f} MB"
        )
        state_dir = Path(tmp) / "cluster"
        figures = Figures()
        try:
            up = cluster_up(state_dir, ClusterShape(subnet=args.subnet, workers=3))
            print(f"cluster: up in {up.seconds:.1f} s on {args.subnet}.x")
            command = Command(environment(state_dir, args.tree), work)
            measure(command, figures, args.runs)
            if not args.no_profile:
                out = str(work / "policies-profile")
                print_profile("render (new folder)", command.profile("render", "--out", out))
                print_profile("plan (no-op)", command.profile("plan"))
                print_profile("apply (no-op)", command.profile("apply"))
        finally:
            cluster_down(state_dir)
    report(figures, args.jobs, args.runs)


def measure(command: Command, figures: Figures, runs: int) -> None:
    for run in range(1, runs + 1):
        seconds, last = command.run("render", "--out", str(command.work / f"policies-{run}"))
        figures.add("render (new folder)", seconds, last)
        print(f"render into a new folder, run {run}: {seconds:.2f} s   {last}")
    for run in range(1, runs + 1):
        seconds, last = command.run("render", "--out", str(command.work / "policies-1"))
        figures.add("render (up to date)", seconds, last)
        print(f"render again, nothing to write, run {run}: {seconds:.2f} s   {last}")
    seconds, last = command.run("plan", ok=(2,))
    figures.add("plan (all to create)", seconds, last)
    print(f"plan before apply: {seconds:.2f} s   {last}")
    total, tries = 0.0, 0
    while True:  # Consul may lose its leader under 10,000 writes: apply again converges
        tries += 1
        seconds, last = command.run("apply", ok=(0, 3, 5) if tries < 4 else (0,))
        total += seconds
        print(f"first apply, try {tries}: {seconds:.2f} s   {last}")
        if command.last_exit == 0:
            break
    figures.add("apply (first, real)", total, f"{tries} tries" if tries > 1 else "")
    for run in range(1, runs + 1):
        seconds, last = command.run("plan")
        figures.add("plan (no-op)", seconds, last)
        print(f"no-op plan run {run}: {seconds:.2f} s   {last}")
        seconds, last = command.run("apply")
        figures.add("apply (no-op)", seconds, last)
        print(f"no-op apply run {run}: {seconds:.2f} s   {last}")


def report(figures: Figures, jobs: int, runs: int) -> None:
    targeted = {"render (new folder)", "render (up to date)", "plan (no-op)", "apply (no-op)"}
    print(f"\n{jobs} jobs, whole process ({runs} runs; the first apply once)")
    print(f"{'command':24}{'median s':>10}{'min':>8}{'max':>8}{'target':>9}   verdict / note")
    for name, values in figures.runs.items():
        target = f"{TARGET_S:.0f} s" if name in targeted else "-"
        median = statistics.median(values)
        verdict = ("ok" if median <= TARGET_S else "MISS") if name in targeted else ""
        note = figures.notes.get(name, "") if name == "apply (first, real)" else ""
        print(
            f"{name:24}{median:10.2f}{min(values):8.2f}{max(values):8.2f}{target:>9}   "
            f"{verdict}{note}"
        )


if __name__ == "__main__":
    main()
