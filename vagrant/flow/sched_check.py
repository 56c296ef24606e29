"""The flow's scheduler check: `lockctl schedule` ran as lockctl-scheduler.service on every
worker for a few ticks of a short job, then `systemctl stop` ended each. Pure: evidence in, a
report out (no VMs, no Consul).

The witnesses are those of the tick check (ticks.py: the job's ledger, the job's own log on each
worker, the job's events in each scheduler's journal), held against each other the same way, and
besides them:
- the window: every tick after the later scheduler said `started` and before the stop was sent
  (less half an interval: the tick before the stop is the last one both had) has a record, and
  the window has at least `min_ticks`;
- no overlap: each run's record was finished before the next tick's was claimed;
- the life cycle: each scheduler said `started` and `stopped` (SIGTERM), destroyed every session
  it made, and none of them is left in Consul; systemd saw its main process exit 0
  (Result=success) and never restarted it;
- the journal: no error event (of any job), no traceback.
Who ran how many ticks is reported, not required: which replica wins a tick is a race.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from flow import ticks
from flow.ticks import TICK_FORMAT, JobRun, TickReport
from provision.system.text import printable

# Events that say something went wrong: Consul unanswered or refusing, a lock lost, a tick not
# tried, a config refused. (`skipped` and `housekeeping` are the normal course.)
ERROR_TEXT_LIMIT = 300  # characters of an error event's own words in the check's report
ERROR_EVENTS = frozenset(
    {
        "consul-unavailable",
        "session-lost",
        "tick-failed",
        "reload-refused",
        "renew-failed",
        "lost",
        "fenced",
        "missed",
        "timed-out",
        "interrupted",
        "clock-skew",
        "housekeeping-failed",
        "metrics-warning",
    }
)
SIGTERM = 15


@dataclass(frozen=True)
class Service:
    """What one worker's scheduler service left: its journal's events (every job), whether the
    journal had a traceback, and `systemctl show` after the stop (Result, ExecMainStatus, ...)."""

    events: list[dict[str, Any]]
    traceback: bool
    show: dict[str, str]


@dataclass
class SchedulerReport:
    ticks: TickReport  # the job's ticks, checked as the timers' are
    window: list[str]
    problems: list[str]
    ran_by: dict[str, int]
    stops: dict[str, str]

    @property
    def passed(self) -> bool:
        return self.ticks.passed and not self.problems

    def to_record(self, period: int, job: str) -> dict[str, Any]:
        return {
            **self.ticks.to_record(period),
            "job": job,
            "passed": self.passed,
            "window": self.window,
            "ran_by": self.ran_by,
            "stops": self.stops,
            "problems": self.ticks.problems + self.problems,
        }

    def table(self) -> list[str]:
        lines = self.ticks.table()[:-1]  # its verdict is replaced by the whole check's
        lines.append(
            f"window: {len(self.window)} ticks ({self.window[0] if self.window else '-'} .. "
            f"{self.window[-1] if self.window else '-'}); ran by "
            + ", ".join(f"{w}: {n}" for w, n in sorted(self.ran_by.items()))
        )
        lines += [f"{w}: systemctl stop: {stop}" for w, stop in sorted(self.stops.items())]
        problems = self.ticks.problems + self.problems
        verdict = "PASS" if self.passed else "FAIL: " + "; ".join(problems)
        lines.append(f"scheduler check: {verdict}")
        return lines


def parse_show(text: str) -> dict[str, str]:
    """`systemctl show -p A -p B` lines (`A=value`), plus the flow's own `stop_ms=`."""
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def check_scheduler(
    job: str,
    period: int,
    min_ticks: int,
    ledger: list[dict[str, Any]],
    job_runs: dict[str, list[JobRun]],
    services: dict[str, Service],
    stop_sent: float,
    sessions_left: list[str],
) -> SchedulerReport:
    """`stop_sent`: when the flow sent `systemctl stop` (epoch seconds); `sessions_left`: the
    sessions the schedulers made that Consul still knows after the stop."""
    own = {w: [e for e in s.events if e.get("job") == job] for w, s in services.items()}
    window = _window(period, own, services, stop_sent)
    # A run the stop itself interrupted (a tick after the window: the SIGTERM reached its
    # scheduler as it started, the ssh to a 1-vCPU VM takes seconds) was stopped as promised,
    # and its record says so: it is not a tick that should have run to its end.
    last = window[-1] if window else ""
    stopped = {
        str(r["tick"])
        for r in ledger
        if str(r["tick"]) > last and r.get("outcome") == "interrupted"
    }
    # A tick before the window came while a scheduler was still starting: the start's timing.
    first = window[0] if window else ""
    judged, runs, own = ticks.of_ticks(
        lambda tick: tick >= first and tick not in stopped, ledger, job_runs, own
    )
    tick_report = ticks.check_ticks(period, 1, judged, runs, own)
    recorded = {str(r["tick"]) for r in ledger}
    problems: list[str] = []
    if len(window) < min_ticks:
        problems.append(f"the window has {len(window)} ticks, wanted at least {min_ticks}")
    problems += [f"tick {t} (in the window) has no record" for t in window if t not in recorded]
    problems += _overlaps(ledger)
    for worker, service in sorted(services.items()):
        problems += [f"{worker}: {p}" for p in _service_problems(service, stop_sent, first)]
    problems += [f"session {s} is still in Consul after the stop" for s in sessions_left]
    ran_by = dict(Counter(str(r["worker"]) for r in judged if r.get("outcome") == "succeeded"))
    for worker in services:
        ran_by.setdefault(worker, 0)
    stops = {w: _stop_text(s.show) for w, s in services.items()}
    return SchedulerReport(tick_report, window, problems, ran_by, stops)


def _window(
    period: int,
    own: dict[str, list[dict[str, Any]]],
    services: dict[str, Service],
    stop_sent: float,
) -> list[str]:
    """The ticks every scheduler had: after the later `started`, and from the first tick
    after the last run of an earlier tick was released (a scheduler starting on a slow VM
    claims the tick of its start late, and that run may overlap the next tick: the start's
    timing), up to half an interval before the stop was sent. `own`: the job's events."""
    started = [
        _moment(str(e["time"]))
        for s in services.values()
        for e in s.events
        if e.get("event") == "started" and e.get("time")
    ]
    if len(started) < len(services) or not services:
        return []
    first = int(max(started).timestamp()) // period * period + period
    released = [
        _moment(str(e["time"])).timestamp()
        for events in own.values()
        for e in events
        if e.get("event") == "released"
        and isinstance(e.get("tick"), str)
        and _moment(str(e["tick"])).timestamp() < first
    ]
    if released:
        first = max(first, -(-int(max(released)) // period) * period)
    last = stop_sent - period / 2
    return [
        datetime.fromtimestamp(t, timezone.utc).strftime(TICK_FORMAT)
        for t in range(first, int(last) + 1, period)
    ]


def _error_text(event: dict[str, Any]) -> str:
    """What the first such event said (its tick, error or detail), printable and short: the
    journal is the VM's, its text never reaches a terminal raw."""
    fields = [f"{k}={event[k]}" for k in ("tick", "error", "detail") if event.get(k)]
    return f": {printable(' '.join(map(str, fields)), ERROR_TEXT_LIMIT)}" if fields else ""


def _stopped_by_the_stop(event: dict[str, Any], stop_sent: float) -> bool:
    """A run the SIGTERM stopped before its job started: the stop's own doing, not an error."""
    when = event.get("time")
    if event.get("event") != "interrupted" or not isinstance(when, str):
        return False
    return _moment(when).timestamp() >= stop_sent


def _missed_before_the_window(event: dict[str, Any], first: str) -> bool:
    """A tick before the window (`first`, its first tick): one that came before a scheduler
    started, tried at its start and too late for, or one a late run of its start's tick
    overlapped: the start's timing, not an error."""
    tick = event.get("tick")
    if event.get("event") != "missed" or not first or not isinstance(tick, str):
        return False
    return _moment(tick) < _moment(first)


def _overlaps(ledger: list[dict[str, Any]]) -> list[str]:
    """Runs whose records overlap: a tick claimed before the previous run's record finished."""
    timed = sorted(
        (_moment(str(r["claimed_at"])), _moment(str(r["finished_at"])), str(r["tick"]))
        for r in ledger
        if r.get("claimed_at") and r.get("finished_at")
    )
    return [
        f"tick {nxt[2]} was claimed {(prev[1] - nxt[0]).total_seconds():.3f}s before tick "
        f"{prev[2]}'s run finished (overlap)"
        for prev, nxt in itertools.pairwise(timed)
        if nxt[0] < prev[1] - timedelta(seconds=CLOCK_TOLERANCE)
    ]


# The two records' times come from two VMs' clocks, which are not kept in sync (no NTP in the
# lab): a claim after the other's unlock can read as up to this much before its `finished_at`.
# The lock itself rules a real overlap out; this check is on the records' word.
CLOCK_TOLERANCE = 1.0


def _service_problems(service: Service, stop_sent: float, first: str) -> list[str]:
    events = service.events
    names = [str(e.get("event")) for e in events]
    problems = []
    if "started" not in names:
        problems.append("the scheduler never said started")
    if not any(e.get("event") == "stopped" and e.get("signal") == SIGTERM for e in events):
        problems.append("no `stopped` event for SIGTERM")
    created = {str(e.get("session")) for e in events if e.get("event") == "session-created"}
    destroyed = {str(e.get("session")) for e in events if e.get("event") == "session-destroyed"}
    problems += [f"session {s} was made and never destroyed" for s in sorted(created - destroyed)]
    found = [
        e
        for e in events
        if e["event"] in ERROR_EVENTS
        and not _stopped_by_the_stop(e, stop_sent)
        and not _missed_before_the_window(e, first)
    ]
    errors = Counter(f"{e.get('job')}: {e.get('event')}" for e in found)
    said = {f"{e.get('job')}: {e.get('event')}": _error_text(e) for e in reversed(found)}
    problems += [f"error event {what} (x{n}){said[what]}" for what, n in sorted(errors.items())]
    if service.traceback:
        problems.append("a traceback in the journal")
    show = service.show
    if show.get("Result") != "success" or show.get("ExecMainStatus") != "0":
        problems.append(f"systemctl stop: {_stop_text(show)}, not Result=success exit 0")
    if show.get("NRestarts", "0") != "0":
        problems.append(f"systemd restarted it {show['NRestarts']} times")
    return problems


def _stop_text(show: dict[str, str]) -> str:
    return (
        f"Result={show.get('Result', '?')} exit {show.get('ExecMainStatus', '?')} "
        f"in {show.get('stop_ms', '?')} ms"
    )


def session_ids(services: dict[str, Service]) -> list[str]:
    """Every session the schedulers said they made, for the look in Consul after the stop."""
    return sorted(
        {
            str(e["session"])
            for s in services.values()
            for e in s.events
            if e.get("event") == "session-created" and e.get("session")
        }
    )


def _moment(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
