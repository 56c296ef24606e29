"""What one job loop of the scheduler saw, for `/metrics` and `/healthz` (scheduler/listen.py).

Writers are the loop's thread and the engine's helper threads; the reader is the listener's
thread. The state is one immutable CountsSnapshot, replaced whole under a lock at each change: a
reader takes it as it is, never half-updated.

The loop says what it decided (a tick due, its own overlap skips, Consul out of reach, a new
session) and what each run's RunResult says (the outcome, why it skipped, how long the job ran,
its start lag): `after_result`, `after_skips`, pure and tested as tables. Only what the engine's
threads see while a run goes on (the job running, renewals, the housekeeping after the release)
comes from their events, by the event's name alone (`after_helper_event`; loop.py says why),
and of `housekeeping` the number of ticks it recorded missed. What kube-state-metrics says of a
CronJob (its schedule, its next tick, whether it is paused) comes from the loop and the trigger
watch, which know it already.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from provision.fencing import Outcome
from provision.runner.results import RunResult, SkipReason
from provision.system.text import printable

# Skips by reason: a small fixed set decided where the skip is, never the reason's text.
SKIP_REASONS = tuple(SkipReason)
# The tick outcomes as the loop counts them (RunResult's, plus its own two).
OUTCOMES = (
    "ran",
    "skipped",
    "missed",
    "lost",
    "interrupted",
    "job-timed-out",
    "error",
    "consul-unavailable",
)

# Cron jobs run from under a second to hours; a tick starts within ms, or seconds when late.
DURATION_BUCKETS = (0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0)
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ERROR_LIMIT = 160  # characters of a Consul error kept for /healthz (printable, bounded)


class SessionState(str, enum.Enum):
    NOT_YET = "not-yet"  # no tick has needed one yet (or it was destroyed at the end)
    VALID = "valid"
    LOST = "lost"  # Consul no longer knows it; the next tick makes a new one


@dataclass(frozen=True)
class Observations:
    """A histogram's state: a count per bucket (the last one above every bound) and the sum."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...] = ()
    total: float = 0.0

    def added(self, value: float) -> Observations:
        counts = list(self.counts or (0,) * (len(self.bounds) + 1))
        index = next((i for i, bound in enumerate(self.bounds) if value <= bound), -1)
        counts[index] += 1
        return replace(self, counts=tuple(counts), total=self.total + value)

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, count of values <= le) per bound and +Inf, as Prometheus exposes them."""
        counts = self.counts or (0,) * (len(self.bounds) + 1)
        pairs, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), counts, strict=True):
            running += count
            pairs.append(("+Inf" if bound == float("inf") else repr(bound), running))
        return pairs


@dataclass(frozen=True)
class CountsSnapshot:
    ticks_due: int = 0
    outcomes: Mapping[str, int] = field(default_factory=dict)
    skips: Mapping[SkipReason, int] = field(default_factory=dict)
    consul_unavailable: int = 0
    renew_failures: int = 0
    # ticks counted here since this replica's last success (or its start): the min over the
    # replicas is the job's ticks since its last success anywhere
    ticks_since_success: int = 0
    missed_recorded: int = 0  # ticks nobody ran, recorded missed by this replica's housekeeping
    run_failures: int = 0  # runs that ended with a non-zero exit status under the lock
    retries: int = 0  # attempts made after a failed one (tick/retries.py), from the results
    retries_cut: int = 0  # runs whose retries were cut (by the next tick, or a stop)
    running: bool = False
    consul_up: bool = True  # until a request of this loop goes unanswered
    consul_error: str | None = None  # why not (printable, bounded)
    session: SessionState = SessionState.NOT_YET
    last_success: float | None = None  # Unix time
    failing: str | None = None  # why its last tick failed (not Consul: a refusal, a bug)
    durations: Observations = Observations(DURATION_BUCKETS)
    lags: Observations = Observations(LAG_BUCKETS)
    # what kube-state-metrics says of a CronJob, from what the loop and the trigger watch know
    schedule: str | None = None  # the job's schedule and its timezone, as the config says
    timezone: str = "UTC"
    next_tick: float | None = None  # the tick the loop runs next (Unix time)
    paused: bool = False  # the job's paused key was there at the trigger watch's last answer


# A result that claimed nothing: the read of the tick's record (or the claim) was its last
# request, and it was answered (unanswered, the run raises ConsulError instead). A missed tick
# may be judged without a read (scheduler/cadence.py), which it does only while Consul's recent
# answers agreed with this host's clock: counted as answered all the same.
_ANSWERED_BY_PLAN = (Outcome.SKIPPED, Outcome.MISSED)


def after_result(state: CountsSnapshot, result: RunResult, now: float) -> CountsSnapshot:
    """`state` after a run of the loop's tick ended with `result` at `now` (Unix time)."""
    state = counted(state, result.outcome.value, 1)
    if result.outcome is Outcome.SKIPPED:
        state = skipped(state, result.skip or SkipReason.OTHER, 1)
    if result.outcome in _ANSWERED_BY_PLAN:
        state = answered(state)
    if result.duration is not None:
        state = replace(state, durations=state.durations.added(result.duration))
    if result.start_lag is not None:
        state = replace(state, lags=state.lags.added(result.start_lag))
    if result.attempts > 1 or result.retries_cut:
        cut = state.retries_cut + (1 if result.retries_cut else 0)
        state = replace(state, retries=state.retries + result.attempts - 1, retries_cut=cut)
    if result.outcome is Outcome.RAN and result.exit_code == 0:
        state = replace(state, last_success=now, ticks_since_success=0)
    elif result.outcome is Outcome.RAN:
        state = replace(state, run_failures=state.run_failures + 1)
    return replace(state, running=False, failing=None)  # a tick went through: not failing


def failed(state: CountsSnapshot, why: str) -> CountsSnapshot:
    """`state` after a tick failed for a reason of lockctl's own (the command cannot start, a
    refused token, a bug): counted as an error, and said by /healthz until a tick goes through."""
    return replace(counted(state, "error", 1), failing=printable(why, ERROR_LIMIT), running=False)


def after_skips(state: CountsSnapshot, reason: SkipReason, n: int) -> CountsSnapshot:
    """`state` after the loop itself skipped `n` ticks (no request made: Consul's state stays)."""
    return skipped(counted(state, Outcome.SKIPPED.value, n), reason, n)


# What only the engine's threads see while a run goes on, by the event's name: the acquire
# and the end under the lock (runner/engine.py), renewals (runner/monitors.py, and the session
# pool's when it is the job's own), the housekeeping after the release (runner/tick_lock.py).
# The scheduler's shared pool tells each job loop of its session's news directly
# (SessionPool.subscribe), with the same event names.
HELPER_EVENTS = frozenset(
    {
        "acquired",
        "released",
        "lost",
        "renewed",
        "renew-failed",
        "housekeeping",
        "housekeeping-failed",
        "session-lost",
        "session-destroyed",
    }
)
_SESSION_EVENTS = {"session-lost": SessionState.LOST, "session-destroyed": SessionState.NOT_YET}


def after_helper_event(
    state: CountsSnapshot, event: str, error: object, missed_recorded: int = 0
) -> CountsSnapshot:
    """`state` after a helper thread emitted `event` (one of HELPER_EVENTS); `error` is its
    Consul error, for /healthz; `missed_recorded` the ticks a `housekeeping` recorded missed."""
    if event == "housekeeping":
        state = replace(state, missed_recorded=state.missed_recorded + missed_recorded)
    if event in ("acquired", "released", "renewed", "housekeeping"):
        state = answered(state)
    if event in ("renew-failed", "housekeeping-failed"):
        state = unanswered(state, error)
    if event == "renew-failed":
        state = replace(state, renew_failures=state.renew_failures + 1)
    if event in ("acquired", "released", "lost") and state.running != (event == "acquired"):
        state = replace(state, running=event == "acquired")
    if event in _SESSION_EVENTS:
        state = replace(state, session=_SESSION_EVENTS[event])
    return state


def answered(state: CountsSnapshot) -> CountsSnapshot:
    if state.consul_up and state.consul_error is None:
        return state  # the common case, several times a run: no copy of 20 fields
    return replace(state, consul_up=True, consul_error=None)


def unanswered(state: CountsSnapshot, error: object) -> CountsSnapshot:
    why = printable(str(error), ERROR_LIMIT) if error is not None else "no answer"
    return replace(state, consul_up=False, consul_error=why)


def counted(state: CountsSnapshot, outcome: str, n: int) -> CountsSnapshot:
    outcomes = state.outcomes
    return replace(
        state,
        outcomes={**outcomes, outcome: outcomes.get(outcome, 0) + n},
        ticks_since_success=state.ticks_since_success + n,
    )


def skipped(state: CountsSnapshot, reason: SkipReason, n: int) -> CountsSnapshot:
    return replace(state, skips={**state.skips, reason: state.skips.get(reason, 0) + n})


class LoopCounts:
    """One loop's counts, safe to change from several threads and to read from another."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = CountsSnapshot()

    def snapshot(self) -> CountsSnapshot:
        with self._lock:
            return self._state

    def helper_event(self, event: str, error: object, missed_recorded: int = 0) -> None:
        with self._lock:
            self._state = after_helper_event(self._state, event, error, missed_recorded)

    def tick_due(self) -> None:
        with self._lock:
            self._state = replace(self._state, ticks_due=self._state.ticks_due + 1)

    def counted(self, outcome: str, n: int = 1) -> None:
        """A tick's outcome that is the loop's own (an error, Consul unavailable)."""
        with self._lock:
            self._state = counted(self._state, outcome, n)

    def failed(self, why: str) -> None:
        """A tick failed for a reason of lockctl's own (`failed`)."""
        with self._lock:
            self._state = failed(self._state, why)

    def finished(self, result: RunResult, now: float) -> None:
        """A run of the loop's tick ended with `result` at `now` (Unix time)."""
        with self._lock:
            self._state = after_result(self._state, result, now)

    def skipped(self, reason: SkipReason, n: int) -> None:
        """The loop itself skipped `n` ticks (an overlap: they passed while a run went on)."""
        with self._lock:
            self._state = after_skips(self._state, reason, n)

    def session_made(self) -> None:
        """The loop holds its locks under a session Consul just made or knows."""
        with self._lock:
            self._state = replace(answered(self._state), session=SessionState.VALID)

    def not_running(self) -> None:
        with self._lock:
            if self._state.running:
                self._state = replace(self._state, running=False)

    def consul_failed(self, error: str, *, renewing: bool) -> None:
        with self._lock:
            state = unanswered(self._state, error)
            self._state = replace(
                state,
                consul_unavailable=state.consul_unavailable + 1,
                renew_failures=state.renew_failures + (1 if renewing else 0),
            )

    def consul_answered(self) -> None:
        with self._lock:
            self._state = answered(self._state)

    def schedule_known(self, schedule: str | None, timezone: str) -> None:
        """The job's schedule, as its loop was made with it (a reload may change it)."""
        with self._lock:
            self._state = replace(self._state, schedule=schedule, timezone=timezone)

    def tick_planned(self, tick: float) -> None:
        """The loop's next tick is at `tick` (Unix time)."""
        with self._lock:
            if self._state.next_tick != tick:
                self._state = replace(self._state, next_tick=tick)

    def pause_known(self, paused: bool) -> None:
        """Whether the job's paused key is there, at the trigger watch's last answer."""
        with self._lock:
            if self._state.paused != paused:
                self._state = replace(self._state, paused=paused)
