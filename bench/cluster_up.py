"""How long `lockctl cluster up` takes from nothing to a bootstrapped, healthy 5-agent cluster.

Runs up/down N times (default 5) on its own loopback subnet and a temporary state folder, and
prints each run, the median and the target (issue 2: under 10 s). `down` is timed too.

    .venv/bin/python bench/cluster_up.py [--runs 5] [--subnet 127.0.5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from provision.cluster.local import ClusterShape, cluster_down, cluster_up

TARGET_SECONDS = 10.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--subnet", default="127.0.5")
    args = parser.parse_args()
    ups, downs = [], []
    with tempfile.TemporaryDirectory(prefix="lockctl-bench-") as tmp:
        state_dir = Path(tmp) / "cluster"
        for run in range(1, args.runs + 1):
            try:
                result = cluster_up(state_dir, ClusterShape(subnet=args.subnet))
                assert result.status.healthy and result.bootstrapped
                ups.append(result.seconds)
            finally:
                began = time.monotonic()
                cluster_down(state_dir)
                downs.append(time.monotonic() - began)
            print(f"run {run}: up {ups[-1]:.2f} s   down {downs[-1]:.2f} s")
    median = statistics.median(ups)
    print(f"\n{'':24}{'median':>8}{'min':>8}{'max':>8}")
    print(f"{'lockctl cluster up':24}{median:8.2f}{min(ups):8.2f}{max(ups):8.2f}")
    print(
        f"{'lockctl cluster down':24}{statistics.median(downs):8.2f}{min(downs):8.2f}"
        f"{max(downs):8.2f}"
    )
    print(f"{'target (issue 2)':24}{TARGET_SECONDS:8.2f}")
    print(f"up median / target: {median / TARGET_SECONDS:.2f}")


if __name__ == "__main__":
    main()
