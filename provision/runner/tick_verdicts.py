"""A scheduled run's words for why its claim was refused, pure: in a word, for the metrics, and
in the `skipped` event's fields."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from provision.ledger.records import TickRecord, tick_name
from provision.runner.results import SkipReason


@dataclass(frozen=True)
class TickRefusal:
    """Why the claim of `tick` was refused: `fields` for the `skipped` event, `skip` in a word."""

    tick: datetime
    fields: dict[str, object]
    skip: SkipReason

    def event_fields(self) -> dict[str, object]:
        return {"tick": tick_name(self.tick), **self.fields}


def missed_fields(tick: datetime, lag: float, deadline: float, recorded: bool) -> dict[str, object]:
    """The `missed` event's fields: too late for `tick`, `lag` seconds after it on the agent's
    clock against its start `deadline` (both also as numbers, for whoever reads the events),
    and whether this run wrote its `missed` record."""
    reason = (
        f"tick {tick_name(tick)}: started {lag:.1f}s after it on the Consul agent's clock, "
        f"later than its start deadline ({deadline:.0f}s); not run"
    )
    return {
        "reason": reason,
        "lag_ms": round(lag * 1000, 1),
        "deadline_ms": round(deadline * 1000, 1),
        "recorded": recorded,
    }


def paused_refusal(paused: TickRecord) -> TickRefusal:
    """The skip of a tick recorded paused: who paused the job, and why."""
    said = f" ({paused.reason})" if paused.reason else ""
    reason = f"tick {tick_name(paused.tick)}: the job is paused, by {paused.by}{said}: not run"
    skip = refused_skip(recorded=False, lock_delay=False, running=None, paused=True)
    return TickRefusal(paused.tick, {"reason": reason, "paused_by": paused.by}, skip)


def refused_skip(
    *, recorded: bool, lock_delay: bool, running: str | None, paused: bool = False
) -> SkipReason:
    """Why a claim was refused, in a word: the tick has a record (another runner has or had
    it); the job is paused (our claim found its paused key: the tick is recorded paused);
    Consul refused the lock for its lock-delay; the lock's holder names the tick it runs
    (a tick's claim writes it: the job's previous tick still runs, an overlap); else the lock
    is held by something else (a plain `lockctl run`, a record that names no tick)."""
    if recorded:
        return SkipReason.TAKEN
    if paused:
        return SkipReason.PAUSED
    if lock_delay:
        return SkipReason.LOCK_DELAY
    return SkipReason.OTHER if running is None else SkipReason.OVERLAP
