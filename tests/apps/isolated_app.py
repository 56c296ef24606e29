"""An app whose one body runs with isolation="process", driven without Consul: the lock's
confirmations are this script's own, so a test can kill it, stop it, or stop confirming.

    python -m tests.apps.isolated_app STATE FENCE_AFTER KILL_AFTER CONFIRM_FOR

The body starts two children that write their PIDs (the host's) to STATE/child-N.pid: one
plain, one that leaves the body's session (setsid) and ignores SIGTERM; then it calls
run.check() in a loop (SIGTERM ignored, so only SIGKILL ends it), noting in STATE/checks the
seconds since the start of every 0.1 s of checks that passed, and `lost` once check() raises.
The app confirms the lock every 0.1 s for CONFIRM_FOR seconds (from the start), writing each
confirmation's time to STATE/confirmed, then waits for the body and prints its exit status.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from provision.embed import LockLost, Run
from provision.embed.bodies import ProcessBody
from provision.embed.run import RunEvents
from provision.fencing import BodyFence, FenceBounds

CHILD = (
    "import os, signal, sys, time\n"
    "if sys.argv[2] == '1':\n"
    "    os.setsid()\n"
    "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "open(sys.argv[1] + '.tmp', 'w').write(os.readlink('/proc/self'))\n"
    "os.rename(sys.argv[1] + '.tmp', sys.argv[1])\n"
    "time.sleep(300)\n"
)
LOCK_ENV = {
    "LOCKCTL_TICK": "2026-12-06T00:00:00Z",
    "LOCKCTL_JOB": "isolated",
    "LOCKCTL_WORKER": "worker-1",
    "LOCK_INDEX": "7",
    "LOCK_SESSION": "not-a-session",
}


class Confirmations:
    """What a held lock's session would confirm: the newest send time, and its followers."""

    def __init__(self) -> None:
        self.at = time.monotonic()
        self.followers: list[Callable[[float], None]] = []
        self.guard = threading.Lock()

    def confirm(self) -> None:
        with self.guard:
            self.at = time.monotonic()
            for follower in self.followers:
                follower(self.at)

    def follow(self, follower: Callable[[float], None]) -> Callable[[], None]:
        with self.guard:
            self.followers.append(follower)
        return lambda: self.followers.remove(follower)


def body(state: Path) -> Callable[[Run], None]:
    def run_body(run: Run) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for number, escape in ((1, "0"), (2, "1")):
            child = [sys.executable, "-c", CHILD, str(state / f"child-{number}.pid"), escape]
            subprocess.Popen(child)
        started = time.monotonic()
        with open(state / "checks", "a", buffering=1) as checks:
            try:
                while True:
                    for _ in range(50):
                        run.check()
                        time.sleep(0.002)
                    checks.write(f"{time.monotonic() - started:.3f}\n")
            except LockLost:
                checks.write("lost\n")
        while True:
            time.sleep(1)

    return run_body


def main() -> None:
    state, fence_after, kill_after = Path(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    confirm_for = float(sys.argv[4])
    confirmations = Confirmations()
    bounds = FenceBounds(fence_after, kill_after, kill_after - fence_after)
    fence = BodyFence(bounds, time.monotonic, lambda: confirmations.at, confirmations.follow)
    with open(os.devnull, "w") as quiet:
        process = ProcessBody(
            body(state), RunEvents("isolated", "w", quiet, "flag"), lambda t: None
        )
        process.start(LOCK_ENV, fence)
        (state / "keeper.pid").write_text(f"{process.pid} {process.containment}")
        until = time.monotonic() + confirm_for
        with open(state / "confirmed", "a", buffering=1) as confirmed:
            while time.monotonic() < until and process.exit_status is None:
                confirmations.confirm()
                confirmed.write(f"{time.time():.3f}\n")
                time.sleep(0.1)
        print(process.wait(), flush=True)
        process.close()


if __name__ == "__main__":
    main()
