"""What `lockctl schedule` says of the tick core's work, from the core's notes: the JSON events
operators and the integration tests parse, the metrics of /metrics, and what /healthz answers.

    Note (provision/tick/edge.py) -> note_events (pure: today's event names and fields)
                                  -> tick_outcome, skip_reason, consul_answered (pure, tables)
                                  -> the prometheus_client instruments, the jobs' health

One fact, one place: each note is counted where the core decided it, from its kind, skip
reason and record; nothing is read back from text (a note's `detail` is only quoted). Kinds
that need a word: `too-late` (a claim too late) counts `missed`, no skip, as the old scheduler's
run too late for its tick did; `missed` is a record of a tick nobody ran that this replica
wrote, its record `missed` or `paused` (a pause held the tick); `paused` is a claim that found
the job paused; `retrying` and `retry-started` carry the claimed record with the exit status of
each attempt ended so far; `unavailable` without a tick is Consul not answering, no tick lost.

The facts the core does not own come by methods: a job's schedule, its next tick, the pauses
the trigger watch sees, a tick that failed for a reason of lockctl's own (`tick_failed`).

The instruments live in a registry of this report's own (never prometheus_client's global
one), under the names, types, labels and help of the scheduler's /metrics before the core
(dashboards/lockctl.json and alerts/ use them); the `_created` series prometheus_client adds
to counters and histograms are left out, as before.

The session pool's notes (job "") are the replica's: their events go to the scheduler's own
log. A pool note names no session, nor the jobs holding locks under it, so a renewal Consul
did not answer counts as a renew failure of EVERY job (each job loop counted its session's
before; most fleets have one session, one (TTL, LockDelay)), and a session gone makes every
job's session `lost` on /healthz until a session is made again or the job's next claim wins.
"""

from __future__ import annotations

import contextlib
import enum
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric

from provision.keyed import split_unit
from provision.ledger.records import TickRecord, taken_fields, tick_name
from provision.notify.sender import RESULTS as NOTIFY_RESULTS
from provision.notify.sender import Delivery, result_event
from provision.outcomes import SCHEDULER_METRIC_OUTCOMES, Outcome
from provision.runner.events import EventLog, ms
from provision.runner.metrics import LABELS, TICKS
from provision.runner.tick_verdicts import paused_refusal
from provision.system.text import printable
from provision.tick.edge import Note, SkipReason

# Skips by reason: a small fixed set decided where the skip is, never the reason's text.
SKIP_REASONS = tuple(SkipReason)
# The tick outcomes /metrics counts: a record's, plus the scheduler's own (its error, and
# Consul not answering a tick's claim).
OUTCOMES = SCHEDULER_METRIC_OUTCOMES
# Cron jobs run from under a second to hours; a tick starts within ms, or seconds when late.
DURATION_BUCKETS = (0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0)
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

SCHEDULER_EVENTS = "lockctl-schedule"  # the `job` field of the scheduler's own events
HEALTH_TEXT_LIMIT = 160  # characters of a Consul error or a failure kept for /healthz
HEALTH_LIMIT = 400  # characters of the /healthz line
EVENT_TEXT_LIMIT = 400  # characters of Consul's (or anyone's) words in an event

LAST_SUCCESS = "lockctl_job_last_success_timestamp_seconds"  # as runner/metrics.py's
# What kube-state-metrics has for a CronJob (kube_cronjob_next_schedule_time, _spec_suspend,
# _info) under lockctl's names: the next tick, paused, the schedule and its timezone.
NEXT_TICK = "lockctl_job_next_tick_timestamp_seconds"
INFO = "lockctl_job"  # an info metric: exposed as lockctl_job_info
SKIPS = "lockctl_skips"
DURATIONS = "lockctl_run_duration_seconds"
LAGS = "lockctl_start_lag_seconds"
RUNNING = "lockctl_job_running"
CONSUL_UP = "lockctl_consul_up"
FAILING = "lockctl_job_failing"
SINCE_SUCCESS = "lockctl_ticks_since_success"
PAUSED = "lockctl_job_paused"
RUN_FAILURES = "lockctl_run_failures"
MISSED_RECORDED = "lockctl_missed_ticks_recorded"
RENEW_FAILURES = "lockctl_renew_failures"
RETRIES = "lockctl_job_retries"
RETRIES_CUT = "lockctl_retries_cut"
NOTIFICATIONS = "lockctl_notifications"  # labels job, worker, notify, result (notify/sender.py)
GAUGES = (RUNNING, CONSUL_UP, FAILING, SINCE_SUCCESS, PAUSED)
COUNTERS = (RUN_FAILURES, MISSED_RECORDED, RENEW_FAILURES, RETRIES, RETRIES_CUT)
HELP = {
    LAST_SUCCESS: "When the job last ended with exit status 0 under the lock here (Unix time).",
    TICKS: "Ticks of the job this scheduler handled, by outcome.",
    SKIPS: (
        "Ticks this scheduler skipped, by reason (taken, overlap, lock-delay, paused, other, "
        "at-capacity)."
    ),
    DURATIONS: "How long the job ran under the lock, per run here.",
    LAGS: "From the tick's instant to its claim, when the job then started under the lock "
    "(the tick record's start_lag).",
    RUNNING: "1 while the job runs here under the lock (the sum over replicas is at most 1).",
    MISSED_RECORDED: "Ticks of the job nobody ran that this scheduler recorded missed in the "
    "ledger (each such tick is recorded by one replica).",
    RUN_FAILURES: "Runs of the job here that ended with a non-zero exit status under the lock.",
    RETRIES: "Attempts of the job here after a failed one, under the same lock and tick (retries).",
    RETRIES_CUT: "Runs of the job here whose retries left were not made: the next attempt "
    "would have started at or after the next tick (or a stop came).",
    RENEW_FAILURES: "Renewals of the job's session that Consul did not answer.",
    CONSUL_UP: "1 when Consul answered the job loop's last request, else 0.",
    SINCE_SUCCESS: "Ticks of the job this scheduler handled since its last success here, or "
    "since it started (the min over the replicas: since a success anywhere).",
    FAILING: "1 while the job's last tick failed for a reason of lockctl's own (its command "
    "cannot start, a refused token, a bug), until a tick goes through.",
    NEXT_TICK: "When the job's next tick is, as this scheduler plans it (Unix time).",
    PAUSED: "1 while the job is paused (lockctl pause), as this scheduler last saw its control "
    "keys, else 0.",
    INFO: "The job's schedule and its timezone, as this scheduler runs them (value 1).",
    NOTIFICATIONS: "Notifications of the job's outcomes this scheduler made, by notify block "
    "(ping: the ping URL) and result (sent, failed after its tries, dropped from a full queue).",
}

FAIL_CLOSED = "the tick is not run (fail closed); it shows up as missed once Consul answers again"
UNANSWERED = (
    "the claim got no answer: Consul may have applied it; the tick is read again until "
    "Consul answers (a claim applied is completed interrupted, its job never started)"
)
NO_COMPLETION = "Consul did not answer the completion of the tick's record: sent again later"
FENCED = "the lock could not be vouched for (lost, or not confirmed in time)"
TOO_LATE = "too late"  # a missed event's reason: the word first, then the core's words

Event = tuple[str, dict[str, Any]]


class SessionState(str, enum.Enum):
    NOT_YET = "not-yet"  # no tick has needed one yet
    VALID = "valid"
    LOST = "lost"  # Consul no longer knows it; the next claim makes a new one


@dataclass(frozen=True)
class JobHealth:
    """What /healthz says of one job: whether Consul answered its last request (and if not,
    why: printable, bounded), why its last tick failed, and its session's state."""

    consul_up: bool = True
    consul_error: str | None = None
    failing: str | None = None
    session: SessionState = SessionState.NOT_YET


@dataclass(frozen=True)
class Verdict:
    status: int  # 200 or 503
    text: str  # one line


@dataclass(frozen=True)
class RunContext:
    """What the events of a held run's notes add beyond the note: the run's claimed record
    (its session and fencing token) and the job's timeout."""

    claimed: TickRecord | None = None
    timeout: float | None = None
    started: Mapping[str, Any] = field(default_factory=dict)  # the body's PID, containment


# -- the pure mappings -----------------------------------------------------------------------
_RECORD_OUTCOMES = {
    Outcome.SUCCEEDED: Outcome.RAN.value,
    Outcome.FAILED: Outcome.RAN.value,
    Outcome.LOST: Outcome.LOST.value,
    Outcome.INTERRUPTED: Outcome.INTERRUPTED.value,
    Outcome.TIMED_OUT: Outcome.TIMED_OUT.value,
    Outcome.ABORTED: Outcome.ABORTED.value,  # an operator's stop: no run failure counted
    Outcome.CANCELLED: Outcome.CANCELLED.value,  # the job's overlap policy's stop: nor here
    Outcome.MISSED: Outcome.MISSED.value,
    Outcome.PAUSED: Outcome.SKIPPED.value,
    Outcome.BLACKOUT: Outcome.BLACKOUT.value,
}


def record_outcome_label(outcome: Outcome) -> str:
    """The lockctl_ticks_total outcome of a completed record (succeeded and failed both ran:
    a failure is lockctl_run_failures_total); one that is not a finished run's is an error."""
    return _RECORD_OUTCOMES.get(outcome, Outcome.ERROR.value)


def tick_outcome(note: Note) -> str | None:
    """The lockctl_ticks_total outcome a note counts, or None: each turn of this replica at a
    tick is counted once, by the note that ends it (a skip, a claim too late, Consul not
    answering, the claim finding the job paused, the run's completion). A record of a tick
    nobody ran (`missed`) is no turn's, and a trigger Consul did not answer (`unavailable`
    without a tick) lost no tick: it is tried again."""
    kind = note.kind
    if kind in ("skipped", "paused"):
        return "skipped"
    if kind == "blackout":  # its own word: a window held the tick, on every replica's turn
        return Outcome.BLACKOUT.value
    if kind == "buffered":  # overlap = "buffer_one" kept it: its run, later, counts again
        return Outcome.BUFFERED.value
    if kind == "too-late":
        return "missed"
    if kind == "unanswered" or (kind == "unavailable" and note.tick is not None):
        return "consul-unavailable"
    if kind == "completed" and note.record is not None:
        return record_outcome_label(note.record.outcome)
    return None


def skip_reason(note: Note) -> SkipReason | None:
    """Why a note's tick was skipped, in a word (the core decided it: never its words); a
    claim too late is a miss, no skip."""
    if note.kind == "paused":
        return SkipReason.PAUSED
    if note.kind == "skipped":
        return note.skip or SkipReason.OTHER
    return None


# what went unanswered, for /healthz, when the note has no error of Consul's to quote
_SILENCE = {"complete-retry": "no answer to the completion of a tick's record"}
# too-late: judged on a read's answer (or, just before a claim, on the same read and a session
# the pool holds), as the old scheduler's missed result counted as answered
_ANSWERED = frozenset(
    {
        "claimed",
        "completed",
        "paused",
        "blackout",
        "too-late",
        "missed",
        "orphan",
        "session-created",
        "session-gone",
    }
)
_UNANSWERED = frozenset({"unavailable", "unanswered", "complete-retry", "renew-failed"})
# skips decided here without a request: the job busy here, the replica at its cap
_UNASKED = frozenset({SkipReason.OVERLAP, SkipReason.AT_CAPACITY})


def consul_answered(note: Note) -> bool | None:
    """Whether the note says Consul answered (True), did not (False), or says nothing (None).
    A skip for overlap or at capacity may have made no request (the job was busy here, the
    replica at its cap); a session gone was Consul's answer (it no longer knows it)."""
    kind = note.kind
    if kind in _ANSWERED:
        return True
    if kind in _UNANSWERED:
        return False
    if kind == "skipped":
        return None if skip_reason(note) in _UNASKED else True
    return None


def ran_under_lock(record: TickRecord) -> bool:
    """Whether the job's body ran (its exit status is known): its duration is a run's."""
    return record.exit_status is not None


def note_events(note: Note, run: RunContext = RunContext()) -> list[Event]:
    """The events today's scheduler wrote for the fact a note tells, in order."""
    make = _EVENT_MAKERS.get(note.kind)
    return [] if make is None else make(note, run)


def _tick(note: Note) -> str | None:
    return None if note.tick is None else tick_name(note.tick)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else ms(seconds)


def _text(words: str) -> str | None:
    """Consul's (or anyone's) words for an event: printable, bounded; None when empty."""
    return printable(words, EVENT_TEXT_LIMIT) if words else None


def _session(note: Note, run: RunContext) -> str | None:
    record = note.record or run.claimed
    return None if record is None else record.session


def skip_words(skip: SkipReason, detail: str) -> str:
    """A skipped event's `reason`: the word first (`overlap: busy: tick ... runs here`), then
    the core's words, which may quote Consul's (printable, bounded)."""
    return _worded(skip.value, detail)


PACKAGE = str(Path(__file__).resolve().parents[1])  # provision/, for where an error was raised


def unexpected(exc: BaseException) -> str:
    """An error nobody foresaw, in one line: its type, its text and where it was raised (the
    innermost frame of lockctl's), for the report a bug needs without a traceback."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(PACKAGE)]
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    return f"unexpected {type(exc).__name__}{where}: {exc}"


def _worded(word: str, detail: str) -> str:
    if not detail or detail == word:
        return word
    return printable(f"{word}: {detail}", EVENT_TEXT_LIMIT)


def _skipped(note: Note, run: RunContext) -> list[Event]:
    skip = skip_reason(note) or SkipReason.OTHER
    fields: dict[str, Any] = {"tick": _tick(note), "reason": skip_words(skip, note.detail)}
    if note.record is not None and skip is SkipReason.TAKEN:
        fields.update(taken_fields(note.record))  # who has it, how it went
    return [("skipped", fields)]


def _paused(note: Note, run: RunContext) -> list[Event]:
    if note.record is None:
        words = f"the job is paused, by {note.detail or 'unknown'}: not run"
        return [("skipped", {"tick": _tick(note), "reason": _text(words)})]
    return [("skipped", paused_refusal(note.record).event_fields())]


def _blackout(note: Note, run: RunContext) -> list[Event]:
    words = f"in blackout window {note.detail or 'unknown'}: not run"
    return [("skipped", {"tick": _tick(note), "reason": _text(words)})]


def _too_late(note: Note, run: RunContext) -> list[Event]:
    """The old scheduler's event for a tick it came too late for. `recorded` is False: the
    tick's record, if nobody ran it, is written by its fate look later (a `housekeeping`)."""
    reason = _worded(TOO_LATE, note.detail)
    return [("missed", {"tick": _tick(note), "reason": reason, "recorded": False})]


def _unavailable(note: Note, run: RunContext) -> list[Event]:
    why = None if note.tick is None else FAIL_CLOSED
    fields = {"tick": _tick(note), "error": _text(note.detail) or "no answer", "detail": why}
    return [("consul-unavailable", fields)]


def _unanswered(note: Note, run: RunContext) -> list[Event]:
    fields = {"tick": _tick(note), "error": _text(note.detail) or "no answer", "detail": UNANSWERED}
    return [("consul-unavailable", fields)]


def _claimed(note: Note, run: RunContext) -> list[Event]:
    record = note.record
    if record is None:
        return [("acquired", {"tick": _tick(note)})]
    lag = None if record.start_lag is None else ms(record.start_lag)
    events: list[Event] = []
    if record.catchup:
        events.append(("catch-up", {"tick": _tick(note), "lag_ms": lag}))
    acquired = {
        "tick": _tick(note),
        "session": record.session,
        "lock_index": record.lock_index,
        "start_lag_ms": lag,
        "trigger": record.trigger,
        "catchup": record.catchup,
        **({} if record.backfill is None else {"backfill": record.backfill}),
        **run.started,
    }
    return [*events, ("acquired", acquired)]


def _completed(note: Note, run: RunContext) -> list[Event]:
    record = note.record
    if record is None:
        return [("released", {"tick": _tick(note), "outcome": _text(note.detail)})]
    events: list[Event] = []
    attempts = list(record.attempts) if record.attempts else None
    if record.retries_cut:
        cut = {
            "tick": _tick(note),
            "session": record.session,
            "attempt": len(attempts or [None]),
            "after_status": record.exit_status,
            "reason": record.retries_cut,
        }
        events.append(("retries-cut", cut))
    lost = record.outcome is Outcome.LOST
    ended = {
        "tick": _tick(note),
        "session": record.session,
        "lock_index": record.lock_index,
        "held_ms": None if record.duration is None else ms(record.duration),
        "child_status": record.exit_status,
        "released": None if lost else True,  # lost: the record does not say whether
        "outcome": record.outcome.value,
        "attempts": attempts,
    }
    return [*events, ("lost" if lost else "released", ended)]


def held_by_a_pause(note: Note) -> bool:
    """Whether a `missed` note's record of a tick nobody ran says a pause or a blackout window
    held the tick (recorded paused or blackout, not a miss)."""
    return note.record is not None and note.record.outcome in _NOT_MISSES


_NOT_MISSES = frozenset({Outcome.PAUSED, Outcome.BLACKOUT})


def _unrun(note: Note, run: RunContext) -> list[Event]:
    """A record of a tick nobody ran, written here: `housekeeping`'s fields, one tick each."""
    if note.record is not None and note.record.outcome is Outcome.BLACKOUT:
        return [("housekeeping", {"missed_recorded": 0, "blackout_recorded": 1})]
    if held_by_a_pause(note):
        return [("housekeeping", {"missed_recorded": 0, "paused_recorded": 1})]
    ticks = None if note.tick is None else [tick_name(note.tick)]
    return [("housekeeping", {"missed_recorded": 1, "missed_ticks": ticks})]


def _held(event: str) -> Callable[[Note, RunContext], list[Event]]:
    """The events of a held run's verdicts: fenced, interrupted, timed-out."""

    def make(note: Note, run: RunContext) -> list[Event]:
        fields: dict[str, Any] = {"tick": _tick(note), "session": _session(note, run)}
        if event == "fenced":
            fields["reason"] = _text(note.detail) or FENCED
            fields["since_confirmed_ms"] = _ms(note.seconds)
        if event == "timed-out" and run.timeout is not None:
            fields["after_ms"] = ms(run.timeout)
        return [(event, fields)]

    return make


def _aborted(note: Note, run: RunContext) -> list[Event]:
    """`lockctl abort` stops this run: who asked, when, why (the note's words, printable)."""
    fields = {"tick": _tick(note), "session": _session(note, run), "asked": _text(note.detail)}
    return [("aborted", fields)]


def _cancelled(note: Note, run: RunContext) -> list[Event]:
    """overlap = "cancel": the job's next tick stops this run (the note says which tick)."""
    fields = {"tick": _tick(note), "session": _session(note, run), "reason": _text(note.detail)}
    return [("cancelled", fields)]


def _buffered(note: Note, run: RunContext) -> list[Event]:
    """overlap = "buffer_one": the tick came while the job ran here, recorded `buffered`."""
    return [("buffered", {"tick": _tick(note), "reason": _text(note.detail)})]


def _abort_heard(note: Note, run: RunContext) -> list[Event]:
    """An abort note heard that names no run of this replica: said, nothing stopped."""
    return [("abort-ignored", {"tick": _tick(note), "reason": _text(note.detail)})]


def next_attempt(note: Note) -> tuple[int | None, int | None]:
    """A retry note's attempt to come and the exit status of the one before it, from its
    record (the claimed one, with each ended attempt's status); (None, None) without one."""
    if note.record is None:
        return None, None
    ended = note.record.attempts or ()
    return len(ended) + 1, (ended[-1] if ended else None)


def _retrying(note: Note, run: RunContext) -> list[Event]:
    attempt, after = next_attempt(note)
    fields = {"tick": _tick(note), "session": _session(note, run), "attempt": attempt}
    return [("retrying", {**fields, "after_status": after, "delay_ms": _ms(note.seconds)})]


def _retry_started(note: Note, run: RunContext) -> list[Event]:
    attempt, _ = next_attempt(note)
    return [
        ("retry-started", {"tick": _tick(note), "session": _session(note, run), "attempt": attempt})
    ]


def _due(note: Note, run: RunContext) -> list[Event]:
    return [("tick-due", {"tick": _tick(note)})]


def _orphan(note: Note, run: RunContext) -> list[Event]:
    fields = {"tick": _tick(note), "outcome": Outcome.INTERRUPTED.value, "detail": UNANSWERED}
    return [("orphan", fields)]


def _complete_retry(note: Note, run: RunContext) -> list[Event]:
    fields = {"tick": _tick(note), "session": _session(note, run), "detail": NO_COMPLETION}
    return [("complete-retry", fields)]


def _complete_abandoned(note: Note, run: RunContext) -> list[Event]:
    detail = "stopping, and Consul did not answer: the record stays running until its session ends"
    return [("complete-abandoned", {"tick": _tick(note), "detail": detail})]


def _trigger(note: Note, run: RunContext) -> list[Event]:
    return [("trigger", {"tick": _tick(note), "trigger": _text(note.detail)})]


def _backfill(note: Note, run: RunContext) -> list[Event]:
    """A backfill heard (its first tick, how many, its id) or a tick of it about to be
    claimed (how late, its id)."""
    return [("backfill", {"tick": _tick(note), "detail": _text(note.detail)})]


def _session_created(note: Note, run: RunContext) -> list[Event]:
    """As the old pool said it: the session, its TTL, and an agentless worker's node (its
    sessions are TTL-only: no serfHealth check)."""
    fields: dict[str, Any] = {"session": note.session}
    terms = note.terms
    if terms is not None:
        fields["ttl"] = terms.ttl
        if terms.node is not None:
            fields.update(ttl_only=True, node=terms.node.name)
    return [("session-created", fields)]


def _session_gone(note: Note, run: RunContext) -> list[Event]:
    return [("session-lost", {"session": note.session, "reason": _text(note.detail)})]


def _renew_failed(note: Note, run: RunContext) -> list[Event]:
    fields = {"session": note.session, "error": _text(note.detail) or "no answer"}
    return [("renew-failed", fields)]


_EVENT_MAKERS: dict[str, Callable[[Note, RunContext], list[Event]]] = {
    "due": _due,
    "skipped": _skipped,
    "paused": _paused,
    "blackout": _blackout,
    "unavailable": _unavailable,
    "unanswered": _unanswered,
    "claimed": _claimed,
    "too-late": _too_late,
    "missed": _unrun,
    "orphan": _orphan,
    "fenced": _held("fenced"),
    "interrupted": _held("interrupted"),
    "timed-out": _held("timed-out"),
    "aborted": _aborted,
    "abort": _abort_heard,
    "cancelled": _cancelled,
    "buffered": _buffered,
    "retrying": _retrying,
    "retry-started": _retry_started,
    "complete-retry": _complete_retry,
    "complete-abandoned": _complete_abandoned,
    "completed": _completed,
    "trigger": _trigger,
    "backfill": _backfill,
    "session-created": _session_created,
    "session-gone": _session_gone,
    "renew-failed": _renew_failed,
}


def unhealthy(health: JobHealth) -> str | None:
    """Why /healthz calls a job unhealthy, or None."""
    if not health.consul_up:
        return f"Consul did not answer its last request ({health.consul_error or 'no answer'})"
    if health.failing is not None:
        return f"its last tick failed ({health.failing})"
    if health.session is SessionState.LOST:
        return "its session was lost (Consul no longer knows it); the next tick makes a new one"
    return None


def health_verdict(jobs: Sequence[tuple[str, JobHealth]]) -> Verdict:
    """200 `ok` when Consul answered every job's last request and each has a valid session
    (or has not needed one yet); else 503 naming each job that is not, and why."""
    if not jobs:
        return Verdict(503, "no job loop is running")
    problems = [
        f"{printable(job, 64)}: {why}" for job, health in jobs if (why := unhealthy(health))
    ]
    if not problems:
        return Verdict(200, "ok")
    return Verdict(503, printable("; ".join(problems), HEALTH_LIMIT))


# -- the instruments ---------------------------------------------------------------------------
class _WithoutCreated:
    """A registry's metrics without the `_created` series prometheus_client adds to counters
    and histograms (the process-wide switch would change an embedding app's own metrics)."""

    def __init__(self, inner: CollectorRegistry) -> None:
        self.inner = inner

    def collect(self) -> Iterator[Metric]:
        for metric in self.inner.collect():  # made afresh at each collect: ours to change
            created = metric.name + "_created"
            metric.samples = [s for s in metric.samples if s.name != created]
            yield metric


class Instruments:
    """The scheduler's metrics: prometheus_client instruments in a registry of their own, one
    child per job (labels job and worker), every outcome and skip reason at 0 from the job's
    first sight."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        own = CollectorRegistry(auto_describe=True)
        self.registry = CollectorRegistry(auto_describe=False)  # what /metrics exposes
        self.registry.register(_WithoutCreated(own))
        self.ticks = Counter(TICKS, HELP[TICKS], (*LABELS, "outcome"), registry=own)
        self.skips = Counter(SKIPS, HELP[SKIPS], (*LABELS, "reason"), registry=own)
        self.durations = Histogram(
            DURATIONS, HELP[DURATIONS], LABELS, buckets=DURATION_BUCKETS, registry=own
        )
        self.lags = Histogram(LAGS, HELP[LAGS], LABELS, buckets=LAG_BUCKETS, registry=own)
        self.gauges = {name: Gauge(name, HELP[name], LABELS, registry=own) for name in GAUGES}
        self.counters = {name: Counter(name, HELP[name], LABELS, registry=own) for name in COUNTERS}
        self.last_success = Gauge(LAST_SUCCESS, HELP[LAST_SUCCESS], LABELS, registry=own)
        self.next_tick = Gauge(NEXT_TICK, HELP[NEXT_TICK], LABELS, registry=own)
        self.info = Info(INFO, HELP[INFO], LABELS, registry=own)
        self.notifications = Counter(
            NOTIFICATIONS, HELP[NOTIFICATIONS], (*LABELS, "notify", "result"), registry=own
        )
        self._notify: dict[str, set[str]] = {}  # each job's notify series made

    def add_job(self, job: str) -> None:
        """A job's series, at their start values (Consul up until a request goes unanswered)."""
        for outcome in OUTCOMES:
            self.ticks.labels(job, self.worker, outcome)
        for reason in SKIP_REASONS:
            self.skips.labels(job, self.worker, reason.value)
        self.durations.labels(job, self.worker)
        self.lags.labels(job, self.worker)
        for name in GAUGES:
            self.gauge(name, job).set(1.0 if name == CONSUL_UP else 0.0)
        for name in COUNTERS:
            self.counters[name].labels(job, self.worker)

    def remove_job(self, job: str) -> None:
        """Every series of a job this scheduler no longer runs (a reload removed it)."""
        plain: list[MetricWrapperBase] = [*self.gauges.values(), *self.counters.values()]
        plain += [self.durations, self.lags, self.last_success, self.next_tick, self.info]
        labelled: list[tuple[MetricWrapperBase, tuple[str, ...]]] = [
            *((self.ticks, (job, self.worker, outcome)) for outcome in OUTCOMES),
            *((self.skips, (job, self.worker, reason.value)) for reason in SKIP_REASONS),
            *((metric, (job, self.worker)) for metric in plain),
        ]
        for metric, values in labelled:
            with contextlib.suppress(KeyError):  # a series never made
                metric.remove(*values)
        for notify in self._notify.pop(job, set()):
            for result in NOTIFY_RESULTS:
                self.notifications.remove(job, self.worker, notify, result)

    def add_notify(self, job: str, notify: str) -> None:
        """A notify block's (or the ping's) series, every result at 0."""
        self._notify.setdefault(job, set()).add(notify)
        for result in NOTIFY_RESULTS:
            self.notifications.labels(job, self.worker, notify, result)

    def gauge(self, name: str, job: str) -> Gauge:
        return self.gauges[name].labels(job, self.worker)

    def count(self, name: str, job: str, n: float = 1.0) -> None:
        self.counters[name].labels(job, self.worker).inc(n)


# -- the report --------------------------------------------------------------------------------
@dataclass
class _Job:
    """One job as the report knows it: its events, its health, the run it holds now."""

    events: EventLog
    health: JobHealth = JobHealth()
    said_down: bool = False  # a consul-unavailable was written: consul-recovered comes next
    claimed: TickRecord | None = None
    timeout: float | None = None
    started: Mapping[str, Any] = field(default_factory=dict)


class CoreReport:
    """A tick core's Listener (`report(note)`) that writes the events and moves the metrics
    and the health of one scheduler (worker); safe to call from several threads (the core's,
    the trigger watch's) and to read from another (a scrape, /healthz)."""

    def __init__(
        self, worker: str, stream: TextIO | None = None, process: str = SCHEDULER_EVENTS
    ) -> None:
        """`process`: the `job` field of the process's own events (sessions, start, stop)."""
        self.worker, self.stream = worker, stream
        self.metrics = Instruments(worker)
        self.events = EventLog(process, worker, stream)  # the replica's own
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.RLock()

    @property
    def registry(self) -> CollectorRegistry:
        return self.metrics.registry

    def __call__(self, note: Note) -> None:
        if note.kind == "refused" and note.job:  # lockctl's own: a token refused, a body that
            self.tick_failed(note.job, note.detail, note.tick)  # cannot start; no outage
            return
        with self._lock:
            if not note.job:
                self._pool_note(note)
                return
            job = self._job(note.job)
            answered = consul_answered(note)
            if answered is True:
                self._answered(note.job, job)
            context = RunContext(job.claimed, job.timeout, job.started)
            for event, fields in note_events(note, context):
                if event == "consul-unavailable" and note.tick is None and job.said_down:
                    continue  # said once per outage; a tick not run is said each time
                job.said_down = job.said_down or event == "consul-unavailable"
                job.events.emit(event, **fields)
            if answered is False:
                self._unanswered(note.job, job, note.detail or _SILENCE.get(note.kind, ""))
            self._count(note, job)

    # -- what the core does not own ---------------------------------------------------------
    def schedule_known(
        self, job: str, schedule: str, timezone: str, *, timeout: float | None = None
    ) -> None:
        """The job's schedule as its config says (a reload may change it), and its timeout
        (the `timed-out` event's after_ms)."""
        with self._lock:
            self._job(job).timeout = timeout
            self.metrics.info.labels(job, self.worker).info(
                {"schedule": schedule, "timezone": timezone}
            )

    def paused(self, jobs: Iterable[str]) -> None:
        """From the trigger watch: which jobs are paused now (lockctl_job_paused)."""
        paused = set(jobs)
        with self._lock:
            for name in self._jobs:
                self.metrics.gauge(PAUSED, name).set(1.0 if name in paused else 0.0)

    def next_tick(self, job: str, unix_time: float) -> None:
        with self._lock:
            self._job(job)
            self.metrics.next_tick.labels(job, self.worker).set(unix_time)

    def body_started(self, job: str, started: Mapping[str, Any]) -> None:
        """What the body of the job's run just started says of itself (its PID, how it is
        contained): the `acquired` event of that run's claim names it."""
        with self._lock:
            self._job(job).started = dict(started)

    def containment(self, job: str, tick: datetime | None, mode: str, warning: str) -> None:
        """The machine refused the job's PID namespace: said once per process (by its first
        run), the runs in a weaker mode (`mode`), and why."""
        with self._lock:
            self._job(job).events.emit(
                "containment",
                tick=None if tick is None else tick_name(tick),
                mode=mode,
                warning=warning,
            )

    def tick_failed(self, job: str, why: str, tick: datetime | None = None) -> None:
        """A tick failed for a reason of lockctl's own (its body cannot start, a refused
        token, a bug): said, counted as an error, and on /healthz until a tick goes through."""
        with self._lock:
            state = self._job(job)
            name = None if tick is None else tick_name(tick)
            state.events.emit("tick-failed", tick=name, error=printable(why, EVENT_TEXT_LIMIT))
            self._counted(job, "error")
            self._set_health(job, state, failing=printable(why, HEALTH_TEXT_LIMIT))

    def notify_known(self, job: str, names: Iterable[str]) -> None:
        """The job's notify blocks (and "ping"), so their counts are there at 0."""
        with self._lock:
            self._job(job)
            for name in names:
                self.metrics.add_notify(job, name)

    def notified(self, delivery: Delivery, result: str, error: str | None) -> None:
        """A notification's end (notify/sender.py), from the sender's thread: counted, and
        said (`notified`, or `notify-failed` with the error in lockctl's words: never the
        URL). A success that was no recovery (`skipped`) is neither."""
        said = result_event(delivery, result, error)
        if said is None:
            return
        with self._lock:
            state = self._job(delivery.job)
            self.metrics.add_notify(delivery.job, delivery.notify)
            self.metrics.notifications.labels(
                delivery.job, self.worker, delivery.notify, result
            ).inc()
            state.events.emit(said[0], **said[1])

    def forget(self, job: str) -> None:
        """A reload removed the job: its series and its health go."""
        with self._lock:
            if self._jobs.pop(job, None) is not None:
                self.metrics.remove_job(job)

    def health(self) -> list[tuple[str, JobHealth]]:
        """Each job's health, by name, as it is now."""
        with self._lock:
            return sorted((name, job.health) for name, job in self._jobs.items())

    def verdict(self) -> Verdict:
        return health_verdict(self.health())

    # -- counting ---------------------------------------------------------------------------
    def _job(self, name: str) -> _Job:
        job = self._jobs.get(name)
        if job is None:
            job_name, key = split_unit(name)  # a keyed job's key: its events say both
            events = EventLog(job_name, self.worker, self.stream, key=key)
            job = self._jobs[name] = _Job(events)
            self.metrics.add_job(name)
        return job

    def _count(self, note: Note, job: _Job) -> None:
        outcome, skip, record = tick_outcome(note), skip_reason(note), note.record
        if skip is not None:
            self.metrics.skips.labels(note.job, self.worker, skip.value).inc()
        if outcome is not None:
            self._counted(note.job, outcome)
            if outcome != "consul-unavailable":  # a tick went through: not failing
                self._set_health(note.job, job, failing=None)
        if note.kind in ("claimed", "paused"):  # a claim won: under a session Consul knows
            self._set_health(note.job, job, session=SessionState.VALID)
        if note.kind == "claimed":
            job.claimed = record
            self._claimed(note.job, record)
        elif note.kind == "completed" and record is not None:
            job.claimed = None
            self._completed(note.job, record)
        elif note.kind == "retry-started":
            self.metrics.count(RETRIES, note.job)
        elif note.kind == "missed" and not held_by_a_pause(note):
            self.metrics.count(MISSED_RECORDED, note.job)

    def _counted(self, job: str, outcome: str) -> None:
        self.metrics.ticks.labels(job, self.worker, outcome).inc()
        self.metrics.gauge(SINCE_SUCCESS, job).inc()

    def _claimed(self, job: str, record: TickRecord | None) -> None:
        self.metrics.gauge(RUNNING, job).set(1.0)
        if record is not None and record.start_lag is not None:
            self.metrics.lags.labels(job, self.worker).observe(record.start_lag)

    def _completed(self, job: str, record: TickRecord) -> None:
        self.metrics.gauge(RUNNING, job).set(0.0)
        if ran_under_lock(record) and record.duration is not None:
            self.metrics.durations.labels(job, self.worker).observe(record.duration)
        if record.retries_cut:
            self.metrics.count(RETRIES_CUT, job)
        if record.outcome is Outcome.SUCCEEDED:
            ended = record.finished_at.timestamp() if record.finished_at else time.time()
            self.metrics.last_success.labels(job, self.worker).set(ended)
            self.metrics.gauge(SINCE_SUCCESS, job).set(0.0)
        elif record.outcome is Outcome.FAILED:
            self.metrics.count(RUN_FAILURES, job)

    # -- Consul's answers, sessions ---------------------------------------------------------
    def _answered(self, name: str, job: _Job) -> None:
        if job.said_down:
            job.said_down = False
            job.events.emit("consul-recovered")
        if not job.health.consul_up:
            self._set_health(name, job, consul_up=True, consul_error=None)

    def _unanswered(self, name: str, job: _Job, error: str) -> None:
        why = printable(error, HEALTH_TEXT_LIMIT)
        self._set_health(name, job, consul_up=False, consul_error=why)

    def _pool_note(self, note: Note) -> None:
        """The session pool's news, the replica's: its event, and every job's state."""
        for event, fields in note_events(note):
            self.events.emit(event, **fields)
        for name, job in self._jobs.items():
            if note.kind == "session-created":
                self._answered(name, job)
                self._set_health(name, job, session=SessionState.VALID)
            elif note.kind == "session-gone":
                self._set_health(name, job, session=SessionState.LOST)
            elif note.kind == "renew-failed":
                self.metrics.count(RENEW_FAILURES, name)
                self._unanswered(name, job, note.detail or "no answer")

    def _set_health(self, name: str, job: _Job, **changes: Any) -> None:
        """A job's health changed: replaced whole (a reader takes it as it is), gauges too.
        Nothing changed (most notes: every tick that goes through says so again): nothing
        made, not even a copy to compare."""
        if all(getattr(job.health, key) == value for key, value in changes.items()):
            return
        health = replace(job.health, **changes)
        job.health = health
        self.metrics.gauge(CONSUL_UP, name).set(1.0 if health.consul_up else 0.0)
        self.metrics.gauge(FAILING, name).set(0.0 if health.failing is None else 1.0)
