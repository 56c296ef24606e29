"""One tick of one job on the tick core: `lockctl run`'s shape (runner/on_core.py).

    take     the core's own turn at the tick (core.py `take`): the read, the judgement on
             Consul's clock, the claim (one transaction), the body under the held lock
             (held.py HeldRun, fenced by provision/fencing.py), the record completed and the lock
             released (one transaction); housekeeping after a run won, a catch-up looked for
    verdict  what the turn came to, from the core's notes of that tick alone (pure): ran (the
             record as completed), skipped (why, in a word), paused, too late, or failed
    wait     --wait (runner/on_core.py): a claim refused because the lock is held (or in
             lock-delay: `lock_refused`) is taken again once the lock's key changes
             (`watch_lock`), until `wait_deadline` (the tick's claim window) or the caller's

Nothing here decides a tick: the core does, as it does for `lockctl schedule`. `OneTick` only
starts the turn on the core's clock, hears its notes, and knows when the core is quiet again.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from provision.ledger.records import TickRecord
from provision.outcomes import Outcome
from provision.tick.core import TickCore, TickPlan
from provision.tick.edge import Listener, Note, SkipReason

# The notes of a request that failed (a turn they end settles nothing else)
_FAILURES = ("unavailable", "refused", "unanswered")


@dataclass(frozen=True)
class Verdict:
    """How one turn at `tick` ended: what it came to, the record as written (ran, paused),
    why it was skipped, and the deciding note's words (a failure's error)."""

    came: Outcome  # one of TURN_OUTCOMES (provision/outcomes.py)
    tick: datetime
    record: TickRecord | None = None
    skip: SkipReason | None = None
    detail: str = ""
    failure: str | None = None  # the failing note's kind: unavailable, refused, unanswered

    @property
    def lock_refused(self) -> bool:
        """Skipped because the lock is not free (held, or in lock-delay): waiting may help;
        a taken tick (its record) never frees."""
        return self.came is Outcome.SKIPPED and self.skip is not SkipReason.TAKEN


def verdict(notes: Sequence[Note], tick: datetime) -> Verdict:
    """The turn at `tick`, from the core's notes (pure): the last that settles it wins (a
    `claimed` tick is settled only by its `completed` or `paused`)."""
    found = Verdict(Outcome.UNSETTLED, tick)
    for note in notes:
        if note.tick != tick:
            continue
        if note.kind == "completed" and note.record is not None:
            found = Verdict(Outcome.CLAIMED, tick, note.record, detail=note.detail)
        elif note.kind == "paused":
            found = Verdict(Outcome.PAUSED, tick, note.record, SkipReason.PAUSED, note.detail)
        elif note.kind == "blackout":
            found = Verdict(Outcome.BLACKOUT, tick, note.record, SkipReason.BLACKOUT, note.detail)
        elif note.kind == "skipped":
            found = Verdict(Outcome.SKIPPED, tick, None, note.skip, note.detail)
        elif note.kind == "too-late":
            found = Verdict(Outcome.MISSED, tick, detail=note.detail)
        elif note.kind in _FAILURES and found.came is Outcome.UNSETTLED:
            found = Verdict(Outcome.ERROR, tick, detail=note.detail, failure=note.kind)
        elif note.kind == "claimed":
            found = Verdict(Outcome.UNSETTLED, tick, note.record)
    return found


class OneTick:
    """Takes one job's turns on a TickCore that runs that job alone (its `start` never called),
    on the core's own clock thread; `notes` keeps what the core said, `quiet` is set when the
    core has nothing more to do for the job. Build the core with `listener=one.hear`."""

    def __init__(self, name: str, then: Listener | None = None) -> None:
        self.name, self.then = name, then  # the job's unit: its name, or name/key
        self.core: TickCore | None = None
        self.notes: list[Note] = []
        self.quiet = threading.Event()

    def attach(self, core: TickCore) -> None:
        self.core = core
        core.on_quiet = self._on_quiet
        core.fates = False  # the process ends after the tick: no look at a fate later

    def plan(self, tick: datetime) -> TickPlan:
        assert self.core is not None
        job = next(job for job in self.core.jobs if job.unit == self.name)
        return self.core.plan(job, tick)

    def hear(self, note: Note) -> None:
        self.notes.append(note)
        if self.then is not None:
            self.then(note)

    def take(self, tick: datetime, *, catchup: bool = False) -> None:
        """The turn at `tick` (call it on the core's clock thread); `quiet` once it is over."""
        assert self.core is not None
        self.quiet.clear()
        self.core.take(self.name, tick, catchup=catchup)

    def stop(self) -> None:
        """The core stopped (a signal): its run interrupted, completed, released; `quiet` once
        its sessions are destroyed."""
        assert self.core is not None
        self.core.stop()
        self._settle_stop()

    def _settle_stop(self) -> None:
        assert self.core is not None
        core = self.core
        if not core.runs and core.pool.closed:
            self.quiet.set()
            return
        core.clock.call_at(core.clock.monotonic() + STOP_LOOK, self._settle_stop)

    def verdict(self, tick: datetime) -> Verdict:
        return verdict(self.notes, tick)

    def _on_quiet(self, name: str) -> None:
        if name == self.name:
            self.quiet.set()


STOP_LOOK = 0.05  # seconds between two looks at a stopping core's run and sessions


def wait_deadline(plan: TickPlan, now_wall: datetime, now_monotonic: float) -> float:
    """The monotonic instant the tick's claim window closes (on the clock given): a wait for
    the lock never goes past it."""
    return now_monotonic + (plan.closes - now_wall).total_seconds()
