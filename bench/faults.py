"""Fault soak: the fault scenarios N times at random, with `lockctl run` and with `consul lock`.

Each lab is its own namespace cluster (`lockctl cluster up --netns`: 3 servers, 3 workers; root
only). Faults are drawn at random from the scenarios (bench/faultlab/harness.py) and run one at a
time per lab, on a fresh job each; several labs run side by side with --labs. No new fault starts
after --max-minutes. Both tools use the same Consul binary, the same job (a process tree: main,
child, TERM-ignoring grandchild, setsid'd daemon, each writing to the oracle) and the same oracle;
lockctl with TTL 10s, LockDelay 5s, renew 2s, kill grace 1s; `consul lock` with its own fixed
TTL 15s and LockDelay 15s (its child gets no LockIndex, so the oracle cannot fence it).

    sudo .venv/bin/python bench/faults.py --faults 30 [--tools lockctl,consul-lock] [--labs 2]
        [--scenarios sigstop,cut-host] [--max-minutes 40] [--seed 1] [--json out.json]

Prints, per tool and scenario: faults, overlaps and survivors (processes of the job alive past
their bound after their runner ended; both must be 0 for lockctl), fence rejections, jobs killed
late (must be 0 where the runner was not paused), takeover min/median/max against its bound, runs
with any broken promise; then overlaps and survivors of the two tools side by side. Exit 1 if
lockctl broke one.
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

from bench.faultlab.harness import (
    SCENARIOS,
    TOOLS,
    RunResult,
    fault_lab,
    run_scenario,
    summary,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--faults", type=int, default=30, help="faults per tool")
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--labs", type=int, default=1, help="namespace clusters side by side")
    parser.add_argument("--max-minutes", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None, help="write every run here")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/faults.py: needs root (network namespaces)", file=sys.stderr)
        return 2
    tools = [t for t in args.tools.split(",") if t]
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = sorted(set(tools) - set(TOOLS)) + sorted(set(scenarios) - set(SCENARIOS))
    if unknown:
        print(f"unknown tool or scenario: {', '.join(unknown)}", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    plan = [(tool, rng.choice(scenarios)) for tool in tools for _ in range(args.faults)]
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
                        result = run_scenario(lab, scenario, tool, number)
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
    broken = [r for r in results if r.tool == "lockctl" and r.problems()]
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
                f"after the cut; takeover {summary(over)} s after that (bound: LockDelay + 2 s)"
            )
        worst = [r for r in results if r.tool == tool and r.overlaps]
        if worst:
            longest = max(r.overlap_max for r in worst)
            lines.append(f"{tool:11s} longest overlap {longest:.1f} s")
        late_max = [r.late_kill_max for r in results if r.tool == tool and r.late_kills_checked]
        if any(late_max):
            lines.append(f"{tool:11s} latest child kill {max(late_max):.1f} s after takeover")
        lines.append("")
    return "\n".join(lines + side_by_side(results, tools, scenarios))


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
