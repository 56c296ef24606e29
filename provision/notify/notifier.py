"""The tick core's listener that notifies: each note that decided a tick here (message.py
`decided`) becomes the deliveries of its job's notify blocks and ping, handed to the sender's
queue. Nothing here waits: the one read a recovery needs (the previous tick's record) is made
on the sender's thread, when the delivery's turn comes.

The URLs are read from their files when the jobs are given (`load_job`): at a scheduler's
start and at each reload, so a file that cannot be used refuses the start (or the reload)
with one line naming it, and a changed URL is taken at the next reload.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Protocol

from provision.ledger.records import TickRecord
from provision.notify.message import (
    SUCCEEDED,
    decided,
    previous_tick,
    recovered,
    repeated,
    webhook_body,
)
from provision.notify.sender import Delivery, Later
from provision.outcomes import Outcome
from provision.schedule import Schedule
from provision.system.notify_rules import PING, Notifications, read_url_file
from provision.system.secrets import Secret
from provision.tick.edge import Note
from provision.tick.store import JobKeys

PING_FAILS = ("failed", "lost")  # what a ping's /fail says; a missed tick is the ping's silence

ReadTick = Callable[[JobKeys, datetime], "TickRecord | None"]
Target = tuple[str, tuple[str, ...], Secret, "float | None"]  # name, on, URL, repeat_after


class Submit(Protocol):
    def submit(self, delivery: Delivery) -> None: ...


@dataclass(frozen=True)
class JobNotify:
    """One job's notifications, ready: its keys and schedule (a recovery's and a repeat's
    previous tick), each notify block with its URL and its repeat window (seconds, or None:
    a repeat is never told), and its ping URL."""

    keys: JobKeys
    schedule: Schedule
    targets: tuple[Target, ...] = field(repr=False)
    ping: Secret | None = field(default=None, repr=False)

    def secrets(self) -> list[str]:
        urls = [target[2] for target in self.targets] + ([self.ping] if self.ping else [])
        return [url.reveal() for url in urls]


def load_job(keys: JobKeys, schedule: Schedule, notifications: Notifications) -> JobNotify:
    """The job's URLs read from their files (InputError naming a file that cannot be used)."""
    targets = tuple(
        (t.name, t.on, read_url_file(Path(t.url_file)), t.repeat_seconds)
        for t in notifications.targets
    )
    ping_file = notifications.ping_url_file
    ping = None if ping_file is None else read_url_file(Path(ping_file))
    return JobNotify(keys, schedule, targets, ping)


def fail_url(url: Secret) -> Secret:
    """A ping URL's failure signal, healthchecks.io's way: `<url>/fail` (before any query)."""
    base, mark, query = url.reveal().partition("?")
    return Secret(f"{base.rstrip('/')}/fail{mark}{query}")


class Notifier:
    """A Listener: `notifier(note)`. `jobs` may be replaced whole at any time (`update`)."""

    def __init__(self, sender: Submit, read_tick: ReadTick) -> None:
        self.sender, self.read_tick = sender, read_tick
        self._jobs: dict[str, JobNotify] = {}
        self._lock = threading.Lock()

    def update(self, jobs: Iterable[JobNotify]) -> None:
        fresh = {job.keys.unit: job for job in jobs}  # a keyed job's keys: each its own
        with self._lock:
            self._jobs = fresh

    def __call__(self, note: Note) -> None:
        found = decided(note)
        if found is None:
            return
        with self._lock:
            job = self._jobs.get(note.job)
        if job is not None:
            for delivery in deliveries(job, *found, self.read_tick):
                self.sender.submit(delivery)


def deliveries(
    job: JobNotify, word: str, record: TickRecord, read_tick: ReadTick
) -> list[Delivery]:
    """What a decided tick sends: the ping (success, or /fail: every run), then each notify
    block told of the outcome, unless it repeats the previous tick's; a recovery's, to those
    told of `recovered`. Both are made on the sender's thread once a record is read."""
    name, tick, made = job.keys.unit, record.tick, []
    if job.ping is not None and (word == SUCCEEDED or word in PING_FAILS):
        url = job.ping if word == SUCCEEDED else fail_url(job.ping)
        made.append(Delivery(name, tick, PING, word, url, "GET"))
    for notify, on, url, repeat_after in job.targets:
        if word != SUCCEEDED and word in on:
            told = Told(job, word, record, notify)
            later = functools.partial(_unless_repeated, told, repeat_after, read_tick)
            made.append(Delivery(name, tick, notify, word, url, "POST", None, later))
        if "recovered" in on and word in (SUCCEEDED, "missed"):
            look = _after_success if word == SUCCEEDED else _after_missed
            later = functools.partial(look, job, record, notify, read_tick)
            made.append(Delivery(name, tick, notify, "recovered", url, "POST", None, later))
    return made


@dataclass(frozen=True)
class Told:
    """An outcome a notify block is told of: the job, the word, its record, the block."""

    job: JobNotify
    word: str
    record: TickRecord
    notify: str


def _unless_repeated(told: Told, repeat_after: float | None, read_tick: ReadTick) -> Later | None:
    """The outcome's body, unless the job's previous tick's record had the same outcome within
    the block's repeat window (message.py `repeated`): the ledger is the state, so the replica
    that decides the next tick knows what the last one was told. A read that fails tells: a
    page twice rather than none."""
    job, record = told.job, told.record
    before = previous_tick(job.schedule, record.tick)
    try:
        previous = None if before is None else read_tick(job.keys, before)
    except Exception:  # Consul not answering (notify/ knows no Consul client's errors)
        previous = None
    if repeated(told.word, record.tick, previous, repeat_after):
        return None
    body = webhook_body(job.keys.name, told.word, record, told.notify, job.secrets())
    return record.tick, body


def _after_success(
    job: JobNotify, record: TickRecord, notify: str, read_tick: ReadTick
) -> Later | None:
    """A success recovers when the job's previous tick's record says it went wrong."""
    before = previous_tick(job.schedule, record.tick)
    if before is None or not recovered(read_tick(job.keys, before)):
        return None
    return record.tick, webhook_body(job.keys.name, "recovered", record, notify, job.secrets())


def _after_missed(
    job: JobNotify, record: TickRecord, notify: str, read_tick: ReadTick
) -> Later | None:
    """A tick recorded missed after the next tick already succeeded (a replica back from an
    outage runs a late tick before its housekeeping records the ones before): that success was
    the recovery, and it could not know. Each side reads after its own write, so one of the two
    sees the other's: a recovery is told at least once."""
    after = job.schedule.next_ticks(record.tick, 1)[0]
    succeeded = read_tick(job.keys, after)
    if succeeded is None or succeeded.outcome is not Outcome.SUCCEEDED:
        return None
    body = webhook_body(job.keys.name, "recovered", succeeded, notify, job.secrets())
    return succeeded.tick, body
