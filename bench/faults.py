"""Fault soak: the fault scenarios N times at random, with `lockctl run`, with `consul lock`, and
(`--tools scheduler`) with three `lockctl schedule` replicas.

Each lab is its own namespace cluster (`lockctl cluster up --netns`: 3 servers, 3 workers; root
only). Faults are drawn at random from the scenarios (bench/faultlab/harness.py) and run one at a
time per lab, on a fresh job each; several labs run side by side with --labs. No new fault starts
after --max-minutes. Both tools use the same Consul binary, the same job (a process tree: main,
child, TERM-ignoring grandchild, setsid'd daemon, each writing to the oracle) and the same oracle;
lockctl with TTL 10s, LockDelay 5s, renew 2s, kill grace 1s; `consul lock` with its own fixed
TTL 15s and LockDelay 15s (its child gets no LockIndex, so the oracle cannot fence it). The
scheduler (bench/faultlab/scheduler.py) has lockctl's timings, a short and a long job on
`@every 5s`, and every scenario but kill9-both (its `kill9-runner` kills `lockctl schedule`).

    sudo .venv/bin/python bench/faults.py --faults 30 [--tools lockctl,consul-lock] [--labs 2]
        [--scenarios sigstop,cut-host] [--max-minutes 40] [--seed 1] [--json out.json]

Prints, per tool and scenario: faults, overlaps and survivors (processes of the job alive past
their bound after their runner ended; both must be 0 for lockctl), fence rejections, jobs killed
late (must be 0 where the runner was not paused), takeover min/median/max against its bound, runs
with any broken promise; for the scheduler also its ticks (run, run twice, missed, missed outside
the takeover bound, unrecorded, missed per fault); then overlaps and survivors of the tools side
by side. Exit 1 if lockctl (run or scheduler) broke one.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.faultlab import scheduler
from bench.faultlab.harness import (
    SCENARIOS,
    TOOLS,
    FaultLab,
    RunResult,
    fault_lab,
    run_scenario,
    summary,
)
from bench.faultlab.scheduler import SchedulerResult

ALL_TOOLS = (*TOOLS, scheduler.TOOL)


def scenarios_of(tool: str, scenarios: list[str]) -> list[str]:
    """The chosen scenarios this tool has (the scheduler has no kill9-both: its jobs' trees are
    the runner's, killed the same way)."""
    return [s for s in scenarios if tool != scheduler.TOOL or s in scheduler.SCENARIOS]


def run_one(lab: FaultLab, scenario: str, tool: str, number: int, fleet: int = 0) -> RunResult:
    if tool == scheduler.TOOL:
        return scheduler.run_scenario(lab, scenario, number, fleet)
    return run_scenario(lab, scenario, tool, number)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--faults", type=int, default=30, help="faults per tool")
    parser.add_argument("--tools", default=",".join(TOOLS), help=f"of {', '.join(ALL_TOOLS)}")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--labs", type=int, default=1, help="namespace clusters side by side")
    parser.add_argument("--max-minutes", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None, help="write every run here")
    parser.add_argument(
        "--fleet",
        type=int,
        default=0,
        help="scheduler: this many more jobs per scheduler beside the short and the long one",
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/faults.py: needs root (network namespaces)", file=sys.stderr)
        return 2
    tools = [t for t in args.tools.split(",") if t]
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = sorted(set(tools) - set(ALL_TOOLS)) + sorted(set(scenarios) - set(SCENARIOS))
    if unknown:
        print(f"unknown tool or scenario: {', '.join(unknown)}", file=sys.stderr)
        return 2
    if any(not scenarios_of(tool, scenarios) for tool in tools):
        print(f"--tools {scheduler.TOOL}: none of its scenarios chosen", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    plan = [
        (tool, rng.choice(scenarios_of(tool, scenarios)))
        for tool in tools
        for _ in range(args.faults)
    ]
    rng.shuffle(plan)
    work: queue.Queue[tuple[int, str, str]] = queue.Queue()
    for number, (tool, scenario) in enumerate(plan, 1):
        work.put((number, tool, scenario))
    stop_at = time.monotonic() + args.max_minutes * 60
    results: list[RunResult] = []
    errors: list[str] = []
    guard = threading.Lock()
    began = time.monotonic()

    def lab_worker(lab_number: int, root: Path) -> None:
        try:
            with fault_lab(root / f"lab{lab_number}") as lab:
                while time.monotonic() < stop_at:
                    try:
                        number, tool, scenario = work.get_nowait()
                    except queue.Empty:
                        return
                    try:
                        result = run_one(lab, scenario, tool, number, args.fleet)
                    except Exception as exc:  # a harness failure: record it, keep soaking
                        with guard:
                            errors.append(f"#{number} {tool} {scenario}: {exc!r}")
                        print(f"harness error: #{number} {tool} {scenario}: {exc!r}", flush=True)
                        lab.wait_healthy()
                        continue
                    with guard:
                        results.append(result)
                        done = len(results)
                    status = "ok" if not result.problems() else "; ".join(result.problems())
                    took = "-" if result.takeover is None else f"{result.takeover:.1f}s"
                    if isinstance(result, SchedulerResult):
                        status = f"ticks ran {result.ran} missed {result.missed}: {status}"
                    print(
                        f"[{time.monotonic() - began:6.0f}s] {done:3d}/{len(plan)} lab{lab_number} "
                        f"{tool:11s} {scenario:13s} holder {result.holder} takeover {took} "
                        f"rejections {result.rejections} survivors {result.survivors}: {status}",
                        flush=True,
                    )
        except Exception as exc:
            with guard:
                errors.append(f"lab{lab_number}: {exc!r}")
            print(f"harness error: lab{lab_number}: {exc!r}", flush=True)

    with tempfile.TemporaryDirectory(prefix="lockctl-faults-") as tmp:
        threads = [
            threading.Thread(target=lab_worker, args=(n, Path(tmp)), daemon=True)
            for n in range(1, args.labs + 1)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    for error in errors:
        print(f"harness error: {error}")
    print(report(results, tools, scenarios, time.monotonic() - began))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2, default=str))
    broken = [r for r in results if r.tool != "consul-lock" and r.problems()]
    return 1 if broken or errors else 0


def report(results: list[RunResult], tools: list[str], scenarios: list[str], took: float) -> str:
    header = (
        f"{'tool':11s} {'scenario':13s} {'faults':>6s} {'overlaps':>8s} {'survivors':>9s} "
        f"{'rejected':>8s} {'late kills':>10s} {'takeover s min/med/max':>22s} {'bound s':>7s} "
        f"{'kept':>4s} {'broken':>6s}"
    )
    lines = [f"{len(results)} faults in {took / 60:.1f} min", header, "-" * len(header)]
    for tool in tools:
        for scenario in [*scenarios, "all"]:
            runs = [r for r in results if r.tool == tool and scenario in ("all", r.scenario)]
            if not runs:
                continue
            takeovers = [r.takeover for r in runs if r.takeover is not None]
            bounds = sorted({r.bound for r in runs})
            late = sum(r.late_kills for r in runs if r.late_kills_checked)
            lines.append(
                f"{tool:11s} {scenario:13s} {len(runs):6d} {sum(r.overlaps for r in runs):8d} "
                f"{sum(r.survivors for r in runs):9d} "
                f"{sum(r.rejections for r in runs):8d} {late:10d} {summary(takeovers):>22s} "
                f"{'/'.join(f'{b:g}' for b in bounds):>7s} "
                f"{sum(r.holder_kept for r in runs):4d} {sum(bool(r.problems()) for r in runs):6d}"
            )
        cut = [r for r in results if r.tool == tool and r.detection is not None]
        if cut:
            over = [r.takeover - r.detection for r in cut if r.takeover is not None]
            lines.append(
                f"{tool:11s} cut-host: session invalidated {summary([r.detection for r in cut])} s "
                f"after the cut; takeover {summary(over)} s after that (bound: LockDelay + "
                f"{'one interval + ' if tool == scheduler.TOOL else ''}2 s)"
            )
        worst = [r for r in results if r.tool == tool and r.overlaps]
        if worst:
            longest = max(r.overlap_max for r in worst)
            lines.append(f"{tool:11s} longest overlap {longest:.1f} s")
        late_max = [r.late_kill_max for r in results if r.tool == tool and r.late_kills_checked]
        if any(late_max):
            lines.append(f"{tool:11s} latest child kill {max(late_max):.1f} s after takeover")
        lines.append("")
    lines += scheduler_ticks(results)
    return "\n".join(lines + side_by_side(results, tools, scenarios))


def scheduler_ticks(results: list[RunResult]) -> list[str]:
    """The scheduler's own figures per scenario: ticks run and missed, and what broke."""
    runs = [r for r in results if isinstance(r, SchedulerResult)]
    if not runs:
        return []
    header = (
        f"{'scheduler':13s} {'faults':>6s} {'ticks':>6s} {'ran':>5s} {'twice':>5s} "
        f"{'missed':>6s} {'by overlap':>10s} {'unexcused':>9s} {'unrecorded':>10s} "
        f"{'missed per fault min/med/max':>28s}"
    )
    lines = [header, "-" * len(header)]
    for scenario in [*scheduler.SCENARIOS, "all"]:
        chosen = [r for r in runs if scenario in ("all", r.scenario)]
        if not chosen:
            continue
        verdicts = [v for r in chosen for v in r.verdicts]
        # missed per fault: the faulted (long) job's ticks lost to the fault, not its overlaps
        per_fault = [
            float(v.missed - v.missed_by_overlap)
            for r in chosen
            for v in r.verdicts
            if v.job == r.job
        ]
        lines.append(
            f"{scenario:13s} {len(chosen):6d} {sum(v.checked for v in verdicts):6d} "
            f"{sum(v.ran for v in verdicts):5d} {sum(len(v.twice) for v in verdicts):5d} "
            f"{sum(v.missed for v in verdicts):6d} "
            f"{sum(v.missed_by_overlap for v in verdicts):10d} "
            f"{sum(len(v.unexcused) for v in verdicts):9d} "
            f"{sum(len(v.unrecorded) for v in verdicts):10d} {summary(per_fault):>28s}"
        )
    lines.append(
        f"scheduler takeover bound: 2 x TTL + LockDelay + one interval + 5 s = "
        f"{scheduler.TAKEOVER_BOUND:g} s; ticks inside it may be missed, and are recorded so"
    )
    return [*lines, ""]


def side_by_side(results: list[RunResult], tools: list[str], scenarios: list[str]) -> list[str]:
    """Per scenario, each tool's faults / overlaps / survivors in one row: the comparison."""
    header = f"{'scenario':13s} " + " ".join(
        f"{tool + ' faults/overlaps/survivors':>34s}" for tool in tools
    )
    lines = [header, "-" * len(header)]
    for scenario in [*scenarios, "all"]:
        cells = []
        for tool in tools:
            runs = [r for r in results if r.tool == tool and scenario in ("all", r.scenario)]
            overlaps = sum(r.overlaps for r in runs)
            left = sum(r.survivors for r in runs)
            cell = f"{len(runs)} / {overlaps} / {left}" if runs else "-"
            cells.append(f"{cell:>34s}")
        lines.append(f"{scenario:13s} " + " ".join(cells))
    roles = {tool: _survivor_roles(results, tool) for tool in tools}
    lines += [f"{tool} survivors by role: {roles[tool] or 'none'}" for tool in tools]
    return lines


def _survivor_roles(results: list[RunResult], tool: str) -> str:
    """`daemon 7, grandchild 3`: what kind of process survived, over all of `tool`'s runs."""
    counts: dict[str, int] = {}
    for result in results:
        if result.tool == tool:
            for seen in result.survivors_seen:
                role = seen.split()[1].rstrip(":")  # "<pid> <role>: how it was seen"
                counts[role] = counts.get(role, 0) + 1
    return ", ".join(f"{role} {n}" for role, n in sorted(counts.items(), key=lambda i: -i[1]))


if __name__ == "__main__":
    sys.exit(main())
