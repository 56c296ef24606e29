"""Two jobs at once in one process, as `lockctl schedule` runs them (one loop thread per job):
the end of one job never touches the other's process tree, and neither's exit status is taken
by the other's clean-up. Before the fix, a job in a PID namespace counted every later child of
the process as a stray of its own: the short job's end SIGKILLed the long job (exit 137, seen in
the scheduler's fault tests whenever both ran on one replica), and its tree looked alive for as
long as the other job ran."""

from __future__ import annotations

import json
import subprocess
import sys

TWO_JOBS = """
import json, os, signal, time
from provision.runner.child import Child
short = Child(["sleep", "0.2"], dict(os.environ))  # prepared first, as the first loop's job
long = Child(["sleep", "3"], dict(os.environ))
short.start({"LOCK_INDEX": "1"})
long.start({"LOCK_INDEX": "2"})
short.wait()
time.sleep(0.2)
alive_after_short = short.tree_alive()  # only its own tree counts
short.signal_tree(signal.SIGKILL)  # its clean-up: must not reach the other job
time.sleep(0.2)
print(json.dumps({
    "containment": short.containment,
    "short_alive": alive_after_short,
    "long_running": long.exit_status is None,
    "long_status": long.wait(),
}))
"""


def test_one_jobs_end_leaves_the_other_job_of_the_process_alone() -> None:
    done = subprocess.run(
        [sys.executable, "-c", TWO_JOBS], capture_output=True, text=True, timeout=60, check=True
    )
    seen = json.loads(done.stdout)
    assert seen["short_alive"] is False, "the other job's tree is not the short job's"
    assert seen["long_running"] is True, "the short job's clean-up killed the long job"
    assert seen["long_status"] == 0, seen
