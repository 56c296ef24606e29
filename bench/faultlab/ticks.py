"""The tick oracle: every tick of a scheduled job, judged from the oracle's holders (who really
ran, on the oracle's clock) and the job's tick ledger in Consul (read with lockctl's own Ledger).

Per tick, from the job's first record to its last run's record:

- run at most once: at most one holder (one process tree) entered the oracle for the tick;
- witnessed: each holder's tick has a record of a run by that holder's worker and LockIndex,
  and no record says the job `succeeded` or `failed` where no holder ever entered;
- run or recorded missed: every tick has a record (a run, an `abandoned` run whose scheduler
  died, or `missed`), except the newest ones no run could have recorded yet (their claim window
  plus MISSED_GRACE, plus FATE_SLACK, had not closed when the last run finished);
- not failed: the job exits 0 unless its own lock's fence stops it (`lost`, `interrupted`);
- missed only where a fault excuses it: a missed tick lies inside the takeover bound of a fault
  (from one interval before it to the bound after it), or while the job's previous run was still
  going (a job that outlasts its interval skips the ticks it overlaps, by design).

Pure: the caller reads the holders and the records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from bench.faultlab.oracle import Holder
from provision.ledger.records import TickRecord, tick_name
from provision.ledger.ticks import MISSED_GRACE
from provision.outcomes import Outcome
from provision.schedule import Schedule

# A replica records a tick nobody ran once its window and MISSED_GRACE closed on Consul's clock:
# a read, then a write, after that instant. The scenario's stop can come in between, and a
# stopping replica writes no more (the next replica's start records the tick). So only a tick
# whose fate was due this much before the last run finished must have its record.
FATE_SLACK = 2.0

RAN = frozenset(
    {
        Outcome.RUNNING,  # shown `abandoned` once its session is gone: its runner died
        Outcome.SUCCEEDED,
        Outcome.FAILED,
        Outcome.LOST,
        Outcome.INTERRUPTED,
    }
)
# A claim that was stopped before its job entered the oracle (SIGTERM, fenced, killed) has a
# record and no holder; a run that ended on its own must have had one.
NEEDS_HOLDER = frozenset({Outcome.SUCCEEDED, Outcome.FAILED})


@dataclass(frozen=True)
class Excuse:
    """Ticks in [start, end] may be missed: a fault's takeover bound."""

    start: datetime
    end: datetime
    what: str


@dataclass
class TickVerdict:
    """One job's ticks, judged."""

    job: str
    checked: int = 0  # ticks from the first record to the last run's
    ran: int = 0
    missed: int = 0  # recorded missed, excused
    missed_by_overlap: int = 0  # of those: outside a fault, while the previous run still went on
    twice: list[str] = field(default_factory=list)  # ticks run by more than one holder
    unexcused: list[str] = field(default_factory=list)  # missed outside every excuse
    unrecorded: list[str] = field(default_factory=list)  # no record although one was due
    unwitnessed: list[str] = field(default_factory=list)  # a holder and the ledger disagree
    # The job exits 0, or is stopped by its own runner's fence (`lost`) or a stop (`interrupted`):
    # a `failed` run was ended by something else (another job's clean-up, a stray signal).
    failed: list[str] = field(default_factory=list)
    missed_ticks: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        found = []
        for what, ticks in (
            ("run more than once", self.twice),
            ("missed outside a fault's takeover bound", self.unexcused),
            ("neither run nor recorded missed", self.unrecorded),
            ("ledger and oracle disagree", self.unwitnessed),
            ("failed, killed by no fence of theirs", self.failed),
        ):
            if ticks:
                found.append(f"{self.job}: {len(ticks)} tick(s) {what}: {', '.join(ticks[:6])}")
        return found


def judge_ticks(
    job: str,
    schedule: Schedule,
    holders: Sequence[Holder],
    records: Sequence[TickRecord],
    excuses: Sequence[Excuse],
) -> TickVerdict:
    verdict = TickVerdict(job)
    by_tick = {tick_name(r.tick): r for r in records}
    _witness(verdict, holders, by_tick)
    runs = sorted((r for r in records if r.outcome in RAN), key=lambda r: r.tick)
    if not records or not runs:
        return verdict
    last = runs[-1]
    decided_by = last.finished_at or last.claimed_at or last.tick
    window = _interval(schedule, last.tick)
    tick = min(r.tick for r in records)
    while tick <= last.tick:
        record = by_tick.get(tick_name(tick))
        verdict.checked += 1
        if record is None:
            if tick + timedelta(seconds=window + MISSED_GRACE + FATE_SLACK) <= decided_by:
                verdict.unrecorded.append(tick_name(tick))
        elif record.outcome is Outcome.MISSED:
            _judge_missed(verdict, tick, runs, excuses)
        elif record.outcome in RAN:
            verdict.ran += 1
            if record.outcome is Outcome.FAILED:
                verdict.failed.append(f"{tick_name(tick)} (exit {record.exit_status})")
        tick = schedule.next_ticks(tick, 1)[0]
    return verdict


def _witness(
    verdict: TickVerdict, holders: Sequence[Holder], by_tick: dict[str, TickRecord]
) -> None:
    seen: dict[str, list[Holder]] = {}
    for holder in holders:
        if holder.tick is not None:
            seen.setdefault(holder.tick, []).append(holder)
    verdict.twice = sorted(tick for tick, hs in seen.items() if len(hs) > 1)
    for tick, hs in sorted(seen.items()):
        record = by_tick.get(tick)
        for holder in hs:
            if not _is_run_of(record, holder):
                verdict.unwitnessed.append(f"{tick} (holder {holder.worker}, {_said(record)})")
    for tick, record in sorted(by_tick.items()):
        if record.outcome in NEEDS_HOLDER and tick not in seen:
            verdict.unwitnessed.append(f"{tick} ({record.outcome.value}, no holder)")


def _is_run_of(record: TickRecord | None, holder: Holder) -> bool:
    """The record says the holder's worker ran the tick, under the holder's LockIndex (a
    `running` record has none yet: the claim learns it in the same transaction, after the set)."""
    if record is None or record.outcome not in RAN or record.worker != holder.worker:
        return False
    return record.lock_index in (holder.lock_index, None) and (
        record.lock_index is not None or record.outcome is Outcome.RUNNING
    )


def _said(record: TickRecord | None) -> str:
    if record is None:
        return "no record"
    return f"record: {record.outcome.value} by {record.worker}, LockIndex {record.lock_index}"


def _judge_missed(
    verdict: TickVerdict, tick: datetime, runs: Sequence[TickRecord], excuses: Sequence[Excuse]
) -> None:
    verdict.missed_ticks.append(tick_name(tick))
    if any(e.start <= tick <= e.end for e in excuses):
        verdict.missed += 1  # the fault's cost (also when a paused or cut-off run spans it)
    elif any(r.tick < tick and (r.finished_at is not None and tick <= r.finished_at) for r in runs):
        verdict.missed += 1
        verdict.missed_by_overlap += 1
    else:
        verdict.unexcused.append(tick_name(tick))


def _interval(schedule: Schedule, tick: datetime) -> float:
    return (schedule.next_ticks(tick, 1)[0] - tick).total_seconds()
