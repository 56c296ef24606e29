"""The body of an embedded job as the supervisor drives it (runner/body.py JobBody): a thread
of the app (cooperative: it cannot be killed, it is told through `Run`), a forked process
killed like a `lockctl run` job (isolation="process"), or the block of a `with` statement."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Mapping
from datetime import datetime

from provision.embed.run import Run, RunEvents
from provision.runner.child import die_with_parent
from provision.runner.forkserver import KeptProcess
from provision.system.text import printable

Body = Callable[[Run], object]
Deadline = Callable[[datetime], datetime | None]  # a run's deadline, from its tick
ERROR_LIMIT = 512  # characters of the body's exception kept for the record and the outcome


class ThreadBody:
    """The body in a thread of this process: `signal_tree` can only tell it (run.stopping);
    whether anything of it is alive is whether the thread is."""

    containment = "thread"
    warning: str | None = None
    process: subprocess.Popen[bytes] | KeptProcess | None = None

    def __init__(self, body: Body, events: RunEvents, deadline: Deadline) -> None:
        self.body, self.events, self.deadline = body, events, deadline
        self.run: Run | None = None
        self.error: str | None = None
        self._status: int | None = None
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def pid(self) -> int:
        return os.getpid()

    @property
    def exit_status(self) -> int | None:
        return self._status if self._done.is_set() else None

    def start(self, lock_env: Mapping[str, str]) -> None:
        run = Run.from_lock_env(lock_env)
        run.deadline = self.deadline(run.tick)
        self.run = self.events.run = run
        self._launch(run)

    def _launch(self, run: Run) -> None:
        name = f"lockctl-embed-{run.job}"
        self._thread = threading.Thread(target=self._main, args=(run,), name=name, daemon=True)
        self._thread.start()

    def _main(self, run: Run) -> None:
        try:
            self.body(run)
            self.finish(0)
        except BaseException as exc:  # the body's failure is the run's outcome, never ours
            self.finish(1, exc)

    def finish(self, status: int, exc: BaseException | None = None) -> None:
        if exc is not None:
            self.error = printable(f"{type(exc).__name__}: {exc}", ERROR_LIMIT)
        self._status = status
        self._done.set()

    def wait(self) -> int:
        self._done.wait()
        return self._status or 0

    def signal_tree(self, signum: int) -> bool:
        """A thread cannot be signalled: the run is told to stop, and the body must look."""
        if self.run is not None:
            self.run._fence(f"stopped ({signal.Signals(signum).name})", lost=False)
        return not self._done.is_set()

    def tree_alive(self) -> bool:
        return (self._thread is not None and self._thread.is_alive()) or self._started_block()

    def _started_block(self) -> bool:
        return False

    def output_tails(self) -> tuple[str | None, str | None]:
        return None, self.error

    def abort(self) -> None:
        return None

    def close(self) -> None:
        return None


class BlockBody(ThreadBody):
    """The body is the block of `with locker.tick(job) as claim:`: started means the block may
    begin (`begun` is set); it ends when the block does (`finish`)."""

    def __init__(self, events: RunEvents, deadline: Deadline) -> None:
        super().__init__(lambda run: None, events, deadline)
        self.begun = threading.Event()

    def _launch(self, run: Run) -> None:
        self.begun.set()

    def _started_block(self) -> bool:
        return self.begun.is_set() and not self._done.is_set()


class ProcessBody(ThreadBody):
    """The body in a forked process of its own process group, killed like a `lockctl run`
    job: the supervisor's SIGTERM and SIGKILL reach the whole group, and the fencing bounds
    hold (nothing of it alive past LockDelay after the last confirmation). A process that
    leaves the group (setsid) is not contained: `lockctl run`'s PID namespace would be."""

    containment = "process-group"

    def __init__(self, body: Body, events: RunEvents, deadline: Deadline) -> None:
        super().__init__(body, events, deadline)
        self._pid: int | None = None
        self._reap = threading.Lock()

    @property
    def pid(self) -> int:
        assert self._pid is not None, "the body was not started"
        return self._pid

    def _launch(self, run: Run) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: run the body, never return into the app's code
            status = 1
            try:
                os.setpgid(0, 0)
                die_with_parent()
                self.body(run)
                status = 0
            except BaseException:
                traceback.print_exc()
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(status)
        with contextlib.suppress(OSError):  # as the child does: no window without a group
            os.setpgid(pid, pid)
        self._pid = pid

    @property
    def exit_status(self) -> int | None:
        with self._reap:
            if self._status is None and self._pid is not None:
                with contextlib.suppress(ChildProcessError):
                    done, status = os.waitpid(self._pid, os.WNOHANG)
                    if done:
                        code = os.waitstatus_to_exitcode(status)
                        self._status = 128 - code if code < 0 else code
                        self._done.set()
            return self._status

    def wait(self) -> int:
        """Block until the body's process has ended, without reaping it (exit_status does)."""
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
        return self.exit_status or 0

    def signal_tree(self, signum: int) -> bool:
        super().signal_tree(signum)
        try:
            os.killpg(self.pid, signum)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def tree_alive(self) -> bool:
        if self._pid is None:
            return False
        if self.exit_status is None:
            return True
        try:
            os.killpg(self._pid, 0)  # what the body left in its group
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def output_tails(self) -> tuple[str | None, str | None]:
        return None, None
