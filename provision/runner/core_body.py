"""A command's process tree as the tick core's body (tick/edge.py `Body`): started in its PID
namespace as `lockctl run` starts a job (runner/child.py), stopped by a signal to its whole
tree, and said to have ended only once no process of it is left: its first process exited,
then whatever it left behind is killed and gone. A reaper thread waits for it and hands the
news to the core's own thread (`call_at` of now on the core's clock), never calling the core
itself."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from provision.ledger.records import tick_name
from provision.runner.child import Child
from provision.runner.supervisor import idempotency_key
from provision.tick.edge import BodyEnd, Run, StopHow, TimerClock

LEFTOVERS_GONE_WITHIN = 5.0  # seconds the reaper waits for a SIGKILLed tree to be gone
LOOK_EVERY = 0.05


@dataclass(frozen=True)
class Command:
    """What every run of one job's command is made of: its argv and environment, the worker's
    credential files its mount namespace covers, and what its output's tails must not show."""

    argv: tuple[str, ...]
    environment: Mapping[str, str] = field(repr=False)
    lock_key: str
    hidden: tuple[str, ...] = ()
    secrets: tuple[str, ...] = field(default=(), repr=False)


def run_env(command: Command, run: Run) -> dict[str, str]:
    """What the job is told of its claimed tick and its lock (the names `lockctl run` uses)."""
    return {
        "LOCKCTL_TICK": tick_name(run.tick),
        "LOCK_KEY": command.lock_key,
        "LOCK_SESSION": run.session,
        "LOCK_INDEX": str(run.lock_index),
        "LOCKCTL_JOB": run.job,
        "LOCKCTL_WORKER": run.worker,
        "LOCKCTL_ATTEMPT": str(run.attempt),
        "LOCKCTL_IDEMPOTENCY_KEY": idempotency_key(run.job, run.tick, None, 0),
    }


class CommandBody:
    """One run of a command under the core's held lock."""

    def __init__(self, command: Command, clock: TimerClock) -> None:
        self.command, self.clock = command, clock
        self._child: Child | None = None
        self._end: BodyEnd | None = None

    @property
    def ending(self) -> BodyEnd | None:
        return self._end

    @property
    def pid(self) -> int | None:
        return None if self._child is None or self._child.process is None else self._child.pid

    def start(self, run: Run, ended: Callable[[], None]) -> None:
        command = self.command
        child = Child(command.argv, command.environment, None, command.hidden, command.secrets)
        child.start(run_env(command, run))
        self._child = child
        threading.Thread(target=self._reap, args=(child, ended), daemon=True).start()

    def stop(self, how: StopHow) -> None:
        if self._child is not None and self._end is None:
            self._child.signal_tree(signal.SIGKILL if how is StopHow.KILL else signal.SIGTERM)

    def _reap(self, child: Child, ended: Callable[[], None]) -> None:
        """Wait for the job, then for the last process of its tree (its leftovers killed)."""
        status = child.wait()
        give_up = time.monotonic() + LEFTOVERS_GONE_WITHIN
        while child.tree_alive() and time.monotonic() < give_up:
            child.signal_tree(signal.SIGKILL)
            time.sleep(LOOK_EVERY)
        child.close()

        def said() -> None:
            self._end = BodyEnd(status)
            ended()

        self.clock.call_at(self.clock.monotonic(), said)
