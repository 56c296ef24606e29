"""The test job: enter the oracle with its LockIndex, write while it works, leave.

    job.py SOCKET JOB WORKER SECONDS FAULTS-MARKER

Run by `lockctl run` (LOCK_INDEX and LOCK_SESSION in the environment) or by `consul lock` (no
fencing token: it sends none). Writes every STEP seconds, so a job resumed after SIGSTOP writes at
once, and the oracle sees (and rejects) the stale writer. Standard library only. The last
argument is an inert marker, so leftover jobs can be found by their argv.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

STEP = 0.2


def main() -> int:
    path, job, worker, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    index = os.environ.get("LOCK_INDEX")
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(path)
    stream = client.makefile("rwb")

    def send(message: dict[str, object]) -> bool:
        stream.write(json.dumps(message).encode() + b"\n")
        stream.flush()
        return bool(json.loads(stream.readline())["ok"])

    entered = send(
        {
            "op": "enter",
            "job": job,
            "worker": worker,
            "session": os.environ.get("LOCK_SESSION"),
            "lock_index": None if index is None else int(index),
            "pid": os.getpid(),
        }
    )
    if not entered:
        return 3
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        time.sleep(STEP)
        if not send({"op": "write"}):
            return 4  # fenced by the resource: a newer holder exists
    send({"op": "exit"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
