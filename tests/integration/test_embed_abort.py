"""`lockctl abort JOB` of an embedded run on the real cluster: a decorated call hears the note on
a blocking read of the job's abort key while its body runs, and serve() on the control keys'
query `lockctl schedule` uses (which brings it `lockctl trigger` and `backfill` too). The body
is told as a lost lock tells it (`run.check()` raises), the tick is recorded `aborted` with who
and why, and the call returns `aborted`. A note that names another run (this tick under another
session) stops nothing. A body with isolation="process" is ended with its whole tree: a child
that ignores SIGTERM and one in a session of its own are gone from /proc before the call
returns."""

from __future__ import annotations

import io
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

import pytest
from procscan import pids_with
from workers_lab import JobLab, one_job

from provision.embed import Locker, Outcome, Run, RunOutcome
from provision.ledger.aborts import AbortNote
from provision.ledger.control import ControlNote
from provision.ledger.records import TickOutcome, TickRecord, tick_key, timestamp
from provision.schedule import parse_schedule
from provision.system.control_keys import abort_key
from tests.lockctl_process import eventually

if TYPE_CHECKING:
    from conftest import LiveCluster

pytestmark = pytest.mark.cluster

WORKERS = ("worker-1",)
WAIT = 30.0
REASON = "a runaway export"
# A call plans the tick of its moment: made right after a tick (`at_next_tick`), its window (the
# interval) outlasts a slow start on a loaded machine, whenever the test runs.
INTERVAL = 10.0
EVERY = f"@every {INTERVAL:.0f}s"
SCHEDULE = parse_schedule(EVERY, "UTC")


@pytest.fixture(scope="module")
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobLab]:
    tmp = tmp_path_factory.mktemp("embed-abort")
    with one_job(live_cluster, tmp, "embed-aborted", WORKERS, {"schedule": f'"{EVERY}"'}) as lab:
        yield lab


class LoopingBody:
    """A body that runs until its run is stopped (`run.check()` raises), WAIT at most; the
    first run only: a later tick's run ends at once."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.stopped_by: list[str] = []  # what run.check() raised with

    def __call__(self, run: Run) -> None:
        if self.started.is_set():
            return
        self.started.set()
        give_up = time.monotonic() + WAIT
        while time.monotonic() < give_up:
            try:
                run.check()
            except Exception as exc:  # RunStopped: the abort
                self.stopped_by.append(f"{type(exc).__name__}: {exc}")
                raise
            time.sleep(0.05)


def at_next_tick() -> None:
    """Sleep until just after the schedule's next tick (a start, not a synchronisation)."""
    tick = SCHEDULE.next_ticks(datetime.now(timezone.utc), 1)[0]
    time.sleep(max(0.0, tick.timestamp() + 0.05 - time.time()))


def later_records(lab: JobLab, record: TickRecord) -> list[TickRecord]:
    return [r for r in lab.records() if r.tick > record.tick and not r.trigger]


def backfilled_range(lab: JobLab) -> list[datetime]:
    """Two ticks ten minutes ago (long closed, never run), after a record written before them:
    a backfill runs no tick older than the ledger's oldest record."""
    past = SCHEDULE.next_ticks(datetime.now(timezone.utc) - timedelta(minutes=10), 2)
    oldest = TickRecord(past[0] - timedelta(seconds=INTERVAL), TickOutcome.MISSED, worker="before")
    lab.cluster.management().kv.put(tick_key(lab.lock_key, oldest.tick), oldest.encode())
    return past


def finished_at(lab: JobLab, ticks: list[datetime]) -> list[TickRecord]:
    return [r for r in lab.records() if r.tick in ticks and r.finished]


def running(lab: JobLab) -> list[TickRecord]:
    return [r for r in lab.records() if r.outcome is TickOutcome.RUNNING]


def abort_as_operator(lab: JobLab) -> str:
    done = lab.operator("abort", lab.job, "--reason", REASON)
    assert done.returncode == 0, done.stderr
    print(f"\n$ lockctl abort {lab.job} --reason '{REASON}'\n{done.stdout}")  # for docs
    return done.stdout


def said_by(lab: JobLab, record: TickRecord) -> str:
    """Who aborted the run, when and why, as its record says it (ControlNote.said)."""
    [ended] = [r for r in lab.records() if r.tick == record.tick]
    assert ended.by and ended.asked_at and ended.reason
    return ControlNote(ended.by, ended.asked_at, ended.reason).said()


def assert_aborted(lab: JobLab, record: TickRecord) -> None:
    [ended] = [r for r in lab.records() if r.tick == record.tick]
    assert ended.outcome is TickOutcome.ABORTED, ended
    assert ended.reason == REASON and ended.by, ended
    assert ended.session == record.session and ended.lock_index is not None, ended


def test_a_decorated_call_obeys_an_abort_of_its_run_and_no_other(lab: JobLab) -> None:
    body, events = LoopingBody(), io.StringIO()
    outcome: list[RunOutcome] = []
    with Locker.from_config(lab.configs["worker-1"], events=events) as locker:
        call = locker.singleton(lab.job)(body)
        at_next_tick()
        thread = threading.Thread(target=lambda: outcome.append(call()))
        thread.start()
        try:
            assert body.started.wait(WAIT), events.getvalue()
            [record] = eventually(lambda: running(lab))
            # this tick under another session: heard, and the body goes on
            asked = ControlNote("a test", datetime.now(timezone.utc), "wrong", uuid.uuid4().hex)
            note = AbortNote(asked, record.tick, "another-session").encode()
            lab.cluster.management().kv.put(abort_key(lab.job), note)
            eventually(lambda: "abort-ignored" in events.getvalue())
            assert thread.is_alive() and not body.stopped_by, events.getvalue()

            said = abort_as_operator(lab)
            assert "stops it now, recorded `aborted`" in said
            thread.join(WAIT)
            assert not thread.is_alive(), events.getvalue()
        finally:
            thread.join(WAIT)
    [ran] = outcome
    print(f"\n{ran}\n{events.getvalue()}")  # for docs
    assert ran.outcome is Outcome.ABORTED and ran.tick == record.tick, (ran, events.getvalue())
    assert body.stopped_by == [f"RunStopped: aborted {said_by(lab, record)}"], body.stopped_by
    assert ran.error == body.stopped_by[0]
    assert_aborted(lab, record)
    assert "Traceback" not in events.getvalue()


def test_serve_obeys_an_abort_runs_the_next_tick_a_trigger_and_a_backfill(lab: JobLab) -> None:
    body, events = LoopingBody(), io.StringIO()
    with Locker.from_config(lab.configs["worker-1"], events=events) as locker:
        locker.singleton(lab.job)(body)
        stop = threading.Event()
        server = threading.Thread(target=locker.serve, args=(stop,))
        server.start()
        try:
            assert body.started.wait(WAIT + INTERVAL), events.getvalue()
            [record] = eventually(lambda: running(lab))
            abort_as_operator(lab)
            eventually(lambda: [r for r in lab.records() if r.tick == record.tick and r.finished])
            assert_aborted(lab, record)
            # a later tick runs (its body ends at once): the abort named the one run only
            later = eventually(
                lambda: [r for r in later_records(lab, record) if r.finished],
                timeout=WAIT + INTERVAL,
            )
            assert later and TickOutcome.ABORTED not in {r.outcome for r in later}, later
            succeeded = eventually(
                lambda: [
                    r for r in later_records(lab, record) if r.outcome is TickOutcome.SUCCEEDED
                ],
                timeout=WAIT + 2 * INTERVAL,  # a loaded machine may start one late: missed
            )
            assert succeeded, lab.records()
            # the same query brings it an operator's trigger: run once, recorded as one
            triggered = lab.operator("trigger", lab.job, "--reason", "rerun the export")
            assert triggered.returncode == 0, triggered.stderr
            manual = eventually(lambda: [r for r in lab.records() if r.trigger and r.finished])
            assert [r.outcome for r in manual] == [TickOutcome.SUCCEEDED], lab.records()
            assert manual[0].reason == "rerun the export", manual
            # and an operator's backfill of two past ticks nobody ran: each run once here
            past = backfilled_range(lab)
            span = ["--from", timestamp(past[0]), "--to", timestamp(past[-1])]
            asked = lab.operator("backfill", lab.job, *span, "--reason", "the outage")
            assert asked.returncode == 0, asked.stderr
            filled = eventually(lambda: len(finished_at(lab, past)) == len(past))
            assert filled, lab.records()
            assert {r.outcome for r in finished_at(lab, past)} == {TickOutcome.SUCCEEDED}
            assert all(r.backfill for r in finished_at(lab, past)), finished_at(lab, past)
        finally:
            stop.set()
            server.join(WAIT)
        assert not server.is_alive()
    assert body.stopped_by == [f"RunStopped: aborted {said_by(lab, record)}"], body.stopped_by
    assert "Traceback" not in events.getvalue()


# Each process of the tree holds this marker in its argv (`sleep <marker>`): no other does.
TREE_MARKER = f"700.{os.getpid()}{uuid.uuid4().int % 1000}"


def tree_body(run: Run) -> None:
    """A process body that starts a child ignoring SIGTERM and one in a session of its own
    (setsid: out of its process group), then waits as long as they do."""
    subprocess.Popen(["sh", "-c", 'trap "" TERM; exec sleep "$0"', TREE_MARKER])
    subprocess.Popen(["setsid", "sleep", TREE_MARKER])
    time.sleep(float(TREE_MARKER))


def test_an_aborted_process_body_is_ended_with_its_whole_tree(lab: JobLab) -> None:
    events = io.StringIO()
    outcome: list[RunOutcome] = []
    with Locker.from_config(lab.configs["worker-1"], events=events) as locker:
        call = locker.singleton(lab.job, isolation="process")(tree_body)
        at_next_tick()
        thread = threading.Thread(target=lambda: outcome.append(call()))
        thread.start()
        try:
            tree = eventually(
                lambda: pids_with(TREE_MARKER) if len(pids_with(TREE_MARKER)) == 2 else []
            )
            assert tree, events.getvalue()
            [record] = eventually(lambda: running(lab))
            abort_as_operator(lab)
            thread.join(WAIT)
            assert not thread.is_alive(), events.getvalue()
            # gone before the call returned: SIGTERM to the body's namespace, SIGKILL after
            # kill_grace for the child that ignores it, the setsid one with them
            assert pids_with(TREE_MARKER) == [], events.getvalue()
            assert all(not os.path.exists(f"/proc/{pid}") for pid in tree), tree
        finally:
            thread.join(WAIT)
    [ran] = outcome
    assert ran.outcome is Outcome.ABORTED and ran.tick == record.tick, (ran, events.getvalue())
    assert_aborted(lab, record)
    assert "Traceback" not in events.getvalue()
