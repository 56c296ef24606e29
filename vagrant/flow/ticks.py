"""The flow's tick check: over several ticks of a short job that every worker's timer fires at
the same moment, each tick ran exactly once. Pure: text in, a report out (no VMs, no Consul).

Three witnesses, each checked against the others:
- the ledger (`ledger_read.py`): one record per tick, who claimed it, its LockIndex, how it went;
- the job's own log on each worker (`vagrant/tick-job`: `<tick> <worker> <LockIndex> <start>`
  per run, the tick as `lockctl run` gave it in LOCKCTL_TICK);
- each runner's stderr events (its journal): `acquired` (with the LockIndex) when it ran the
  job, `skipped` or `missed` (with the tick) when it did not.

Passes when every tick from the first record to the last has one; at least MIN_TICKS of them
succeeded, the job ran exactly once for each, on the worker the record names, with its
LockIndex; every other is recorded missed, ran nowhere, and a runner said why: it started past
the tick's start deadline on the agent's clock (`lag_ms` > `deadline_ms` in its `missed` event);
no run and no `acquired` event lacks a record; and no LockIndex repeats. A late start is the
VMs' timing (emulated CPUs on a shared host stall for seconds), not lockctl's: the promise is
that such a tick runs nowhere and is recorded, which is what is checked for it. Each worker's
runner firing on every tick (acquired or skipped) is reported per tick, with how far apart the
runners answered (`apart`: the winner's claim to the last skip); that both fired, close
together, is what makes the race real.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

TICK_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
_CONSUMED = re.compile(r"Consumed ([0-9.]+)(m?s) CPU time")  # systemd's line at a run's end


@dataclass(frozen=True)
class JobRun:
    """One line of a worker's ticks.log: the job ran for `tick`."""

    tick: str
    worker: str
    lock_index: int
    started: int  # epoch seconds, the job's own clock


@dataclass
class TickReport:
    passed: bool
    rows: list[dict[str, Any]]
    problems: list[str]
    event_counts: dict[str, dict[str, int]] = field(default_factory=dict)
    late: dict[str, str] = field(default_factory=dict)  # tick -> why it was missed, a runner's word

    def to_record(self, period: int) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "period_s": period,
            "ticks": self.rows,
            "ticks_run_once": sum(1 for row in self.rows if len(row["runs"]) == 1),
            "missed_late": self.late,
            "runner_events": self.event_counts,
            "problems": self.problems,
        }

    def table(self) -> list[str]:
        """The report's lines: one per tick, the events per worker, the verdict."""
        lines = [
            f"{'tick (UTC)':<21} {'record':<22} {'LockIndex':<9} {'job ran on':<12} "
            f"{'apart':<7} what each runner did"
        ]
        for row in self.rows:
            record = f"{row['outcome'] or '-'} {row['claimed_by'] or ''}".strip()
            runs = ", ".join(run["worker"] for run in row["runs"]) or "-"
            fired = "; ".join(f"{w}: {what}" for w, what in sorted(row["fired"].items()))
            index = "-" if row["lock_index"] is None else str(row["lock_index"])
            apart = "-" if row["fired_apart_s"] is None else f"{row['fired_apart_s']:.2f}s"
            lines.append(
                f"{row['tick']:<21} {record:<22} {index:<9} {runs:<12} {apart:<7} {fired or '-'}"
            )
        for worker, counts in sorted(self.event_counts.items()):
            lines.append(f"{worker}: runner events {dict(sorted(counts.items()))}")
        for _, why in sorted(self.late.items()):
            lines.append(f"missed, run nowhere, recorded: {why}")
        verdict = "PASS" if self.passed else "FAIL: " + "; ".join(self.problems)
        lines.append(f"tick check: {verdict}")
        return lines


def parse_job_log(text: str) -> list[JobRun]:
    runs = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[2].isdigit() and fields[3].isdigit():
            runs.append(JobRun(fields[0], fields[1], int(fields[2]), int(fields[3])))
    return runs


def parse_events(text: str) -> list[dict[str, Any]]:
    """The runner's JSON event lines of a journal (anything else in it is left out)."""
    events = []
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and isinstance(event.get("event"), str):
            events.append(event)
    return events


def first_tick_after(moment: float, period: int) -> str:
    """The first tick of an epoch-anchored `@every period` schedule after `moment`."""
    tick = (int(moment) // period + 1) * period
    return datetime.fromtimestamp(tick, timezone.utc).strftime(TICK_FORMAT)


Evidence = tuple[list[dict[str, Any]], dict[str, list[JobRun]], dict[str, list[dict[str, Any]]]]


def in_window(
    first: str,
    ledger: list[dict[str, Any]],
    job_runs: dict[str, list[JobRun]],
    events: dict[str, list[dict[str, Any]]],
) -> Evidence:
    """The evidence of the ticks from `first` on: the warm-up's earlier tick left out. Tick
    names compare in time order (one fixed format)."""
    return of_ticks(lambda tick: tick >= first, ledger, job_runs, events)


def of_ticks(
    keep: Callable[[str], bool],
    ledger: list[dict[str, Any]],
    job_runs: dict[str, list[JobRun]],
    events: dict[str, list[dict[str, Any]]],
) -> Evidence:
    """The evidence of the ticks `keep` says yes to: their records, their runs of the job, and
    their runners' events. A tick left out takes all of its evidence with it: the `acquired` of
    its LockIndex (that event names no tick), the `skipped` or `missed` naming it."""
    kept = [r for r in ledger if keep(str(r["tick"]))]
    dropped = {r.get("lock_index") for r in ledger if not keep(str(r["tick"]))} - {None}

    def in_it(event: dict[str, Any]) -> bool:
        if event["event"] == "acquired":
            return event.get("lock_index") not in dropped
        return event.get("tick") is None or keep(str(event["tick"]))

    runs = {w: [r for r in rs if keep(r.tick)] for w, rs in job_runs.items()}
    return kept, runs, {w: [e for e in evs if in_it(e)] for w, evs in events.items()}


def cpu_times(journal: str) -> str:
    """Each run's CPU time as systemd logged it at the run's end ("Consumed 5.1s CPU time")."""
    seconds = []
    for found in _CONSUMED.finditer(journal):
        value, unit = float(found.group(1)), found.group(2)
        seconds.append(value / 1000 if unit == "ms" else value)
    return ", ".join(f"{s:.1f} s" for s in seconds) or "none logged"


def parse_show(text: str) -> dict[str, str]:
    """KEY=VALUE words (the warm-up's `status=0 wall_ms=7250`, `systemctl show`'s lines)."""
    pairs = (word.split("=", 1) for word in text.split() if "=" in word)
    return {key: value for key, value in pairs}


def run_figures(shown: dict[str, str]) -> str:
    """One run of a service, timed in the guest: its wall time and `systemctl start`'s status."""
    try:
        wall_s = int(shown["wall_ms"]) / 1000
    except (KeyError, ValueError):
        return f"not measured ({shown or 'no answer'})"
    return f"{wall_s:.1f} s, systemctl start: status {shown.get('status', '?')}"


def check_ticks(
    period: int,
    min_ticks: int,
    ledger: list[dict[str, Any]],
    job_runs: dict[str, list[JobRun]],
    events: dict[str, list[dict[str, Any]]],
) -> TickReport:
    records = {str(r["tick"]): r for r in ledger}
    expected = _ticks_between(sorted(records), period)
    runs_by_tick: dict[str, list[JobRun]] = defaultdict(list)
    for runs in job_runs.values():
        for run in runs:
            runs_by_tick[run.tick].append(run)
    late = _late_starts(events)
    problems: list[str] = []
    succeeded = sum(1 for r in records.values() if r.get("outcome") == "succeeded")
    if succeeded < min_ticks:
        problems.append(f"only {succeeded} ticks succeeded, wanted at least {min_ticks}")
    rows = []
    for tick in expected:
        record = records.get(tick)
        runs = runs_by_tick.get(tick, [])
        problems += _tick_problems(tick, record, runs, late)
        rows.append(_row(tick, record, runs, events))
    problems += _unclaimed_runs(records, runs_by_tick, events)
    indexes = [r["lock_index"] for r in ledger if r.get("lock_index") is not None]
    repeated = sorted(i for i, n in Counter(indexes).items() if n > 1)
    if repeated:
        problems.append(f"a LockIndex repeats across ticks: {repeated}")
    counts = {w: dict(Counter(str(e["event"]) for e in evs)) for w, evs in events.items()}
    missed = {t: why for t, why in late.items() if records.get(t, {}).get("outcome") == "missed"}
    return TickReport(not problems, rows, problems, counts, missed)


def _late_starts(events: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
    """The ticks a runner started too late for, by its own `missed` event: `lag_ms` past the
    tick on the agent's clock, beyond `deadline_ms`. Each with the runner's words."""
    late = {}
    for worker, evs in sorted(events.items()):
        for event in filter(_said_late, evs):
            late[str(event.get("tick"))] = f"{worker}: {event.get('reason')}"
    return late


def _ticks_between(ticks: list[str], period: int) -> list[str]:
    """Every tick of the schedule from the first recorded to the last (epoch-anchored)."""
    if not ticks:
        return []
    first, last = _parse(ticks[0]), _parse(ticks[-1])
    count = int((last - first).total_seconds()) // period + 1
    return [(first + timedelta(seconds=n * period)).strftime(TICK_FORMAT) for n in range(count)]


def _parse(tick: str) -> datetime:
    return datetime.strptime(tick, TICK_FORMAT).replace(tzinfo=timezone.utc)


def _said_late(event: dict[str, Any]) -> bool:
    """A `missed` event whose numbers say the run started past the tick's deadline."""
    lag, deadline = event.get("lag_ms"), event.get("deadline_ms")
    if event["event"] != "missed" or not isinstance(lag, (int, float)):
        return False
    return isinstance(deadline, (int, float)) and lag > deadline


def _tick_problems(
    tick: str, record: dict[str, Any] | None, runs: list[JobRun], late: dict[str, str]
) -> list[str]:
    if record is None:
        ran = f" (the job ran on {[r.worker for r in runs]})" if runs else ""
        return [f"tick {tick} has no record{ran}"]
    if record.get("outcome") == "missed" and tick in late and not runs:
        return []  # started past its deadline: run nowhere, recorded (the promise for it)
    problems = []
    if record.get("outcome") != "succeeded":
        who = record.get("worker")
        problems.append(f"tick {tick}: outcome {record.get('outcome')} (by {who}), not succeeded")
    if len(runs) != 1:
        problems.append(f"tick {tick}: the job ran {len(runs)} times {[r.worker for r in runs]}")
    for run in runs:
        if (run.worker, run.lock_index) != (record.get("worker"), record.get("lock_index")):
            problems.append(
                f"tick {tick}: the job ran on {run.worker} with LockIndex {run.lock_index}, the "
                f"record says {record.get('worker')} with {record.get('lock_index')}"
            )
    return problems


def _unclaimed_runs(
    records: dict[str, dict[str, Any]],
    runs_by_tick: dict[str, list[JobRun]],
    events: dict[str, list[dict[str, Any]]],
) -> list[str]:
    """Runs of the job, and `acquired` events, that no record accounts for."""
    problems = [
        f"the job ran for tick {tick} on {[r.worker for r in runs]}, which has no record"
        for tick, runs in sorted(runs_by_tick.items())
        if tick not in records
    ]
    claimed = {(r.get("worker"), r.get("lock_index")) for r in records.values()}
    for worker, evs in sorted(events.items()):
        for event in evs:
            if event["event"] == "acquired" and (worker, event.get("lock_index")) not in claimed:
                problems.append(
                    f"{worker} acquired the lock (LockIndex {event.get('lock_index')}) "
                    "without a tick record"
                )
    return problems


def _row(
    tick: str,
    record: dict[str, Any] | None,
    runs: list[JobRun],
    events: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    record = record or {}
    return {
        "tick": tick,
        "claimed_by": record.get("worker"),
        "outcome": record.get("outcome"),
        "lock_index": record.get("lock_index"),
        "start_lag_s": record.get("start_lag"),
        "runs": [{"worker": r.worker, "lock_index": r.lock_index} for r in runs],
        "fired": {w: _fired(tick, record, evs) for w, evs in events.items()},
        "fired_apart_s": _apart(tick, record, events),
    }


def _apart(
    tick: str, record: dict[str, Any], events: dict[str, list[dict[str, Any]]]
) -> float | None:
    """Seconds between the first and the last runner's answer for `tick`: the winner's claim
    (its record's claimed_at) and the others' skip events. None unless two or more are known."""
    moments = [record["claimed_at"]] if record.get("claimed_at") else []
    for evs in events.values():
        moments += [
            str(e["time"])
            for e in evs
            if e["event"] in ("skipped", "missed") and e.get("tick") == tick and e.get("time")
        ]
    parsed = sorted(datetime.fromisoformat(m.replace("Z", "+00:00")) for m in moments)
    if len(parsed) < 2:
        return None
    return round((parsed[-1] - parsed[0]).total_seconds(), 3)


def _fired(tick: str, record: dict[str, Any], events: list[dict[str, Any]]) -> str:
    """What this worker's runner did for `tick`: ran it, skipped it (why), or nothing seen."""
    for event in events:
        if event["event"] == "acquired" and event.get("lock_index") == record.get("lock_index"):
            return "ran it"
        if event["event"] in ("skipped", "missed") and event.get("tick") == tick:
            taken_by = event.get("taken_by")
            why = f"taken by {taken_by}" if taken_by else event.get("reason", "?")
            return f"{event['event']} ({why})"
    return "-"
