"""Survivors: processes of a fault run still alive after their runner ended, found in /proc.

Every process a run starts carries the lab's marker and the job's name in its argv: the runners
(`lockctl run ... -- job.py ... JOB ... MARKER`, `consul lock ... job.py ...`), lockctl's
`unshare` and its init (nsinit.py), and every member of the job's process tree (forked members
keep job.py's argv). Once the runners have ended, any of them still alive (not a zombie) is a
survivor. Only such processes are ever signalled here, by PID, after their argv was checked
again: processes this lab started, never anything found by name alone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

from provision.system.deadline import Deadline, attempts
from provision.system.processes import is_running

POLL = 0.05
KILL_WAIT = 5.0  # seconds for SIGKILLed survivors to be gone


def argv_of(pid: int) -> list[str] | None:
    """The argv of a living process, or None (gone, a zombie, or a kernel thread)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None
    if state == "Z" or not raw:
        return None
    return raw.decode(errors="replace").split("\0")


def marked(marker: str, job: str | None = None) -> dict[int, list[str]]:
    """Living processes whose argv has `marker` (and `job`, if given) as arguments: pid -> argv."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        argv = argv_of(int(name))
        if argv is not None and marker in argv and (job is None or job in argv):
            found[int(name)] = argv
    return found


def alive(pids: Iterable[int], marker: str) -> list[int]:
    """Which of `pids` are still alive and still ours (their argv still has `marker`)."""
    return [pid for pid in pids if is_running(pid, marker)]


def wait_gone(
    marker: str, timeout: float, *, job: str | None = None, pids: Iterable[int] | None = None
) -> dict[int, list[str]]:
    """Wait up to `timeout` for the marked processes (of `job`, or only `pids`) to be gone;
    those still alive then: pid -> argv."""
    watched = None if pids is None else set(pids)

    def left() -> dict[int, list[str]]:
        found = marked(marker, job)
        return found if watched is None else {p: a for p, a in found.items() if p in watched}

    survivors: dict[int, list[str]] = {}
    for _ in attempts(Deadline(timeout), POLL):
        survivors = left()
        if not survivors:
            break
    return survivors


def kill(pids: Iterable[int], marker: str) -> list[int]:
    """SIGKILL each of `pids` that is still ours, and wait (bounded) until they are gone."""
    killed = []
    for pid in alive(pids, marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    deadline = time.monotonic() + KILL_WAIT
    while alive(killed, marker) and time.monotonic() < deadline:
        time.sleep(POLL)
    return killed


def describe(argv: list[str], role: str | None) -> str:
    """The job member's role (`daemon`), else the program (`nsinit.py`, `unshare`, `consul`)."""
    if role is not None:
        return role
    program = next((Path(a).name for a in argv[1:4] if a.endswith(".py")), Path(argv[0]).name)
    return program
