"""Which tick a run belongs to, and which ticks nobody ran: pure functions of the schedule and
the clock (table-tested in tests/unit/test_ledger_ticks.py, no Consul).

A run at `now` belongs to the latest tick T at or before now. It may claim T within T's claim
window: the job's start deadline, cut at the next tick (a run later than that belongs to the
next tick). `now` is Consul's clock wherever one is known: the earliest moment the answering
agent's clock may show (consul/clock.py, learnt from every answer's Date against this process's
monotonic clock), so a step or a skew of this host's clock moves no decision; before any answer
it is this host's clock. The agent's Date in the answer to the read just before a claim is
Consul's word that T has come: while it is still before T, the run waits for it, so no job
starts before its tick on Consul's clock. This host's clock is only compared with it, for a
warning (clock_skew). Whatever the clocks do, the ledger still makes each tick run at most once.

A tick is missed when its window closed (plus MISSED_GRACE, for clocks and timers a second or
two apart) with no record; only ticks after the oldest record count (before it the job may not
have existed), at most `limit` of them are named at a time, and only among the newest
MISSED_WALK ticks: the walk costs the same whatever the ledger holds and history_limit says.

A record dated later than now plus FUTURE_TOLERANCE is suspect: no runner claims a tick that
far ahead of its clocks, so the record is a forgery or a clock badly wrong. Retention never
deletes it and never counts it, and the readers never take it for a run (ledger/history.py).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

from provision.schedule import Schedule

MISSED_GRACE = 2.0  # seconds past a claim window before its tick may be called missed
MAX_EARLY_WAIT = 5.0  # seconds a run waits for the agent's clock to reach its tick
SKEW_REPORTED = 2.0  # seconds between the two clocks worth a warning
_SECOND = timedelta(seconds=1)


@dataclass(frozen=True)
class TickChoice:
    """The tick a run belongs to and whether it may claim it now."""

    tick: datetime
    window: float  # seconds after the tick during which it may be claimed
    lag: float  # seconds this run is late for it, on the clock it was judged by
    wait: float  # seconds to wait first: the agent's clock has not reached the tick yet
    skew: float | None = None  # this host's clock minus the agent's, by SKEW_REPORTED or more
    # at most one later tick has come: a record of this tick is still kept (retention keeps
    # at least the newest two, to_prune), so "no record" means nobody ran it
    recent: bool = True

    @property
    def too_late(self) -> bool:
        return self.lag > self.window

    @property
    def too_early(self) -> bool:
        """The agent's clock is so far behind that waiting for it is not reasonable."""
        return self.wait > MAX_EARLY_WAIT


def clock_skew(sent: datetime, received: datetime, agent_date: datetime) -> float | None:
    """This host's clock minus the agent's, when they differ by SKEW_REPORTED or more whatever
    the answer's delay. The agent wrote its Date at some moment between `sent` and `received`
    (this host's clock), when its own clock lay in [date, date + 1 s): the estimate is the
    middle of both, and half the round trip is no evidence of skew (a loaded agent answering
    2 s late has the right clock)."""
    middle = sent + (received - sent) / 2
    estimate = (middle - agent_date).total_seconds() - 0.5
    uncertainty = (received - sent).total_seconds() / 2
    return estimate if abs(estimate) - uncertainty >= SKEW_REPORTED else None


SKEW_SAID_AGAIN = 1.0  # seconds a skew said must move before it is said again


def skew_to_say(host_ahead: float | None, uncertainty: float, said: float | None) -> float | None:
    """The skew of this host's clock to the agent's to warn of now (pure), or None: it is known
    (`host_ahead`, the middle of what the answers allow, `uncertainty` their width) to be
    SKEW_REPORTED or more, and was not said yet or has moved by SKEW_SAID_AGAIN since `said`."""
    if host_ahead is None or abs(host_ahead) - uncertainty / 2 < SKEW_REPORTED:
        return None
    if said is not None and abs(host_ahead - said) < SKEW_SAID_AGAIN:
        return None
    return host_ahead


def claim_window(schedule: Schedule, tick: datetime, start_deadline: float) -> float:
    following = schedule.next_ticks(tick, 1)[0]
    return min(start_deadline, (following - tick).total_seconds())


def choose_tick(
    schedule: Schedule, now: datetime, start_deadline: float, agent_date: datetime | None = None
) -> TickChoice:
    """The tick a run at `now` belongs to; `agent_date`: the agent's Date, if just read."""
    tick = schedule.latest_tick_at_or_before(now)
    return judge_tick(schedule, tick, now, start_deadline, agent_date)


def judge_tick(
    schedule: Schedule,
    tick: datetime,
    now: datetime,
    start_deadline: float,
    agent_date: datetime | None = None,
) -> TickChoice:
    """Whether a run at `now` may claim `tick`, the tick its caller waited for (a scheduler's
    timer, or `lockctl run`'s own choice): never recomputed from the clock here. `agent_date`:
    the agent's clock in the answer to the read just made, if any."""
    wait = 0.0 if agent_date is None else max(0.0, (tick - agent_date).total_seconds())
    lag = (now - tick).total_seconds()
    following, after = schedule.next_ticks(tick, 2)
    window = min(start_deadline, (following - tick).total_seconds())
    return TickChoice(tick, window, lag, wait, recent=after > now)


# The ticks the missed-tick walk looks at, newest first from now: the most a housekeeping
# records at once (tick/core.py MAX_MISSED_PER_HOUSEKEEPING, 60) and the newest few whose claim
# window (at most one interval) and grace (MISSED_GRACE: 2 s, three ticks of a 1 s schedule)
# are still open. Fixed, not tied to history_limit (up to 10,000: each tick a cron step) or to
# how many records there are: an older gap is not lost, every housekeeping (after each run) and
# every `lockctl check` recorded it while it was within the walk; only an outage longer than
# the walk with nobody running or checking leaves its oldest ticks unrecorded, and the newest
# MISSED_WALK of them still show it (CRITICAL: check judges the last --max-intervals ticks).
MISSED_WALK = 68


def missed_ticks(
    schedule: Schedule,
    recorded: Collection[datetime],
    now: datetime,
    start_deadline: float,
    *,
    limit: int,
) -> list[datetime]:
    """Ticks without a record whose claim window closed before `now` (newest first), after the
    oldest recorded tick, at most `limit`, among the newest MISSED_WALK ticks at or before `now`
    (recorded or not: the walk's cost does not grow with the ledger or the limit)."""
    if not recorded or limit <= 0:
        return []
    since = min(recorded)
    horizon = now - timedelta(seconds=MISSED_GRACE)
    walk = schedule.ticks_at_or_before(now)
    tick = next(walk)
    following = schedule.next_ticks(tick, 1)[0]
    missed: list[datetime] = []
    for _ in range(MISSED_WALK):
        if tick <= since or len(missed) >= limit:
            break
        window = min(start_deadline, (following - tick).total_seconds())
        if tick + timedelta(seconds=window) < horizon and tick not in recorded:
            missed.append(tick)
        following, tick = tick, next(walk)
    return missed


def unsettled_ticks(
    schedule: Schedule,
    recorded: Collection[datetime],
    now: datetime,
    start_deadline: float,
    before: datetime,
) -> list[datetime]:
    """Ticks before `before` (the tick just run) without a record that are not missed yet: their
    claim window and MISSED_GRACE have not passed at `now`. Nobody may run them any more (a
    later tick was claimed), so they will be missed, but only a housekeeping after `now` may say
    so. Newest first; only the last few ticks can be in that state (a window is at most one
    interval), so the walk stops at MISSED_WALK ticks even when `now` is before `before` (a
    clock stepped back, under which no tick becomes missable)."""
    if not recorded:
        return []
    since, horizon = min(recorded), now - timedelta(seconds=MISSED_GRACE)
    unsettled: list[datetime] = []
    walk = schedule.ticks_at_or_before(before - _SECOND)
    following, tick = before, next(walk)
    for _ in range(MISSED_WALK):
        if tick <= since:
            break
        window = min(start_deadline, (following - tick).total_seconds())
        if tick + timedelta(seconds=window) < horizon:
            break  # this one and all older ones are missable now: housekeeping's business
        if tick not in recorded:
            unsettled.append(tick)
        following, tick = tick, next(walk)
    return unsettled


# Seconds a record's tick may lie ahead of a reader's clock and still be a real run. A runner
# claims a tick once the agent's clock has reached it (it waits at most MAX_EARLY_WAIT, and
# skips beyond), or without that read only while its clocks agreed within SKEW_REPORTED; a
# reader's clock is another host's or agent's (a Date rounds down by up to 1 s). So a real
# record is a few seconds ahead at most: a minute leaves ten times that, and room for a reader
# whose clock is tens of seconds behind. Erring either way is cheap: a real record taken for
# suspect is only kept (never deleted: deleting it would let its tick run again) and warned
# about until the clock passes it, and a forged one within the minute is soon a past record,
# which anyone who may write the ledger could write anyway. Far-future ones (2099) are caught.
FUTURE_TOLERANCE = 60.0


def suspect(tick: datetime, now: datetime) -> bool:
    """Whether a record of `tick` is dated in the future: later than `now` + FUTURE_TOLERANCE."""
    return tick > now + timedelta(seconds=FUTURE_TOLERANCE)


PRUNE_SLACK = 0.1  # retention deletes in batches: once the records exceed the limit by 10%


def to_prune(ticks: Collection[datetime], keep: int, *, now: datetime) -> list[datetime]:
    """The ticks beyond the newest `keep`, oldest first: what retention deletes. Nothing until
    they exceed `keep` by PRUNE_SLACK (at least one), so most runs write nothing for it.
    Suspect ticks (dated in the future at `now`) are neither deleted nor counted: newest by
    name, they would otherwise push the real records out, the run just recorded first."""
    real = sorted(tick for tick in ticks if not suspect(tick, now))
    if len(real) <= keep + max(1, int(keep * PRUNE_SLACK)):
        return []
    return real[: len(real) - keep]
