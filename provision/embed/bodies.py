"""The body of an embedded job as the core's held run drives it (tick/held.py HeldRun): a thread
of the app (cooperative: it cannot be killed, it is told through `Run`), a forked process
killed like a `lockctl run` job (isolation="process"), or the block of a `with` statement."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from datetime import datetime

from provision.embed.run import Run, RunEvents, Vouch
from provision.embed.warden import (
    CONFIRMED,
    IN_NAMESPACE,
    SIGNAL,
    SharedConfirmation,
    Warded,
    launch,
    tell,
)
from provision.fencing import BodyFence
from provision.runner.containment import PID_NAMESPACE, PROCESS_GROUP
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

    def start(self, lock_env: Mapping[str, str], fence: BodyFence) -> None:
        run = Run.from_lock_env(lock_env)
        run.deadline = self.deadline(run.tick)
        run.vouch = Vouch(fence.clock, fence.confirmed_at, fence.bounds.fence_after)
        self.run = self.events.run = run
        self._launch(run, fence)

    def _launch(self, run: Run, fence: BodyFence) -> None:
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

    def tell(self, reason: str) -> None:
        """Why the run is about to be stopped (an operator's abort): the first reason it is
        given is the one `run.check()` raises with."""
        if self.run is not None:
            self.run._fence(reason, lost=False)

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

    def _launch(self, run: Run, fence: BodyFence) -> None:
        self.begun.set()

    def _started_block(self) -> bool:
        return self.begun.is_set() and not self._done.is_set()


class ProcessBody(ThreadBody):
    """The body in a process of its own, killed like a `lockctl run` job, and on time whatever
    happens to the app (embed/warden.py): in a PID namespace whose PID 1, a warden beside the
    body, ends it within the fencing bounds on the confirmations the app sends it. The app
    killed: the namespace goes with it. The app stopped: the warden still ends the body by
    LockDelay after the newest confirmation. Where no namespace can be had, a process group."""

    containment = PID_NAMESPACE

    def __init__(self, body: Body, events: RunEvents, deadline: Deadline) -> None:
        super().__init__(body, events, deadline)
        self._warded: Warded | None = None
        self._unfollow: Callable[[], None] | None = None
        self._shared: SharedConfirmation | None = None
        self._reap = threading.Lock()

    @property
    def pid(self) -> int:
        assert self._warded is not None, "the body was not started"
        return self._warded.keeper

    def _launch(self, run: Run, fence: BodyFence) -> None:
        shared = self._shared = SharedConfirmation(fence.confirmed_at())

        def in_body() -> None:  # in the body's process: the warden shares the confirmations
            run.vouch = Vouch(fence.clock, shared.read, fence.bounds.fence_after)
            self.body(run)

        sys.stdout.flush()
        sys.stderr.flush()
        warded = self._warded = launch(in_body, fence.bounds, shared)
        self._unfollow = fence.follow(lambda at: tell(warded, CONFIRMED, at))
        tell(warded, CONFIRMED, fence.confirmed_at())  # any that came before we followed
        if not warded.contained.startswith(IN_NAMESPACE):
            self.containment = PROCESS_GROUP
            self.warning = printable(warded.contained[1:].decode(errors="replace"), 200)

    @property
    def exit_status(self) -> int | None:
        with self._reap:
            if self._status is None and self._warded is not None:
                with contextlib.suppress(ChildProcessError):
                    done, status = os.waitpid(self._warded.keeper, os.WNOHANG)
                    if done:
                        code = os.waitstatus_to_exitcode(status)
                        self._status = 128 - code if code < 0 else code
                        self._done.set()
            return self._status

    def wait(self) -> int:
        """Block until the keeper has ended (the body and all it started are dead by then),
        without reaping it (exit_status does)."""
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
        return self.exit_status or 0

    def signal_tree(self, signum: int) -> bool:
        """Through the warden, to every process of the body; SIGKILL also to the keeper, whose
        death ends the warden and with it the namespace, whatever the warden is doing."""
        super().signal_tree(signum)
        if self._warded is None or self.exit_status is not None:
            return False
        tell(self._warded, SIGNAL, signum)
        if signum == signal.SIGKILL:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._warded.keeper, signal.SIGKILL)
        return True

    def tree_alive(self) -> bool:
        """The keeper outlives the warden, which outlives (in a namespace) all of the body."""
        return self._warded is not None and self.exit_status is None

    def output_tails(self) -> tuple[str | None, str | None]:
        return None, None

    def close(self) -> None:
        if self._unfollow is not None:
            self._unfollow()
        if self._warded is not None:
            with contextlib.suppress(OSError):
                os.close(self._warded.to_warden)
        if self._shared is not None:
            self._shared.close()
