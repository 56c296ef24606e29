"""The operators' triggers (`lockctl trigger JOB`) inside `lockctl schedule`: heard of with ONE
blocking query per scheduler, on every job's control keys at once, and run at once.

    TriggerWatch   a thread: GET lockctl/control/?recurse&index=N (scheduler/../consul/watch.py),
                   which Consul filters to this worker's jobs (its token reads only those); each
                   trigger not seen before goes to the tick core, for the job it names
                   (scheduler/on_core.py); which jobs have their paused key goes to /metrics
                   (lockctl_job_paused)
    the tick core  runs it: claimed like a tick at the trigger's own instant (tick/core.py
                   trigger_plan), right after the job's run when one is going on here, and
                   tried again while a run of the job elsewhere holds the lock

Every replica hears of a trigger and tries it; the claim (one transaction: the instant's record,
the lock, and the job's taken-trigger key at the index read) lets exactly one run it, and a
trigger taken once is never run again, even after retention deleted its run's record.
A query, not a watch per job: hundreds of jobs cost one thread and one connection.

The same query hears `lockctl abort JOB` (the job's `abort` key, ledger/aborts.py): each abort
note not seen before goes to the tick core, which stops the run it names if it runs here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from provision.consul import Consul, ConsulError
from provision.consul.watch import watch_tree
from provision.ledger.aborts import AbortNote, decode_abort
from provision.ledger.backfill import BackfillNote, decode_backfill
from provision.ledger.control import ControlNote, decode_note
from provision.runner.events import EventLog
from provision.system.control_keys import ABORT, BACKFILL, CONTROL_ROOT, PAUSED, TRIGGER

BLOCKING_WAIT = 300.0  # seconds a query waits for a change (Consul's default)
MIN_PAUSE = 0.5  # seconds between two queries: a change storm, or an index that misleads
ERROR_PAUSE = 5.0  # after an error (Consul unreachable): the loops say so; this waits
WATCH_MAX_BYTES = 16 * 1024 * 1024  # every control key a worker may read, with room
T = TypeVar("T")


def control_notes(
    entries: Iterable[tuple[str, bytes | None]],
    jobs: Iterable[str],
    name: str,
    decode: Callable[[bytes | None], T | None],
) -> dict[str, T]:
    """The note in the `name` control key of each of `jobs`, from the watch's answer (pure):
    a value `decode` says is not a note lockctl wrote (None) is left alone."""
    wanted = set(jobs)
    found: dict[str, T] = {}
    for key, value in entries:
        job, _, found_name = key.removeprefix(CONTROL_ROOT).partition("/")
        if key.startswith(CONTROL_ROOT) and found_name == name and job in wanted:
            note = decode(value)
            if note is not None:
                found[job] = note
    return found


def pending_triggers(
    entries: Iterable[tuple[str, bytes | None]], jobs: Iterable[str]
) -> dict[str, ControlNote]:
    """The trigger of each of `jobs`: notes without an id or a time are not triggers lockctl
    wrote, and are left alone."""
    return control_notes(entries, jobs, TRIGGER, _trigger)


def _trigger(value: bytes | None) -> ControlNote | None:
    note = decode_note(value)
    return note if note.id is not None and note.at is not None else None


def pending_backfills(
    entries: Iterable[tuple[str, bytes | None]], jobs: Iterable[str]
) -> dict[str, BackfillNote]:
    """The backfill note of each of `jobs` (decode_backfill: one with no id, time or ticks is
    left alone)."""
    return control_notes(entries, jobs, BACKFILL, decode_backfill)


def abort_notes(
    entries: Iterable[tuple[str, bytes | None]], jobs: Iterable[str]
) -> dict[str, AbortNote]:
    """The abort note of each of `jobs` (decode_abort: one with no id, time, tick or session
    stops nothing)."""
    return control_notes(entries, jobs, ABORT, decode_abort)


def paused_jobs(entries: Iterable[tuple[str, bytes | None]], jobs: Iterable[str]) -> set[str]:
    """Which of `jobs` have their paused key in the watch's answer (pure): the key's existence
    pauses a job, whatever it holds (ledger/control.py)."""
    wanted = set(jobs)
    found = set()
    for key, _ in entries:
        job, _, name = key.removeprefix(CONTROL_ROOT).partition("/")
        if key.startswith(CONTROL_ROOT) and name == PAUSED and job in wanted:
            found.add(job)
    return found


class TriggerWatch:
    """One thread per scheduler: hands each new trigger of its jobs to `fire(job, note)`."""

    def __init__(
        self,
        consul: Callable[[], Consul | None],
        jobs: Callable[[], Iterable[str]],
        fire: Callable[[str, ControlNote], None],
        events: EventLog,
        stop: threading.Event,
        paused: Callable[[set[str]], None] | None = None,
        abort: Callable[[str, AbortNote], None] | None = None,
    ) -> None:
        """`paused(jobs)`: told at each answer which jobs are paused (for /metrics);
        `abort(job, note)`: each abort note not seen before."""
        self.consul, self.jobs, self.fire, self.events = consul, jobs, fire, events
        self.stop, self.paused, self.abort = stop, paused, abort
        self.seen: set[tuple[str, str]] = set()  # (job, trigger id) handed on already
        # `backfill(job, note)`: each backfill note of its jobs, at every answer (the core
        # keeps the ids it heard: a note heard again is not run again)
        self.backfill: Callable[[str, BackfillNote], None] | None = None
        self.aborts: set[tuple[str, str]] = set()  # (job, abort id) handed on already
        self.thread = threading.Thread(target=self._run, name="lockctl-triggers", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def forget(self, job: str, note: ControlNote) -> None:
        """A run of this trigger could not be tried: hand it on again at the next answer (the
        query's next change, or its wait's end); its claim refuses it if another ran it."""
        if note.id is not None:
            self.seen.discard((job, note.id))

    def _backfills(self, pairs: list[tuple[str, bytes | None]]) -> None:
        if self.backfill is not None:
            for job, note in pending_backfills(pairs, self.jobs()).items():
                self.backfill(job, note)

    def _run(self) -> None:
        index = 0
        while not self.stop.is_set():
            began, consul = time.monotonic(), self.consul()
            if consul is None:  # between two connections (a reload)
                self.stop.wait(MIN_PAUSE)
                continue
            try:
                entries, index = watch_tree(
                    consul.transport,
                    CONTROL_ROOT,
                    index,
                    BLOCKING_WAIT,
                    max_bytes=WATCH_MAX_BYTES,
                )
            except ConsulError as exc:
                self.events.emit("trigger-watch-failed", warning=str(exc))
                self.stop.wait(ERROR_PAUSE)
                index = 0
                continue
            pairs = [(entry.key, entry.value) for entry in entries]
            if self.paused is not None:
                self.paused(paused_jobs(pairs, self.jobs()))
            for job, note in pending_triggers(pairs, self.jobs()).items():
                assert note.id is not None
                if (job, note.id) not in self.seen:
                    self.seen.add((job, note.id))
                    self.fire(job, note)
            self._backfills(pairs)
            if self.abort is not None:
                self._hand_aborts(pairs, self.abort)
            self.stop.wait(max(0.0, MIN_PAUSE - (time.monotonic() - began)))

    def _hand_aborts(
        self, pairs: list[tuple[str, bytes | None]], abort: Callable[[str, AbortNote], None]
    ) -> None:
        for job, note in abort_notes(pairs, self.jobs()).items():
            assert note.note.id is not None
            if (job, note.note.id) not in self.aborts:
                self.aborts.add((job, note.note.id))
                abort(job, note)
