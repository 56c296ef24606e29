"""The demo's small app (seed 003): a Python app with its own in-process scheduler, a plain loop
that fires every 2 seconds in each of its replicas. Its scheduled function is behind lockctl
(provision.embed, docs/embedding.md), so each tick of the job runs in one replica only; the
others are told why not.

    .venv/bin/python scripts/demo_app.py CONFIG JOB SECONDS

CONFIG is the worker config `lockctl worker-config` wrote for this replica's worker. Each call
that ran its body prints one line; lockctl's events (a JSON line for every call: acquired and
released, or skipped and why) go to stderr, and the ledger keeps the record of each tick.
"""

from __future__ import annotations

import sys
import time

from provision.embed import Locker, Run

FIRES_EVERY = 2.0  # seconds: the app's own scheduler, not the job's schedule


def main(config: str, job: str, seconds: float) -> int:
    locker = Locker.from_config(config)

    @locker.singleton(job)
    def refresh(run: Run) -> None:
        tick = run.tick.strftime("%H:%M:%S")
        print(f"  >> app on {run.worker}: tick {tick}, fencing token {run.lock_index}", flush=True)
        time.sleep(1.0)  # the work: publish with fence=run.lock_index

    stop_at = time.monotonic() + seconds
    try:
        while time.monotonic() < stop_at:
            refresh()  # in every replica: the claim decides which one runs the body
            time.sleep(FIRES_EVERY)
    finally:
        locker.close()  # records completed, sessions destroyed
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
