"""A small app with its own in-process scheduler (APScheduler 3, a 2-second interval) whose one
scheduled function is behind lockctl: `python -m tests.apps.embed_app CONFIG JOB STATE MODE
[DRIVER]`; DRIVER `serve`: no APScheduler, lockctl's own `locker.serve()` fires the function.

The body appends a line to STATE/oracle.log (tick, worker, pid, lock index, start time, and
whether the process STATE/sleep.pid names is alive), then writes to a tiny fenced store
(STATE/fence.json: refuses a lock index lower than the highest it has seen). MODE:
  quick      the body takes 0.3 s (slow: 1.5 s)
  hang-once  the first run here loops until run.lost, then tries the store with its stale index
  process    isolation="process": the first run of all replicas starts a child that writes its
             PID (the host's) to STATE/sleep.pid, and hangs (the lock's loss must kill both)
  process-stop  the same, but the child leaves the body's session (setsid) and ignores SIGTERM
  check-loop the first run of all replicas calls run.check() in a loop and, once it raises,
             notes the last time it returned (last_ok) with lost=True
  exit       on_lost="exit": the first run of all replicas hangs (the loss ends the process)
Each call's RunOutcome goes to stdout as a JSON line; lockctl's events to stderr.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from apscheduler.schedulers.background import BackgroundScheduler

from provision.embed import Locker, LockLost, Run, RunOutcome

INTERVAL = 2


class FencedStore:
    """A guarded resource: accepts a write only with a lock index at least the highest seen."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, lock_index: int, what: str) -> bool:
        with open(self.path.with_suffix(".lock"), "a") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            state = json.loads(self.path.read_text()) if self.path.exists() else {"highest": 0}
            accepted = lock_index >= state["highest"]
            if accepted:
                state = {"highest": lock_index, "last": what}
                self.path.write_text(json.dumps(state))
            with open(self.path.with_suffix(".log"), "a") as log:
                log.write(json.dumps({"index": lock_index, "what": what, "ok": accepted}) + "\n")
            return accepted


def alive(pid_file: Path) -> bool | None:
    """Whether the process pid_file names is alive (a zombie is dead); None: no file."""
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def sleeper(pid_file: Path, *, escape: bool) -> list[str]:
    """A child that writes its PID as the host sees it (/proc is the host's: the body's own
    PID namespace numbers it otherwise), then sleeps; `escape`: in a session of its own, deaf
    to SIGTERM, as a daemon that means to outlive its parent."""
    code = (
        "import os, signal, sys, time\n"
        "if sys.argv[2] == '1':\n"
        "    os.setsid()\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "open(sys.argv[1], 'w').write(os.readlink('/proc/self'))\n"
        "time.sleep(300)\n"
    )
    return [sys.executable, "-c", code, str(pid_file), "1" if escape else "0"]


def main() -> None:
    config, job, state, mode = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4]
    driver = sys.argv[5] if len(sys.argv) > 5 else "call"
    store = FencedStore(state / "fence.json")
    locker = Locker.from_config(config, events=sys.stderr)
    worker, first = locker.worker, threading.Event()

    def note(run: Run, **more: object) -> None:
        line = {"tick": run.tick.isoformat(), "worker": worker, "pid": os.getpid()}
        line |= {"lock_index": run.lock_index, "at": time.time(), **more}
        with open(state / "oracle.log", "a") as oracle:
            oracle.write(json.dumps(line) + "\n")

    isolation = "process" if mode.startswith("process") else "thread"
    on_lost = "exit" if mode == "exit" else "flag"

    @locker.singleton(job, isolation=isolation, on_lost=on_lost)
    def refresh(run: Run) -> None:
        note(run, sleep_alive=alive(state / "sleep.pid"))
        if mode == "exit" and not (state / "hung").exists():  # the first run anywhere
            (state / "hung").write_text(worker)
            while True:  # never looks: on_lost="exit" ends the process
                time.sleep(0.2)
        if mode.startswith("process") and not (state / "hung").exists():  # the first anywhere
            (state / "hung").write_text(worker)
            subprocess.Popen(sleeper(state / "sleep.pid", escape=mode == "process-stop"))
            while True:  # never looks at the lock: only a kill ends it
                time.sleep(0.2)
        if mode == "check-loop" and not (state / "hung").exists():
            (state / "hung").write_text(worker)
            last_ok = time.time()
            try:
                while True:
                    run.check()
                    last_ok = time.time()
                    time.sleep(0.002)
            except LockLost as exc:
                note(run, lost=True, last_ok=last_ok, reason=str(exc))
                return
        if mode == "hang-once" and not first.is_set():
            first.set()
            while not run.lost.wait(0.2):
                pass
            accepted = store.write(run.lock_index, f"late {worker}")
            note(run, lost=True, reason=run.reason, accepted=accepted)
            return
        time.sleep(1.5 if mode == "slow" else 0.3)
        run.check()
        store.write(run.lock_index, f"{run.tick.isoformat()} {worker}")

    def fire() -> None:
        outcome: RunOutcome = refresh()
        said = {
            "worker": worker,
            "outcome": outcome.outcome.value,
            "skip": outcome.skip,
            "tick": str(outcome.tick),
            "error": outcome.error,
        }
        # one write of the whole line: stdout and stderr (lockctl's events, written from other
        # threads) share one file, and print() writes the text and its newline apart
        sys.stdout.write(json.dumps(said) + "\n")
        sys.stdout.flush()

    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    if driver == "serve":  # lockctl's own timer: the tick core, in this process
        served = threading.Thread(target=locker.serve, name="serve")
        served.start()
        done.wait()
        locker.close()  # serve() sees it: the run under way is told to stop
        served.join(60)
        return
    scheduler = BackgroundScheduler()
    scheduler.add_job(fire, "interval", seconds=INTERVAL, max_instances=3)
    scheduler.start()
    done.wait()
    scheduler.shutdown(wait=False)
    locker.close()


if __name__ == "__main__":
    main()
