"""provision/scheduler/report.py: the tick core's notes as the scheduler's events, /metrics and
/healthz. Real TickCores in virtual time against the in-memory Consul (tick_fleet.py's pattern),
each replica with its own report; then the pure mappings as tables, and the notes the cores do
not make in these scenarios fed directly."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, cast

import pytest
from tick_fleet import KEYS, START, at, every_10s

from provision.consul import ConsulUnavailable
from provision.ledger.control import ControlNote, manual_tick
from provision.ledger.records import TickOutcome, TickRecord, tick_name
from provision.ledger.turns import claim_order
from provision.scheduler.report import (
    OUTCOMES,
    SCHEDULER_EVENTS,
    CoreReport,
    JobHealth,
    RunContext,
    SessionState,
    consul_answered,
    health_verdict,
    note_events,
    record_outcome_label,
    skip_reason,
    tick_outcome,
)
from provision.sessions import AgentlessNode, SessionTerms
from provision.system.control_keys import paused_key, trigger_key
from provision.tick.clock import VirtualClock
from provision.tick.core import CoreJob, Identity, TickCore
from provision.tick.edge import BodyEnd, Note, Run, SkipReason, StopHow
from provision.tick.memory import MemoryTickStore
from provision.tick.store import JobKeys, TickStore

JOB = KEYS.name
HOSTILE = "simulated: no route\x1b[31m\nforged line"  # Consul's words: anything may be in them

TERMS = SessionTerms("lockctl w1", 15.0, 15.0, "release", 5.0)
AGENTLESS = replace(TERMS, node=AgentlessNode("worker-9", "10.0.0.9"))


class Scripted:
    """A body that ends after `duration` with the next of the fleet's exit statuses; on
    TERMINATE it ends 0.5 s later (-15), on KILL at once (-9)."""

    def __init__(self, clock: VirtualClock, duration: float, status: int) -> None:
        self.clock, self.duration, self.status = clock, duration, status
        self.end: BodyEnd | None = None
        self._ended: Callable[[], None] = lambda: None

    @property
    def ending(self) -> BodyEnd | None:
        return self.end

    def start(self, run: Run, ended: Callable[[], None]) -> None:
        self._ended = ended
        self.clock.call_later(self.duration, lambda: self._finish(self.status))

    def stop(self, how: StopHow) -> None:
        status = -9 if how is StopHow.KILL else -15
        self.clock.call_later(0.0 if how is StopHow.KILL else 0.5, lambda: self._finish(status))

    def _finish(self, status: int) -> None:
        if self.end is None:
            self.end = BodyEnd(status)
            self._ended()


class Outage:
    """A replica's way to Consul that can go down: every request refused meanwhile."""

    def __init__(self, store: MemoryTickStore) -> None:
        self.store, self.down = store, False

    def __getattr__(self, name: str) -> object:
        attribute = getattr(self.store, name)
        if not self.down or not callable(attribute):
            return attribute

        def refused(*args: object, **kwargs: object) -> object:
            raise ConsulUnavailable(HOSTILE)

        return refused


class StampedLate:
    """A replica's way to Consul whose first read of a tick is stamped `late` seconds after
    the tick on Consul's clock (its Date): the tick is judged too late to claim."""

    def __init__(self, store: MemoryTickStore, late: float) -> None:
        self.store, self.late = store, late

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    def read_tick(
        self, keys: JobKeys, tick: datetime, *, stale: bool = False
    ) -> tuple[TickRecord | None, datetime | None]:
        record, date = self.store.read_tick(keys, tick, stale=stale)
        late, self.late = self.late, 0.0
        return record, None if date is None else date + timedelta(seconds=late)


@dataclass
class Replicas:
    """Real cores of one job on one clock and store, each replica reporting to its own
    CoreReport (its events in a stream of its own); bodies exit with `statuses` in turn."""

    job: CoreJob = field(default_factory=lambda: every_10s(workers=("w1",)))
    duration: float = 2.0
    statuses: list[int] = field(default_factory=lambda: [0])
    clock: VirtualClock = field(default_factory=lambda: VirtualClock(START))
    store: MemoryTickStore = field(init=False)
    reports: dict[str, CoreReport] = field(default_factory=dict)
    streams: dict[str, io.StringIO] = field(default_factory=dict)
    cores: dict[str, TickCore] = field(default_factory=dict)
    made: int = 0

    def __post_init__(self) -> None:
        self.store = MemoryTickStore(self.clock)

    def start(self, worker: str, store: object = None) -> TickCore:
        stream = self.streams[worker] = io.StringIO()
        report = self.reports[worker] = CoreReport(worker, stream)
        report.schedule_known(JOB, "@every 10s", "UTC")
        reached = cast(TickStore, store or self.store)
        core = TickCore(reached, self.clock, Identity(worker), [self.job], self._body, report)
        self.cores[worker] = core
        core.start()
        return core

    def _body(self, job: str, tick: datetime) -> Scripted:
        status = self.statuses[min(self.made, len(self.statuses) - 1)]
        self.made += 1
        return Scripted(self.clock, self.duration, status)

    def run(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def events(self, worker: str, job: str = JOB) -> list[dict[str, Any]]:
        lines = self.streams[worker].getvalue().splitlines()
        return [e for e in map(json.loads, lines) if e["job"] == job]

    def named(self, worker: str, name: str, job: str = JOB) -> list[dict[str, Any]]:
        return [e for e in self.events(worker, job) if e["event"] == name]

    def sample(self, worker: str, name: str, **labels: str) -> float | None:
        wanted = {"job": JOB, "worker": worker, **labels}
        return self.reports[worker].registry.get_sample_value(name, wanted)

    def record(self, tick: datetime) -> TickRecord | None:
        return self.store.read_tick(self.job.keys, tick)[0]


def ticks(replicas: Replicas, worker: str) -> dict[str, float | None]:
    """lockctl_ticks_total by outcome, every outcome (each one at 0 from the start)."""
    return {o: replicas.sample(worker, "lockctl_ticks_total", outcome=o) for o in OUTCOMES}


def only(outcomes: dict[str, float | None], **counted: float) -> dict[str, float]:
    """Every outcome at 0 but those given."""
    return {o: counted.get(o.replace("-", "_"), 0.0) for o in outcomes}


# -- real cores ----------------------------------------------------------------------------------
def test_a_run_that_succeeds_says_due_acquired_released_and_counts_a_success() -> None:
    replicas = Replicas()
    replicas.start("w1")
    replicas.run(5)
    record = replicas.record(at(0))
    assert record is not None and record.outcome is TickOutcome.SUCCEEDED
    events = replicas.events("w1")
    assert [e["event"] for e in events] == ["tick-due", "acquired", "released"]
    due, acquired, released = events
    assert due["tick"] == acquired["tick"] == released["tick"] == tick_name(at(0))
    assert (acquired["lock_index"], acquired["session"]) == (record.lock_index, record.session)
    assert acquired["start_lag_ms"] == pytest.approx((record.start_lag or 0) * 1000, abs=0.1)
    assert released["released"] is True and released["child_status"] == 0
    assert released["outcome"] == "succeeded" and released["held_ms"] == 2000.0
    assert replicas.named("w1", "session-created", job=SCHEDULER_EVENTS)

    assert ticks(replicas, "w1") == only(ticks(replicas, "w1"), ran=1)
    assert replicas.sample("w1", "lockctl_run_duration_seconds_count") == 1
    assert replicas.sample("w1", "lockctl_run_duration_seconds_sum") == pytest.approx(2.0)
    assert replicas.sample("w1", "lockctl_start_lag_seconds_count") == 1
    assert record.finished_at is not None
    last = replicas.sample("w1", "lockctl_job_last_success_timestamp_seconds")
    assert last == record.finished_at.timestamp()
    assert replicas.sample("w1", "lockctl_job_running") == 0
    assert replicas.sample("w1", "lockctl_ticks_since_success") == 0
    assert replicas.sample("w1", "lockctl_run_failures_total") == 0
    assert replicas.reports["w1"].verdict().text == "ok"


def test_a_run_running_shows_as_running_until_it_ends() -> None:
    replicas = Replicas(duration=4.0)
    replicas.start("w1")
    replicas.run(1)
    assert replicas.sample("w1", "lockctl_job_running") == 1
    replicas.run(4)
    assert replicas.sample("w1", "lockctl_job_running") == 0


def test_a_run_that_fails_counts_as_ran_and_as_a_run_failure_never_a_success() -> None:
    replicas = Replicas(statuses=[1])
    replicas.start("w1")
    replicas.run(5)
    (released,) = replicas.named("w1", "released")
    assert released["child_status"] == 1 and released["outcome"] == "failed"
    assert ticks(replicas, "w1") == only(ticks(replicas, "w1"), ran=1)
    assert replicas.sample("w1", "lockctl_run_failures_total") == 1
    assert replicas.sample("w1", "lockctl_ticks_since_success") == 1
    assert replicas.sample("w1", "lockctl_job_last_success_timestamp_seconds") is None
    assert replicas.sample("w1", "lockctl_job_failing") == 0  # the job's failure, not lockctl's


def test_a_tick_another_replica_took_is_a_skip_for_taken_there() -> None:
    replicas = Replicas(job=every_10s(workers=("w1", "w2")))
    first, second = claim_order(JOB, at(0), ("w1", "w2"))
    replicas.start(first)
    replicas.start(second)
    replicas.run(5)
    assert ticks(replicas, first) == only(ticks(replicas, first), ran=1)
    assert ticks(replicas, second) == only(ticks(replicas, second), skipped=1)
    assert replicas.sample(second, "lockctl_skips_total", reason="taken") == 1
    assert replicas.sample(second, "lockctl_skips_total", reason="other") == 0
    assert [e["event"] for e in replicas.events(second)] == ["tick-due", "skipped"]
    (skipped,) = replicas.named(second, "skipped")
    assert skipped["tick"] == tick_name(at(0)) and skipped["reason"].startswith("taken")
    assert replicas.sample(second, "lockctl_consul_up") == 1  # its read was answered


def test_a_tick_passing_whole_while_the_run_goes_on_is_skipped_for_overlap() -> None:
    replicas = Replicas(duration=25.0)
    replicas.start("w1")
    replicas.run(26)  # ticks 10 and 20 come while tick 0 runs here (until 25)
    skipped = replicas.named("w1", "skipped")
    assert [e["tick"] for e in skipped] == [tick_name(at(10))]  # passed whole meanwhile
    assert skipped[0]["reason"] == f"overlap: tick {tick_name(at(0))} ran here meanwhile"
    assert replicas.sample("w1", "lockctl_skips_total", reason="overlap") == 1
    assert ticks(replicas, "w1") == only(ticks(replicas, "w1"), skipped=1, ran=1)
    assert replicas.sample("w1", "lockctl_ticks_since_success") == 0  # the run succeeded
    # tick 20, its window still open when tick 0 ended, is claimed then, 5 s late
    late = [e for e in replicas.named("w1", "acquired") if e["tick"] == tick_name(at(20))]
    assert late and late[0]["start_lag_ms"] == 5000.0


def test_consul_out_of_reach_then_answering_again_is_said_counted_and_on_healthz() -> None:
    replicas = Replicas()
    outage = Outage(replicas.store)
    outage.down = True
    replicas.start("w1", store=outage)
    replicas.run(5)
    (unavailable,) = replicas.named("w1", "consul-unavailable")
    assert unavailable["tick"] == tick_name(at(0)) and "fail closed" in unavailable["detail"]
    assert "\x1b" not in unavailable["error"] and "\\x1b[31m\\nforged" in unavailable["error"]
    assert replicas.sample("w1", "lockctl_consul_up") == 0
    counted = ticks(replicas, "w1")
    assert counted == only(counted, consul_unavailable=1)
    verdict = replicas.reports["w1"].verdict()
    assert verdict.status == 503 and verdict.text.startswith(
        f"{JOB}: Consul did not answer its last request (simulated: no route\\x1b"
    )
    assert "\n" not in verdict.text

    outage.down = False
    replicas.run(10)  # tick 10: read, claimed, run
    names = [e["event"] for e in replicas.events("w1")]
    assert names[names.index("consul-recovered") + 1] == "acquired", names
    assert names.count("consul-unavailable") == 1 and names.count("consul-recovered") == 1
    assert replicas.sample("w1", "lockctl_consul_up") == 1
    assert replicas.reports["w1"].verdict().text == "ok"
    counted = ticks(replicas, "w1")
    assert counted == only(counted, consul_unavailable=1, ran=1)


def test_a_tick_nobody_ran_is_recorded_missed_here_and_said_as_housekeeping() -> None:
    replicas = Replicas()
    outage = Outage(replicas.store)
    outage.down = True
    replicas.start("w1", store=outage)
    replicas.run(5)
    outage.down = False
    replicas.run(40)  # tick 0's window closed, its fate looked at: nobody ran it
    record = replicas.record(at(0))
    assert record is not None and record.outcome is TickOutcome.MISSED
    (housekeeping,) = replicas.named("w1", "housekeeping")
    assert housekeeping["missed_recorded"] == 1
    assert housekeeping["missed_ticks"] == [tick_name(at(0))]
    assert replicas.sample("w1", "lockctl_missed_ticks_recorded_total") == 1
    assert replicas.sample("w1", "lockctl_ticks_total", outcome="ran") == 4  # 10, 20, 30, 40


def test_a_tick_come_too_late_for_is_a_miss_never_a_skip_and_its_record_housekeeping() -> None:
    replicas = Replicas()
    replicas.start("w1", store=StampedLate(replicas.store, late=31.0))
    replicas.run(15)  # tick 0 judged too late, its fate looked at (nobody ran it); tick 10 runs
    assert [(e["event"], e["tick"]) for e in replicas.events("w1")[:3]] == [
        ("tick-due", tick_name(at(0))),
        ("missed", tick_name(at(0))),
        ("tick-due", tick_name(at(10))),
    ]
    (missed,) = replicas.named("w1", "missed")
    assert missed["reason"].startswith("too late") and missed["recorded"] is False
    assert ticks(replicas, "w1") == only(ticks(replicas, "w1"), missed=1, ran=1)
    skips = [replicas.sample("w1", "lockctl_skips_total", reason=r.value) for r in SkipReason]
    assert skips == [0.0] * len(SkipReason)
    record = replicas.record(at(0))
    assert record is not None and record.outcome is TickOutcome.MISSED
    (housekeeping,) = replicas.named("w1", "housekeeping")
    assert housekeeping["missed_ticks"] == [tick_name(at(0))]
    assert replicas.sample("w1", "lockctl_missed_ticks_recorded_total") == 1
    assert replicas.sample("w1", "lockctl_consul_up") == 1


def test_a_trigger_consul_does_not_answer_loses_no_tick_and_runs_once_it_answers() -> None:
    replicas = Replicas()
    outage = Outage(replicas.store)
    replicas.start("w1", store=outage)
    replicas.run(3)  # tick 0 ran
    outage.down = True
    note = ControlNote("alice", at(3) + timedelta(milliseconds=250), "now", id="t-1")
    replicas.store.put(trigger_key(JOB), note.encode())
    replicas.cores["w1"].trigger(JOB, note)
    replicas.run(2)
    (unavailable,) = replicas.named("w1", "consul-unavailable")
    assert "tick" not in unavailable and "detail" not in unavailable  # no tick failed closed
    assert replicas.sample("w1", "lockctl_consul_up") == 0
    assert replicas.reports["w1"].verdict().status == 503
    assert ticks(replicas, "w1") == only(ticks(replicas, "w1"), ran=1)
    outage.down = False
    replicas.run(4)  # tried again: run
    acquired = replicas.named("w1", "acquired")
    assert [e["tick"] for e in acquired] == [tick_name(at(0)), tick_name(manual_tick(at(3.25)))]
    assert acquired[-1]["trigger"] == "t-1"
    assert ticks(replicas, "w1") == only(ticks(replicas, "w1"), ran=2)
    assert replicas.reports["w1"].verdict().text == "ok"


def test_a_tick_a_pause_held_is_recorded_paused_here_neither_missed_nor_a_turn() -> None:
    replicas = Replicas()
    outage = Outage(replicas.store)
    outage.down = True
    replicas.start("w1", store=outage)
    replicas.run(5)  # tick 0 not read: failed closed
    replicas.store.put(paused_key(JOB), ControlNote("alice", at(-60), "disk swap").encode())
    outage.down = False
    replicas.run(10)  # tick 0's fate: nobody ran it, a pause held it; tick 10 claimed paused
    record = replicas.record(at(0))
    assert record is not None and record.outcome is TickOutcome.PAUSED
    (housekeeping,) = replicas.named("w1", "housekeeping")
    assert (housekeeping["missed_recorded"], housekeeping["paused_recorded"]) == (0, 1)
    assert replicas.sample("w1", "lockctl_missed_ticks_recorded_total") == 0
    (skipped,) = replicas.named("w1", "skipped")
    assert skipped["tick"] == tick_name(at(10)) and skipped["paused_by"] == "alice"
    assert replicas.sample("w1", "lockctl_skips_total", reason="paused") == 1
    counted = ticks(replicas, "w1")
    assert counted == only(counted, consul_unavailable=1, skipped=1)  # tick 0, tick 10


def test_a_paused_job_is_skipped_for_paused_with_who_paused_it() -> None:
    replicas = Replicas()
    pause = ControlNote("alice@ops", at(-60), "disk swap")
    replicas.store.put(paused_key(JOB), pause.encode())
    replicas.start("w1")
    replicas.reports["w1"].paused({JOB, "not-ours"})
    replicas.run(5)
    assert replicas.made == 0  # no body started
    (skipped,) = replicas.named("w1", "skipped")
    assert (
        skipped["paused_by"] == "alice@ops"
        and "paused, by alice@ops (disk swap)" in (skipped["reason"])
    )
    assert replicas.sample("w1", "lockctl_skips_total", reason="paused") == 1
    assert ticks(replicas, "w1") == only(ticks(replicas, "w1"), skipped=1)
    assert replicas.sample("w1", "lockctl_job_paused") == 1
    assert replicas.sample("w1", "lockctl_job_running") == 0
    replicas.reports["w1"].paused(set())  # lockctl resume, as the watch saw it
    assert replicas.sample("w1", "lockctl_job_paused") == 0


def test_a_retry_is_said_and_counted_and_the_tick_counts_once() -> None:
    job = every_10s(workers=("w1",), retries=1, retry_delay=1.0)
    replicas = Replicas(job=job, duration=1.0, statuses=[1, 0])
    replicas.start("w1")
    replicas.run(6)
    names = [e["event"] for e in replicas.events("w1")]
    assert names == ["tick-due", "acquired", "retrying", "retry-started", "released"]
    (acquired,) = replicas.named("w1", "acquired")
    (retrying,) = replicas.named("w1", "retrying")
    (started,) = replicas.named("w1", "retry-started")
    (released,) = replicas.named("w1", "released")
    assert (retrying["attempt"], retrying["after_status"]) == (2, 1)
    assert started["attempt"] == 2
    assert retrying["session"] == started["session"] == acquired["session"]
    assert released["attempts"] == [1, 0] and released["child_status"] == 0
    assert replicas.sample("w1", "lockctl_job_retries_total") == 1
    assert replicas.sample("w1", "lockctl_retries_cut_total") == 0
    assert ticks(replicas, "w1") == only(ticks(replicas, "w1"), ran=1)
    assert replicas.sample("w1", "lockctl_run_failures_total") == 0  # the tick succeeded


def test_each_retry_says_its_attempt_and_the_status_before_it_from_the_record() -> None:
    job = every_10s(workers=("w1",), retries=2, retry_delay=1.0)
    replicas = Replicas(job=job, duration=1.0, statuses=[1, 3, 0])
    replicas.start("w1")
    replicas.run(8)
    retrying = replicas.named("w1", "retrying")
    assert [(e["attempt"], e["after_status"]) for e in retrying] == [(2, 1), (3, 3)]
    assert [e["attempt"] for e in replicas.named("w1", "retry-started")] == [2, 3]
    (released,) = replicas.named("w1", "released")
    assert released["attempts"] == [1, 3, 0] and released["outcome"] == "succeeded"
    assert replicas.sample("w1", "lockctl_job_retries_total") == 2
    assert ticks(replicas, "w1") == only(ticks(replicas, "w1"), ran=1)


def test_renewals_unanswered_fence_the_run_and_its_completion_waits_for_consul() -> None:
    replicas = Replicas(duration=30.0)
    outage = Outage(replicas.store)
    replicas.start("w1", store=outage)
    replicas.run(1)
    outage.down = True
    replicas.run(11)  # renewals at 5 and 10 unanswered: fenced at 9, its completion refused
    assert replicas.sample("w1", "lockctl_renew_failures_total") == 2
    assert replicas.sample("w1", "lockctl_consul_up") == 0
    failed = replicas.named("w1", "renew-failed", job=SCHEDULER_EVENTS)
    assert len(failed) == 2 and "\x1b" not in failed[0]["error"]
    outage.down = False
    replicas.run(4)
    names = [e["event"] for e in replicas.events("w1")]
    assert names[:3] == ["tick-due", "acquired", "fenced"], names
    assert "complete-retry" in names and names.index("complete-retry") < names.index("lost")
    counted = ticks(replicas, "w1")
    assert counted == only(counted, lost=1)
    # tick 10 came while tick 0 was busy: claimed once its completion was answered (late)
    assert [e["tick"] for e in replicas.named("w1", "acquired")][-1] == tick_name(at(10))
    assert replicas.sample("w1", "lockctl_skips_total", reason="overlap") == 0
    assert replicas.sample("w1", "lockctl_consul_up") == 1


def test_a_session_consul_forgot_is_on_healthz_until_one_is_made_again() -> None:
    replicas = Replicas(duration=8.0)
    core = replicas.start("w1")
    replicas.run(1)
    (run,) = core.runs
    replicas.store.destroy_session(run.claimed.session)  # an operator, a TTL
    replicas.run(5)  # the next renewal finds it gone
    (lost,) = replicas.named("w1", "session-lost", job=SCHEDULER_EVENTS)
    assert lost["reason"]
    verdict = replicas.reports["w1"].verdict()
    assert verdict.status == 503 and "session was lost" in verdict.text
    replicas.run(5)  # tick 10: a new session
    assert replicas.reports["w1"].verdict().text == "ok"
    assert replicas.named("w1", "fenced") and replicas.named("w1", "lost")
    assert replicas.sample("w1", "lockctl_ticks_total", outcome="lost") == 1


# -- the pure mappings -----------------------------------------------------------------------------
def _record(outcome: TickOutcome, **fields: Any) -> TickRecord:
    made = {"worker": "w1", "session": "s-1", "lock_index": 7, **fields}
    return TickRecord(at(0), outcome, **made)


@pytest.mark.parametrize(
    ("outcome", "label"),
    [
        (TickOutcome.SUCCEEDED, "ran"),
        (TickOutcome.FAILED, "ran"),  # a failure is lockctl_run_failures_total
        (TickOutcome.LOST, "lost"),
        (TickOutcome.INTERRUPTED, "interrupted"),
        (TickOutcome.TIMED_OUT, "timed-out"),
        (TickOutcome.MISSED, "missed"),
        (TickOutcome.PAUSED, "skipped"),
        (TickOutcome.RUNNING, "error"),  # no finished run's record: a bug
        (TickOutcome.UNREADABLE, "error"),
    ],
)
def test_a_records_outcome_is_a_ticks_total_outcome(outcome: TickOutcome, label: str) -> None:
    assert record_outcome_label(outcome) == label and label in OUTCOMES


UNRUN_MISSED = TickRecord(at(0), TickOutcome.MISSED, worker="w1")  # a fate look's
UNRUN_PAUSED = TickRecord(at(0), TickOutcome.PAUSED, worker="w1", by="alice")  # a pause held it


@pytest.mark.parametrize(
    ("note", "outcome", "skip", "answered"),
    [
        (Note("due", JOB, at(0)), None, None, None),
        (Note("skipped", JOB, at(0), "taken", skip=SkipReason.TAKEN), "skipped", "taken", True),
        (Note("skipped", JOB, at(0), "busy", skip=SkipReason.OVERLAP), "skipped", "overlap", None),
        (
            Note("skipped", JOB, at(0), "at capacity", skip=SkipReason.AT_CAPACITY),
            "skipped",
            "at-capacity",
            None,
        ),
        (
            Note("skipped", JOB, at(0), "x", skip=SkipReason.LOCK_DELAY),
            "skipped",
            "lock-delay",
            True,
        ),
        (Note("skipped", JOB, at(0), "expired", skip=SkipReason.OTHER), "skipped", "other", True),
        (Note("too-late", JOB, at(0), "its claim window closed"), "missed", None, True),
        (Note("skipped", JOB, at(0), "overlap"), "skipped", "other", True),  # not from words
        (Note("unavailable", JOB, at(0), "down"), "consul-unavailable", None, False),
        (Note("unavailable", JOB, None, "down"), None, None, False),  # no tick's turn
        (Note("unanswered", JOB, at(0), "timeout"), "consul-unavailable", None, False),
        (Note("claimed", JOB, at(0), record=_record(TickOutcome.RUNNING)), None, None, True),
        (
            Note("paused", JOB, at(0), "alice", record=_record(TickOutcome.PAUSED)),
            "skipped",
            "paused",
            True,
        ),
        # a claim's, even with a record no claim would write: no record is told by its fields
        (Note("paused", JOB, at(0), record=UNRUN_PAUSED), "skipped", "paused", True),
        # a record of a tick nobody ran, written here: no turn of this replica's
        (Note("missed", JOB, at(0), "missed", record=UNRUN_MISSED), None, None, True),
        (Note("missed", JOB, at(0), "paused", record=UNRUN_PAUSED), None, None, True),
        (Note("orphan", JOB, at(0)), None, None, True),
        (Note("fenced", JOB, at(0)), None, None, None),
        (Note("retrying", JOB, at(0), record=_record(TickOutcome.RUNNING)), None, None, None),
        (Note("complete-retry", JOB, at(0)), None, None, False),
        (
            Note("completed", JOB, at(0), record=_record(TickOutcome.TIMED_OUT)),
            "timed-out",
            None,
            True,
        ),
        (Note("completed", JOB, at(0), "succeeded"), None, None, True),  # no record: no guess
        (Note("trigger", JOB, at(0), "t-1"), None, None, None),
    ],
)
def test_each_note_counts_one_outcome_at_most_and_says_whether_consul_answered(
    note: Note, outcome: str | None, skip: str | None, answered: bool | None
) -> None:
    assert tick_outcome(note) == outcome
    reason = skip_reason(note)
    assert (None if reason is None else reason.value) == skip
    assert consul_answered(note) is answered


CLAIMED = _record(TickOutcome.RUNNING, start_lag=0.25)


def so_far(*statuses: int | None) -> TickRecord:
    """A retry note's record: the claimed one (another session than the run context's, so the
    event's session is seen to be the note's), with the attempts ended so far."""
    return replace(CLAIMED, session="s-2", attempts=statuses)


@pytest.mark.parametrize(
    ("note", "expected"),
    [
        (Note("due", JOB, at(0)), [("tick-due", {"tick": tick_name(at(0))})]),
        (
            Note("skipped", JOB, at(0), "lock held", skip=SkipReason.OTHER),
            [("skipped", {"tick": tick_name(at(0)), "reason": "other: lock held"})],
        ),
        (
            Note("skipped", JOB, at(0), "lock-delay", skip=SkipReason.LOCK_DELAY),
            [("skipped", {"tick": tick_name(at(0)), "reason": "lock-delay"})],
        ),
        (
            Note("claimed", JOB, at(0), record=replace(CLAIMED, catchup=True)),
            [
                ("catch-up", {"tick": tick_name(at(0)), "lag_ms": 250.0}),
                (
                    "acquired",
                    {
                        "tick": tick_name(at(0)),
                        "session": "s-1",
                        "lock_index": 7,
                        "start_lag_ms": 250.0,
                        "trigger": None,
                        "catchup": True,
                    },
                ),
            ],
        ),
        (
            Note("claimed", JOB, at(0), record=replace(CLAIMED, backfill="b-1")),
            [
                (
                    "acquired",
                    {
                        "tick": tick_name(at(0)),
                        "session": "s-1",
                        "lock_index": 7,
                        "start_lag_ms": 250.0,
                        "trigger": None,
                        "catchup": None,
                        "backfill": "b-1",  # only a backfill's run says it
                    },
                ),
            ],
        ),
        (
            Note("backfill", JOB, at(0), "3 ticks (b-1)"),
            [("backfill", {"tick": tick_name(at(0)), "detail": "3 ticks (b-1)"})],
        ),
        (
            # the attempt from the record's ended attempts, never from the note's words
            Note("retrying", JOB, at(0), "attempt 9 after status 4", so_far(1, None), seconds=2.5),
            [
                (
                    "retrying",
                    {
                        "tick": tick_name(at(0)),
                        "session": "s-2",
                        "attempt": 3,
                        "after_status": None,
                        "delay_ms": 2500.0,
                    },
                )
            ],
        ),
        (
            Note("retrying", JOB, at(0), "attempt 9 after status 4", so_far(-15)),
            [
                (
                    "retrying",
                    {
                        "tick": tick_name(at(0)),
                        "session": "s-2",
                        "attempt": 2,
                        "after_status": -15,
                        "delay_ms": None,
                    },
                )
            ],
        ),
        (
            Note("retrying", JOB, at(0), "attempt 2 after status 1"),  # no record: no guess
            [
                (
                    "retrying",
                    {
                        "tick": tick_name(at(0)),
                        "session": "s-1",
                        "attempt": None,
                        "after_status": None,
                        "delay_ms": None,
                    },
                )
            ],
        ),
        (
            Note("retry-started", JOB, at(0), "attempt 9", so_far(1, 2)),
            [("retry-started", {"tick": tick_name(at(0)), "session": "s-2", "attempt": 3})],
        ),
        (
            Note("too-late", JOB, at(0), "its claim window closed"),
            [
                (
                    "missed",
                    {
                        "tick": tick_name(at(0)),
                        "reason": "too late: its claim window closed",
                        "recorded": False,
                    },
                )
            ],
        ),
        (
            Note("timed-out", JOB, at(0)),
            [("timed-out", {"tick": tick_name(at(0)), "session": "s-1", "after_ms": 2000.0})],
        ),
        (
            Note("trigger", JOB, at(0), "t-1"),
            [("trigger", {"tick": tick_name(at(0)), "trigger": "t-1"})],
        ),
        (
            Note("missed", JOB, at(0), "missed", record=UNRUN_MISSED),
            [("housekeeping", {"missed_recorded": 1, "missed_ticks": [tick_name(at(0))]})],
        ),
        (
            Note("missed", JOB, at(0), "paused", record=UNRUN_PAUSED),
            [("housekeeping", {"missed_recorded": 0, "paused_recorded": 1})],
        ),
        (
            Note("paused", JOB, at(0), "alice", record=_record(TickOutcome.PAUSED, by="alice")),
            [
                (
                    "skipped",
                    {
                        "tick": tick_name(at(0)),
                        "reason": f"tick {tick_name(at(0))}: the job is paused, by alice: not run",
                        "paused_by": "alice",
                    },
                )
            ],
        ),
        (
            Note("renew-failed", "", None, "", session="s-1"),
            [("renew-failed", {"session": "s-1", "error": "no answer"})],
        ),
        (
            Note("session-gone", "", None, "gone", session="s-1"),
            [("session-lost", {"session": "s-1", "reason": "gone"})],
        ),
        (
            Note("session-created", "", None, "", session="s-1", terms=TERMS),
            [("session-created", {"session": "s-1", "ttl": 15.0})],
        ),
        (
            Note("session-created", "", None, "", session="s-2", terms=AGENTLESS),
            [
                (
                    "session-created",
                    {"session": "s-2", "ttl": 15.0, "ttl_only": True, "node": "worker-9"},
                )
            ],
        ),
        (Note("housekeeping", JOB, None, "1 missed recorded"), []),  # each record said alone
    ],
)
def test_a_note_is_said_in_todays_events(note: Note, expected: list[Any]) -> None:
    assert note_events(note, RunContext(CLAIMED, timeout=2.0)) == expected


def test_a_completion_says_the_retries_cut_then_how_the_run_ended() -> None:
    done = _record(
        TickOutcome.FAILED, exit_status=3, duration=1.5, attempts=(1, 3), retries_cut="next-tick"
    )
    cut, released = note_events(Note("completed", JOB, at(0), record=done))
    assert cut == (
        "retries-cut",
        {
            "tick": tick_name(at(0)),
            "session": "s-1",
            "attempt": 2,
            "after_status": 3,
            "reason": "next-tick",
        },
    )
    assert released[0] == "released" and released[1]["attempts"] == [1, 3]
    assert released[1]["held_ms"] == 1500.0 and released[1]["outcome"] == "failed"
    (lost,) = note_events(Note("completed", JOB, at(0), record=_record(TickOutcome.LOST)))
    assert lost[0] == "lost" and lost[1]["released"] is None  # the record does not say


def test_consuls_words_in_an_event_are_printable_and_bounded() -> None:
    (event,) = note_events(Note("unavailable", JOB, at(0), HOSTILE + "x" * 5000))
    error = event[1]["error"]
    assert (
        error.isprintable() and len(error) <= 400 and error.startswith("simulated: no route\\x1b")
    )
    (skipped,) = note_events(Note("skipped", JOB, at(0), "\u202eevil", skip=SkipReason.OTHER))
    assert skipped[1]["reason"] == "other: \\u202eevil"


@pytest.mark.parametrize(
    ("jobs", "status", "text"),
    [
        ([], 503, "no job loop is running"),
        ([("a", JobHealth()), ("b", JobHealth(session=SessionState.VALID))], 200, "ok"),
        (
            [("a", JobHealth(consul_up=False, consul_error="refused")), ("b", JobHealth())],
            503,
            "a: Consul did not answer its last request (refused)",
        ),
        (
            [("a", JobHealth(failing="no such command")), ("b", JobHealth())],
            503,
            "a: its last tick failed (no such command)",
        ),
        (
            [("a", JobHealth(session=SessionState.LOST))],
            503,
            "a: its session was lost (Consul no longer knows it); the next tick makes a new one",
        ),
    ],
)
def test_healthz_names_each_job_that_is_not_well(
    jobs: list[tuple[str, JobHealth]], status: int, text: str
) -> None:
    verdict = health_verdict(jobs)
    assert (verdict.status, verdict.text) == (status, text)


def test_healthz_is_one_printable_bounded_line_naming_only_the_jobs_not_well() -> None:
    report, _ = _report()
    report(Note("due", "ok-job", at(0)))
    report(Note("unavailable", "a", None, "connection refused\n\x1b]0;pwned\x07" + "x" * 900))
    report(Note("session-gone", "", None, "the session is gone"))  # every job's, ok-job's too
    report(Note("claimed", "ok-job", at(0), record=CLAIMED))  # a claim won: valid again
    report(Note("unavailable", "b\x1b", None, "refused"))
    verdict = report.verdict()
    assert verdict.status == 503
    assert verdict.text.startswith("a: Consul did not answer its last request (connection refused")
    assert "b\\x1b: Consul did not answer" in verdict.text
    assert verdict.text.isprintable() and len(verdict.text) <= 400
    assert "ok-job" not in verdict.text


# -- what the cores do not make here, fed directly -------------------------------------------------
def _report() -> tuple[CoreReport, io.StringIO]:
    stream = io.StringIO()
    return CoreReport("w1", stream), stream


def _events(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def _sample(report: CoreReport, name: str, job: str = JOB, **labels: str) -> float | None:
    return report.registry.get_sample_value(name, {"job": job, "worker": "w1", **labels})


def test_the_pools_notes_are_the_replicas_and_count_for_every_job() -> None:
    report, stream = _report()
    for job in ("a", "b"):
        report(Note("due", job, at(0)))
    report(Note("session-created", "", None, "TTL 15s, LockDelay 15s"))
    report(Note("renew-failed", "", None, HOSTILE))
    report(Note("renew-failed", "", None, HOSTILE))
    assert [_sample(report, "lockctl_renew_failures_total", job) for job in "ab"] == [2, 2]
    assert [_sample(report, "lockctl_consul_up", job) for job in "ab"] == [0, 0]
    report(Note("session-gone", "", None, "the session is gone"))
    pool = [e for e in _events(stream) if e["job"] == SCHEDULER_EVENTS]
    assert [e["event"] for e in pool] == [
        "session-created",
        "renew-failed",
        "renew-failed",
        "session-lost",
    ]
    # one JSON line each (a line Consul's words forged would not parse), no raw escape
    assert "\x1b" not in pool[1]["error"] and pool[1]["error"].endswith("\\nforged line")
    health = dict(report.health())
    assert health["a"].session is health["b"].session is SessionState.LOST
    report(Note("session-created", "", None, "TTL 15s, LockDelay 15s"))
    assert report.verdict().text == "ok"  # a new session, Consul answering


def test_a_tick_that_failed_for_lockctls_reason_is_an_error_until_a_tick_goes_through() -> None:
    report, stream = _report()
    report.tick_failed(JOB, "Consul refused the token: 403 \x1b[2J", at(0))
    (failed,) = _events(stream)
    assert failed["event"] == "tick-failed" and failed["tick"] == tick_name(at(0))
    assert failed["error"] == "Consul refused the token: 403 \\x1b[2J"
    assert _sample(report, "lockctl_ticks_total", outcome="error") == 1
    assert _sample(report, "lockctl_job_failing") == 1
    assert report.verdict().text == f"{JOB}: its last tick failed ({failed['error']})"
    report(Note("skipped", JOB, at(10), "taken", skip=SkipReason.TAKEN))
    assert _sample(report, "lockctl_job_failing") == 0 and report.verdict().text == "ok"
    assert _sample(report, "lockctl_ticks_since_success") == 2


def test_consul_unavailable_without_a_tick_is_said_once_per_outage() -> None:
    report, stream = _report()
    for _ in range(3):
        report(Note("unavailable", JOB, None, "no answer"))
    report(Note("unavailable", JOB, at(10), "no answer"))  # a tick not run: said each time
    report(Note("skipped", JOB, at(20), "taken", skip=SkipReason.TAKEN))
    report(Note("unavailable", JOB, None, "no answer"))
    names = [e["event"] for e in _events(stream)]
    assert names == [
        "consul-unavailable",
        "consul-unavailable",
        "consul-recovered",
        "skipped",
        "consul-unavailable",
    ]


def test_schedule_next_tick_and_a_trigger_are_known_to_the_metrics() -> None:
    report, stream = _report()
    report.schedule_known(JOB, "0 2 * * *", "Europe/Berlin")
    report.next_tick(JOB, at(3600).timestamp())
    info = {"schedule": "0 2 * * *", "timezone": "Europe/Berlin"}
    assert _sample(report, "lockctl_job_info", **info) == 1
    assert _sample(report, "lockctl_job_next_tick_timestamp_seconds") == at(3600).timestamp()
    manual = at(5) + timedelta(milliseconds=250)
    report(Note("trigger", JOB, manual, "t-7"))
    (trigger,) = _events(stream)
    assert trigger["trigger"] == "t-7" and trigger["tick"] == tick_name(manual)


def test_a_job_a_reload_removed_leaves_no_series() -> None:
    report, _ = _report()
    report.schedule_known(JOB, "@hourly", "UTC")
    report.next_tick(JOB, 1.0)
    report.schedule_known("kept", "@hourly", "UTC")
    report.forget(JOB)
    samples = [s for m in report.registry.collect() for s in m.samples]
    assert samples and all(s.labels["job"] == "kept" for s in samples)
    assert [name for name, _ in report.health()] == ["kept"]


# The series the dashboards and alert rules read (dashboards/, alerts/): each family's type, and
# each sample's suffix and the labels it has beyond job and worker, as the scheduler exposed them
# before the tick core. A change here is a change to every dashboard and rule.
HISTOGRAM = [("_bucket", ("le",)), ("_count", ()), ("_sum", ())]
SERIES = {
    "lockctl_ticks": ("counter", [("_total", ("outcome",))]),
    "lockctl_skips": ("counter", [("_total", ("reason",))]),
    "lockctl_run_duration_seconds": (
        "histogram",
        [("_bucket", ("le",)), ("_count", ()), ("_sum", ())],
    ),
    "lockctl_start_lag_seconds": (
        "histogram",
        [("_bucket", ("le",)), ("_count", ()), ("_sum", ())],
    ),
    "lockctl_job_running": ("gauge", [("", ())]),
    "lockctl_consul_up": ("gauge", [("", ())]),
    "lockctl_job_failing": ("gauge", [("", ())]),
    "lockctl_ticks_since_success": ("gauge", [("", ())]),
    "lockctl_job_paused": ("gauge", [("", ())]),
    "lockctl_run_failures": ("counter", [("_total", ())]),
    "lockctl_missed_ticks_recorded": ("counter", [("_total", ())]),
    "lockctl_renew_failures": ("counter", [("_total", ())]),
    "lockctl_job_retries": ("counter", [("_total", ())]),
    "lockctl_retries_cut": ("counter", [("_total", ())]),
    "lockctl_job_last_success_timestamp_seconds": ("gauge", [("", ())]),
    "lockctl_job_next_tick_timestamp_seconds": ("gauge", [("", ())]),
    "lockctl_job": ("info", [("_info", ("schedule", "timezone"))]),
    "lockctl_notifications": ("counter", [("_total", ("notify", "result"))]),
}


def test_every_series_of_the_scheduler_is_there_under_the_same_name_type_and_labels() -> None:
    report, _ = _report()
    report.schedule_known(JOB, "@hourly", "UTC")
    report.next_tick(JOB, 9.0)
    report.notify_known(JOB, ["ping"])
    done = _record(TickOutcome.SUCCEEDED, exit_status=0, duration=1.0, finished_at=at(5))
    report(Note("completed", JOB, at(0), record=done))
    shape = {
        family.name: (
            family.type,
            sorted(
                {
                    (
                        s.name.removeprefix(family.name),
                        tuple(sorted(set(s.labels) - {"job", "worker"})),
                    )
                    for s in family.samples
                }
            ),
        )
        for family in report.registry.collect()
    }
    assert shape == SERIES
    assert all(family.documentation for family in report.registry.collect())  # each has its help
    samples = [s for family in report.registry.collect() for s in family.samples]
    assert all({"job", "worker"} <= set(s.labels) for s in samples)
    assert not [s.name for s in samples if s.name.endswith("_created")]


def test_acquired_names_the_started_body_and_a_refused_namespace_is_said_once() -> None:
    """The replica says a claim once its body started (scheduler/on_core.py): `acquired`
    carries the body's PID and containment, as the old engine's did; `containment` is the
    report's own line, with the mode and why."""
    report, stream = _report()
    report.body_started(JOB, {"child_pid": 4242, "containment": "process-group"})
    report(Note("claimed", JOB, at(0), record=CLAIMED))
    report.containment(JOB, at(0), "process-group", "mount /proc: Operation not permitted")
    acquired, told = _events(stream)
    assert acquired["event"] == "acquired" and acquired["lock_index"] == CLAIMED.lock_index
    assert (acquired["child_pid"], acquired["containment"]) == (4242, "process-group")
    assert told["event"] == "containment" and told["mode"] == "process-group"
    assert told["warning"] == "mount /proc: Operation not permitted"
    report.body_started(JOB, {})  # a body that could not start: nothing of the last one
    report(Note("claimed", JOB, at(10), record=replace(CLAIMED, tick=at(10))))
    assert "containment" not in _events(stream)[-1]
