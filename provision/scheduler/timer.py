"""One timer for all of a scheduler's jobs: no thread per idle job.

    a heap of (this replica's turn at the job's next tick, the job)
    -> the earliest turn comes: the job's run of that tick gets a thread of its own
    -> the run ends: the job's next turn goes into the heap (a tick that passed meanwhile is an
       overlap, said by the job: scheduler/loop.py)

Between ticks a job costs an entry in the heap; the timer sleeps until the earliest turn, a stop,
a retire or a run's end, and at most MAX_WAIT (a wall-clock step is noticed within it). A run
that outlasts its interval keeps only its own job waiting.

A reload changes the jobs one by one while the timer runs (scheduler/reload.py): `add` puts a
job in the heap at its next turn; `retire_job` takes one out, at once when it is idle, else when
its current run ends, and can name the job that takes its place then. So a reload waits for no
run, and a job it leaves alone keeps its heap entry.
"""

from __future__ import annotations

import _thread
import heapq
import itertools
import threading
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from provision.ledger.control import ControlNote
from provision.runner.precheck import WallClock, utc_now
from provision.runner.stop import StopRequest, Wakeup, wait_readable
from provision.scheduler.loop import JobTicks

MAX_WAIT = 1.0  # seconds: the longest single sleep, so a wall-clock step is seen within it
RETRY_TURN = timedelta(seconds=10)  # a job whose next turn could not be worked out tries again


class TickTimer:
    """Fires each job's run at its turn; ends at a stop (signals) or a retire (a reload), once
    the runs under way have ended."""

    def __init__(
        self,
        jobs: Sequence[JobTicks],
        stop: StopRequest,
        *,
        wall: WallClock = utc_now,
        on_error: Callable[[JobTicks, BaseException], None] | None = None,
        retry_turn: timedelta = RETRY_TURN,
        on_retired: Callable[[JobTicks], None] | None = None,
    ) -> None:
        self.jobs, self.stop, self.wall = list(jobs), stop, wall
        self.on_error, self.retry_turn = on_error, retry_turn
        self.on_retired = on_retired  # a job is out for good: no run of it left (timer thread)
        self._live = set(self.jobs)  # the jobs in the heap or running; others' entries are stale
        # a retired job still running -> the job that takes its place when that run ends
        self._successors: dict[JobTicks, JobTicks | None] = {}
        self._changes: list[tuple[JobTicks, JobTicks | None, bool]] = []  # (job, successor, add)
        self.retired = Wakeup()  # set: start no new run, let the current ones end (a reload)
        self._retiring = False
        self._wakeup = Wakeup()  # a run ended: its job's next turn is due in the heap
        self._ended: list[JobTicks] = []
        self._ended_lock = threading.Lock()
        self._runs: dict[JobTicks, threading.Event] = {}  # set when the run has ended
        self._order = itertools.count()  # ties in the heap: first in, first out
        # (when, order, the tick to run then or None: work out the job's next turn again, job)
        self._heap: list[tuple[datetime, int, datetime | None, JobTicks]] = []
        self._replan = False  # set from another thread: the clock moved, redo every turn
        self._manual: list[tuple[JobTicks, ControlNote]] = []  # triggers, each run once

    def run(self) -> None:
        """Until a stop or a retire; then wait for every run under way."""
        try:
            for job in self.jobs:
                self._schedule(job)
            while not self._ending():
                self._apply_changes()
                self._fire_manual()  # first: a trigger waits for a run, not for the next tick
                self._fire_due()
                self._sleep()
                self._reschedule_ended()
                self._replan_waiting()
        finally:
            for ended in list(self._runs.values()):
                ended.wait()
            self._wakeup.close()

    def retire(self) -> None:
        self._retiring = True
        self.retired.set()

    def replan(self) -> None:
        """From another thread: the clock the turns were worked out on moved (Consul's clock
        first learnt, or stepped), so every waiting job's next turn is worked out again."""
        self._replan = True
        self._wakeup.set()

    def _replan_waiting(self) -> None:
        if not self._replan:
            return
        self._replan = False
        waiting, self._heap = [entry[3] for entry in self._heap], []
        for job in waiting:  # the running ones are scheduled when their runs end, as ever
            if job in self._live:  # a retired one's entry goes with it
                self._schedule(job)

    def add(self, job: JobTicks) -> None:
        """Run `job` too, from its next turn on (from any thread)."""
        self._change(job, None, add=True)

    def retire_job(self, job: JobTicks, successor: JobTicks | None = None) -> None:
        """Take `job` out once it is not running (at once if idle); `successor`, if any, is
        added then, so the two never run at once (from any thread)."""
        self._change(job, successor, add=False)

    def _change(self, job: JobTicks, successor: JobTicks | None, *, add: bool) -> None:
        with self._ended_lock:
            self._changes.append((job, successor, add))
        self._wakeup.set()

    def _apply_changes(self) -> None:
        with self._ended_lock:
            changes, self._changes = self._changes, []
        for job, successor, add in changes:
            if add:
                self._live.add(job)
                self._schedule(job)
            else:
                self._retire_one(job, successor)

    def _retire_one(self, job: JobTicks, successor: JobTicks | None) -> None:
        waiting = next((old for old, s in self._successors.items() if s is job), None)
        if waiting is not None:  # it was to follow a run still going: follow with the new one
            self._successors[waiting] = successor
            self._retired(job)
        elif job in self._runs:  # its run goes on; the successor comes when it ends
            self._successors[job] = successor
        else:  # idle: its heap entry is dropped when it comes up
            self._hand_over(job, successor)

    def _hand_over(self, job: JobTicks, successor: JobTicks | None) -> None:
        """`job` is out, no run of it left; `successor`, if any, takes its place."""
        self._live.discard(job)
        self._retired(job)
        if successor is not None:
            self._live.add(successor)
            self._schedule(successor)

    def _retired(self, job: JobTicks) -> None:
        if self.on_retired is not None:
            self.on_retired(job)

    @property
    def running(self) -> int:
        return len(self._runs)

    def _ending(self) -> bool:
        return self.stop.requested or self._retiring

    def _schedule(self, job: JobTicks) -> None:
        try:
            turn = job.next_turn()
        except Exception as exc:  # one job's schedule must not stop the timer of them all
            self._report(job, exc)
            again = self.wall() + self.retry_turn
            heapq.heappush(self._heap, (again, next(self._order), None, job))
            return
        heapq.heappush(self._heap, (turn.at, next(self._order), turn.tick, job))

    def _report(self, job: JobTicks, exc: BaseException) -> None:
        if self.on_error is not None:
            self.on_error(job, exc)

    def _fire_due(self) -> None:
        now = self.wall()
        while self._heap and self._heap[0][0] <= now and not self._ending():
            _, _, tick, job = heapq.heappop(self._heap)
            if job not in self._live:  # retired by a reload while it waited
                continue
            if tick is None:  # its turn could not be worked out: try again now
                self._schedule(job)
                continue
            ended = threading.Event()
            self._runs[job] = ended
            # A bare thread, not threading.Thread: its start() waits until the new thread has
            # run, which with 100 runs already busy at :00 is a turn of the GIL each, seconds
            # for the last of 300 jobs. A bare thread is, like a daemon, never waited for at
            # the process's exit (a run stuck in a hung call keeps nothing alive).
            _thread.start_new_thread(self._run_one, (job, tick, ended))

    def trigger(self, job: JobTicks, note: ControlNote) -> None:
        """Run `job` once now for an operator's trigger: at once when it is idle here, else
        right after its run (from any thread: scheduler/triggers.py)."""
        with self._ended_lock:
            self._manual.append((job, note))
        self._wakeup.set()

    def _fire_manual(self) -> None:
        with self._ended_lock:
            manual, self._manual = self._manual, []
        waiting = []
        for job, note in manual:
            if job not in self._live or self._ending():
                continue  # retired by a reload: its successor's replica hears of it again
            if job in self._runs:  # its run goes on: the trigger's comes right after it
                waiting.append((job, note))
                continue
            # its heap entry out: the job's next turn is worked out again when this run ends
            self._heap = [entry for entry in self._heap if entry[3] is not job]
            heapq.heapify(self._heap)
            ended = threading.Event()
            self._runs[job] = ended
            _thread.start_new_thread(self._run_one, (job, note, ended))
        with self._ended_lock:
            self._manual[:0] = waiting

    def _run_one(self, job: JobTicks, tick: datetime | ControlNote, ended: threading.Event) -> None:
        try:
            if isinstance(tick, ControlNote):
                job.run_manual(tick)
            else:
                job.run_tick(tick)
        except Exception as exc:  # a bug in one job's run must not stop the others' ticks
            self._report(job, exc)
        finally:
            with self._ended_lock:
                self._ended.append(job)
            ended.set()
            self._wakeup.set()

    def _reschedule_ended(self) -> None:
        with self._ended_lock:
            ended, self._ended = self._ended, []
        for job in ended:
            self._runs.pop(job)
            if job in self._successors:  # retired while it ran: out now, its successor in
                self._hand_over(job, self._successors.pop(job))
            elif not self._ending():
                self._schedule(job)

    def _sleep(self) -> None:
        wait = MAX_WAIT
        if self._heap:
            wait = min(wait, (self._heap[0][0] - self.wall()).total_seconds())
        fds = [self._wakeup.fileno(), self.retired.fileno()]
        if not self.stop.requested:
            fds.append(self.stop.fileno())
        wait_readable(fds, wait)
        self._wakeup.clear()
