"""What the body of an embedded job is given (`Run`) and what its call returns (`RunOutcome`).

`Run.lost` is set, and `Run.check()` raises, the moment the fencing decision (provision/fencing.py,
the one `lockctl run` obeys) says the lock is no longer safely ours: the supervisor's `fenced`
event, which `RunEvents` watches. Every reader also judges the bound itself (`past_fence`, on
the monotonic clock, from the send time of the newest confirmation): after a pause the body's
thread may run before the supervisor's, and must not be told the lock is still ours. With
`on_lost="exit"` the process ends there instead, with EXIT_ON_LOST, after the event is written.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TextIO

from provision.fencing import past_fence
from provision.ledger.records import parse_tick_name
from provision.outcomes import Outcome
from provision.runner.events import EventLog
from provision.runner.results import RunResult, SkipReason

EXIT_ON_LOST = 75  # os._exit status of a process whose lock was lost with on_lost="exit"
OnLost = Literal["flag", "exit"]
Isolation = Literal["thread", "process"]


class RunStopped(Exception):
    """`Run.check()`: the run must stop (its timeout passed, or the Locker is closing)."""


class LockLost(RunStopped):
    """`Run.check()`: the lock is no longer safely ours; another replica may run the job."""


UNCONFIRMED = "no confirmation of the lock in time"  # provision/fencing.py Reason.UNCONFIRMED


@dataclass(frozen=True)
class Vouch:
    """Where a run learns how long its lock is safe: the monotonic clock, the send time of the
    newest confirmation, and the seconds after it that the lock can no longer be vouched for."""

    clock: Callable[[], float]
    confirmed_at: Callable[[], float]
    fence_after: float

    def passed(self) -> bool:
        return past_fence(self.clock(), self.confirmed_at(), self.fence_after)

    def left(self) -> float:
        """Seconds until it passes (0 or less: passed)."""
        return self.confirmed_at() + self.fence_after - self.clock()


class JudgedEvent(threading.Event):
    """`run.lost` and `run.stopping`: set by the supervisor's decision, and judged by every
    reader too: `is_set()` and `wait()` are true once the bound has passed since the newest
    confirmation, whether or not the supervisor's thread has run since."""

    def __init__(self, run: Run) -> None:
        super().__init__()
        self._run = run

    def is_set(self) -> bool:
        self._run._judge()
        return super().is_set()

    def wait(self, timeout: float | None = None) -> bool:
        give_up = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            now = time.monotonic()
            if give_up is not None and now >= give_up:
                return False
            limits = [self._run._left()] + ([] if give_up is None else [give_up - now])
            known = [limit for limit in limits if limit is not None]
            super().wait(max(0.0, min(known)) if known else None)
        return True


class Run:
    """One claimed tick, as the body sees it.

    `tick`: the scheduled instant claimed (UTC). `lock_index`: the fencing token (Consul's
    LockIndex of the lock at the claim); hand it to the resource the body writes to, which
    refuses a token lower than the highest it has seen. `deadline`: the body should be done by
    then (the job's timeout, else the next tick; None: neither). `lost`: set the moment the
    lock is no longer safely ours. `stopping`: set when the run must stop for any reason.
    `key`: a keyed call's key (None for the job's own tick)."""

    def __init__(
        self, job: str, worker: str, tick: datetime, lock_index: int, session: str
    ) -> None:
        self.job, self.worker, self.tick = job, worker, tick
        self.lock_index, self.session = lock_index, session
        self.deadline: datetime | None = None
        self.vouch: Vouch | None = None  # set when the body starts under the lock
        self.lost: threading.Event = JudgedEvent(self)
        self.stopping: threading.Event = JudgedEvent(self)
        self.reason: str | None = None
        self.key: str | None = None

    @classmethod
    def from_lock_env(cls, env: Mapping[str, str]) -> Run:
        """The run the supervisor started (runner/core_body.py run_env says what it is told)."""
        tick = parse_tick_name(env["LOCKCTL_TICK"])
        assert tick is not None, "the supervisor names the tick it claimed"
        run = cls(
            env["LOCKCTL_JOB"],
            env["LOCKCTL_WORKER"],
            tick,
            int(env["LOCK_INDEX"]),
            env["LOCK_SESSION"],
        )
        run.key = env.get("LOCKCTL_KEY")
        return run

    def check(self) -> None:
        """Raise LockLost (or RunStopped) when the run must not go on; else return at once.
        It judges the fencing bound itself, every call: it never returns once the bound has
        passed since the newest confirmation, whatever the supervisor has done yet.
        One judgment, then the kind: judging `lost` and `stopping` apart let the bound pass
        between the two reads, and a lost lock was said as a plain stop. `_fence` sets `lost`
        before `stopping`, so a stop read here is known lost or not."""
        if not self.stopping.is_set():
            return
        if threading.Event.is_set(self.lost):
            raise LockLost(self.reason or "the lock is no longer ours")
        raise RunStopped(self.reason or "the run was asked to stop")

    def _judge(self) -> None:
        if self.vouch is not None and self.vouch.passed():
            self._fence(UNCONFIRMED, lost=True)

    def _left(self) -> float | None:
        return None if self.vouch is None else max(0.0, self.vouch.left())

    def _fence(self, reason: str, *, lost: bool) -> None:
        self.reason = self.reason or reason
        if lost:
            self.lost.set()
        self.stopping.set()


@dataclass(frozen=True)
class RunOutcome:
    """What one call of an embedded job did: `ran` (the body ran here), `outcome` (one of
    RUN_OUTCOMES, provision/outcomes.py: ran, skipped, missed, lost, timed-out, interrupted),
    `skip` (why not, in a word, when skipped), `tick`, `lock_index`, `error` (the body's
    exception, one line)."""

    outcome: Outcome
    tick: datetime | None = None
    lock_index: int | None = None
    skip: SkipReason | None = None
    exit_status: int | None = None
    error: str | None = None
    duration: float | None = None

    @property
    def ran(self) -> bool:
        return self.duration is not None

    @property
    def succeeded(self) -> bool:
        return self.outcome is Outcome.RAN and self.exit_status == 0

    @classmethod
    def of(cls, result: RunResult, error: str | None = None) -> RunOutcome:
        exit_status = result.exit_code if result.duration is not None else None
        return cls(
            result.outcome,
            result.tick,
            result.lock_index,
            result.skip,
            exit_status,
            error,
            result.duration,
        )


class LoggerStream:
    """A text stream whose lines go to a logging.Logger (INFO): events for the app's logging."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger

    def write(self, text: str) -> int:
        for line in text.splitlines():
            if line:
                self.logger.info(line)
        return len(text)

    def flush(self) -> None:
        return None


class RunEvents(EventLog):
    """The job's events, as `lockctl run` writes them; `fenced` and `timed-out` reach the run."""

    def __init__(
        self,
        job: str,
        worker: str,
        stream: TextIO | None,
        on_lost: OnLost,
        key: str | None = None,
    ) -> None:
        super().__init__(job, worker, stream, key)
        self.on_lost = on_lost
        self.run: Run | None = None  # set when the body starts

    def emit(self, event: str, **fields: Any) -> None:
        super().emit(event, **fields)
        run = self.run
        if event == "fenced":
            if self.on_lost == "exit":
                os._exit(EXIT_ON_LOST)  # the event is written (and flushed) above
            if run is not None:
                run._fence(str(fields.get("reason") or "the lock was lost"), lost=True)
        elif event == "timed-out" and run is not None:
            run._fence("the job's timeout passed", lost=False)
