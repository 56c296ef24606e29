"""The test job: a process tree whose every member enters the oracle and writes while it works.

    job.py SOCKET JOB WORKER SECONDS FAULTS-MARKER

Run by `lockctl run` or `lockctl schedule` (LOCK_INDEX and LOCK_SESSION in the environment, and
for a scheduled tick LOCKCTL_TICK) or by `consul lock` (no fencing token: it sends none). The
main process enters the oracle, then starts the rest of the tree, the kinds of process a real job
leaves behind (issue 13 A):

- `child`: a plain child (fork), default signal handling;
- `grandchild`: the child's child, ignoring SIGTERM (only SIGKILL ends it);
- `daemon`: a double-forked daemon in a session of its own (setsid), ignoring SIGTERM and
  SIGHUP, re-parented to whatever reaps orphans once its parent is gone.

Each member opens its own connection and enters with the same identity (job, worker, session,
LockIndex, and `run`, a random id the main process draws, which tells this holder's members
from the next holder's), then writes every STEP seconds while it is alive: a member that outlives
its lock writes beside the next holder, and the oracle sees an overlap (or, with a LockIndex, a
refused stale write). The members keep writing when a write is refused (a careless job); the
main process stops (a job that honours the resource's fence). The daemon works a little longer
than the main process, so it is also the leftover of a job that ended normally.

Writes every STEP seconds, so a job resumed after SIGSTOP writes at once. Standard library only.
Forked members keep the main process's argv, so every member carries the last argument, an
inert marker, and leftovers can be found by it in /proc.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
import uuid

STEP = 0.2
DAEMON_EXTRA = 5.0  # seconds the daemon works past the main process's end
ROLES = ("main", "child", "grandchild", "daemon")


class Client:
    """One member's connection to the oracle."""

    def __init__(self, path: str) -> None:
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.socket.connect(path)
        self.stream = self.socket.makefile("rwb")

    def send(self, message: dict[str, object]) -> bool:
        self.stream.write(json.dumps(message).encode() + b"\n")
        self.stream.flush()
        return bool(json.loads(self.stream.readline())["ok"])

    def close(self) -> None:
        """In a forked member: let go of the parent's connection, or the oracle would see the
        parent's section open for as long as the member lives."""
        self.stream.close()
        self.socket.close()


def main() -> int:
    path, job, worker, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    index = os.environ.get("LOCK_INDEX")
    identity: dict[str, object] = {
        "job": job,
        "worker": worker,
        "session": os.environ.get("LOCK_SESSION"),
        "lock_index": None if index is None else int(index),
        "run": uuid.uuid4().hex,
        "tick": os.environ.get("LOCKCTL_TICK"),  # a scheduled run's tick (None: not one)
    }
    until = time.monotonic() + seconds
    client = Client(path)
    if not client.send({"op": "enter", **identity, "role": "main", "pid": os.getpid()}):
        return 3
    _start_child(client, path, identity, until)
    _start_daemon(client, path, identity, until + DAEMON_EXTRA)
    while time.monotonic() < until:
        time.sleep(STEP)
        if not client.send({"op": "write"}):
            return 4  # fenced by the resource: a newer holder exists
    client.send({"op": "exit"})
    return 0


def _start_child(main: Client, path: str, identity: dict[str, object], until: float) -> None:
    """The child, which starts the TERM-ignoring grandchild and then works itself."""
    if os.fork():
        return
    main.close()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _member(path, identity, "grandchild", until)
    _member(path, identity, "child", until)


def _start_daemon(main: Client, path: str, identity: dict[str, object], until: float) -> None:
    """The classic daemon: fork, setsid, fork again, the middle process exits at once."""
    first = os.fork()
    if first:
        os.waitpid(first, 0)
        return
    main.close()
    os.setsid()
    if os.fork():
        os._exit(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    _member(path, identity, "daemon", until)


def _member(path: str, identity: dict[str, object], role: str, until: float) -> None:
    """Enter and write until `until`, refused or not (a careless member); never returns."""
    try:
        client = Client(path)
        client.send({"op": "enter", **identity, "role": role, "pid": os.getpid()})
        while time.monotonic() < until:
            time.sleep(STEP)
            client.send({"op": "write"})
        client.send({"op": "exit"})
    except (OSError, ValueError):
        pass  # the oracle went away: the lab is being torn down
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
