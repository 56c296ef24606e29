"""The runner's bodies as the tick core's body (tick/edge.py `Body`): a command's process tree
in its PID namespace as `lockctl run` starts it (runner/child.py), or a call to the job's app
(runner/http_job.py). Stopped by a signal to its whole tree (a call: its connection cut), and
said to have ended only once nothing of it is left: its first process exited, then whatever it
left behind is killed and gone. A reaper thread waits for it and hands the news to the core's
own thread (`call_at` of now on the core's clock), never calling the core itself."""

from __future__ import annotations

import functools
import hashlib
import re
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from provision.ledger.records import tick_name
from provision.runner.child import Child
from provision.runner.http_job import HttpJob
from provision.system.http_call import HttpCall
from provision.tick.edge import BodyEnd, Run, StopHow, TimerClock

LEFTOVERS_GONE_WITHIN = 5.0  # seconds the reaper waits for a SIGKILLed tree to be gone
LOOK_EVERY = 0.05


@dataclass(frozen=True)
class Command:
    """What every run of one job's command is made of: its argv and environment, the worker's
    credential files its mount namespace covers, and what its output's tails must not show."""

    argv: tuple[str, ...]
    environment: Mapping[str, str] = field(repr=False)
    hidden: tuple[str, ...] = ()
    secrets: tuple[str, ...] = field(default=(), repr=False)

    def prepare(self) -> Child:
        """A run's process tree, its namespace's init waiting for the go."""
        return Child(self.argv, self.environment, None, self.hidden, self.secrets)


def call_of(call: HttpCall, secrets: tuple[str, ...] = ()) -> Callable[[], HttpJob]:
    """What makes each run's call of an HTTP job."""
    return lambda: HttpJob(call, secrets)


def run_env(lock_key: str, run: Run) -> dict[str, str]:
    """What the job is told of its claimed tick and its lock (the names `lockctl run` uses; an
    HTTP job's call sends them as headers); a keyed run's key too."""
    told = {
        "LOCKCTL_TICK": tick_name(run.tick),
        "LOCK_KEY": lock_key,
        "LOCK_SESSION": run.session,
        "LOCK_INDEX": str(run.lock_index),
        "LOCKCTL_JOB": run.job,
        "LOCKCTL_WORKER": run.worker,
        "LOCKCTL_ATTEMPT": str(run.attempt),
        "LOCKCTL_IDEMPOTENCY_KEY": idempotency_key(run.job, run.tick, None, 0, run.key),
    }
    return told if run.key is None else {**told, "LOCKCTL_KEY": run.key}


# the runner's bodies that need no fence of their own (the core's HeldRun fences them)
Unfenced = Child | HttpJob


class RunnerBody:
    """One run of a runner's body under the core's held lock."""

    def __init__(self, prepare: Callable[[], Unfenced], lock_key: str, clock: TimerClock) -> None:
        self.prepare, self.lock_key, self.clock = prepare, lock_key, clock
        self._body: Unfenced | None = None
        self._end: BodyEnd | None = None
        # the ends of its stdout and stderr once it ended (for the tick's record)
        self.tails: tuple[str | None, str | None] | None = None

    @property
    def ending(self) -> BodyEnd | None:
        return self._end

    def start(self, run: Run, ended: Callable[[], None]) -> None:
        body = self.prepare()
        body.start(run_env(self.lock_key, run))
        self._body = body
        threading.Thread(target=self._reap, args=(body, ended), daemon=True).start()

    def stop(self, how: StopHow) -> None:
        if self._body is not None and self._end is None:
            self._body.signal_tree(signal.SIGKILL if how is StopHow.KILL else signal.SIGTERM)

    def _reap(self, body: Unfenced, ended: Callable[[], None]) -> None:
        """Wait for the job, then for the last process of its tree (its leftovers killed)."""
        status = body.wait()
        give_up = time.monotonic() + LEFTOVERS_GONE_WITHIN
        while body.tree_alive() and time.monotonic() < give_up:
            body.signal_tree(signal.SIGKILL)
            time.sleep(LOOK_EVERY)
        self.tails = body.output_tails()  # before close: the pump has read to the end
        body.close()
        self.clock.call_at(self.clock.monotonic(), functools.partial(self._said, status, ended))

    def _said(self, status: int | None, ended: Callable[[], None]) -> None:
        """The end, on the core's thread."""
        self._end = BodyEnd(status)
        ended()


# A job name or trigger id kept as it is in a run's key; anything else (a hand-edited worker
# config, a trigger note not written by lockctl) is replaced by a hash, so the key stays a
# short printable header value whatever the input.
_KEY_PART = re.compile(r"[A-Za-z0-9._-]{1,64}")


def idempotency_key(
    job: str,
    tick: datetime | None,
    trigger: str | None,
    acquired_index: int,
    key: str | None = None,
) -> str:
    """The key of one run of `job`, the same for each of its attempts and different for any
    other run: `lockctl:<job>:<tick>` for a scheduled tick (the tick is claimed once, so it is
    run once), `lockctl:<job>:<instant>:trigger:<id>` for an operator's trigger, and
    `lockctl:<job>:lock:<index>` for a run without a tick (`acquired_index`: the lock's
    ModifyIndex when acquired, which Consul never hands out twice). A keyed run's tick names its
    key too, `lockctl:<job>:key:<key>:<tick>`: each key claims the tick once. At most 240
    characters."""
    if tick is None:
        return f"lockctl:{_key_part(job)}:lock:{acquired_index}"
    keyed = "" if key is None else f"key:{_key_part(key)}:"
    said = f"lockctl:{_key_part(job)}:{keyed}{tick_name(tick)}"
    return said if trigger is None else f"{said}:trigger:{_key_part(trigger)}"


def _key_part(text: str) -> str:
    if _KEY_PART.fullmatch(text):
        return text
    return "sha256-" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]
