"""A job's timings and counts: their bounds, their defaults and the self-fencing bound.

The spec validator and the worker-config loader both check them with these functions, so a
hand-edited worker config can hold no value the spec would refuse.

The fencing bound. Another session can acquire our lock only after our session is invalidated
plus LockDelay (D). Our session was valid when the server handled our last confirming request,
which it did after we SENT it. So counting from that send time, the runner stops the job at
D - kill grace (G) - margin with SIGTERM and at D - margin with SIGKILL: dead before anyone else
can hold the lock. Renewals go out every renew interval (R); if D - G - margin were not above R,
a healthy runner would fence its own job between two normal renewals. So D must be above
R + G + margin.
"""

from __future__ import annotations

from dataclasses import dataclass

from provision.durations import format_duration, parse_duration

SAFETY_MARGIN = 1.0  # seconds: signal delivery, process exit and clock-rate differences

# Inclusive bounds in seconds. TTL and LockDelay are Consul's own limits; the renew interval must
# also stay below TTL/2 (see renew_problem). start_deadline: how late after its scheduled tick a
# run may still claim it. jitter: the most a tick's planned start is put off (provision/ledger/
# turns.py), the same on every replica; an hour at most. timeout: how long a job may run, from its
# start, before it is stopped as a lost lock's job is (provision/fencing.py); no default (no
# timeout); a week at most, a bound like the others' rather than a run anyone plans for.
# retry_delay: the pause between a failed attempt's end and the next (tick/retries.py), the
# lock held meanwhile; an hour at most: a retry never starts at or past the next tick anyway.
BOUNDS: dict[str, tuple[float, float]] = {
    "ttl": (10.0, 86400.0),
    "lock_delay": (0.0, 60.0),
    "renew_interval": (1.0, 86400.0),
    "kill_grace": (0.0, 60.0),
    "min_hold": (0.0, 86400.0),
    "start_deadline": (1.0, 86400.0),
    "jitter": (0.0, 3600.0),
    "timeout": (1.0, 604800.0),
    "retry_delay": (0.0, 3600.0),
}
FIELDS = tuple(BOUNDS)
# What a spec gets when neither the job nor its defaults block says (Go durations).
DEFAULTS = {
    "ttl": "15s",
    "lock_delay": "15s",
    "kill_grace": "5s",
    "start_deadline": "5m",
    "jitter": "0s",
    "retry_delay": "10s",
}

# Whole numbers, inclusive bounds. history_limit: the tick records the ledger keeps per job; the
# upper bound keeps pruning and `lockctl history` bounded too.
# retries: the attempts after a failed first one (tick/retries.py), 0 by default (none).
COUNT_BOUNDS: dict[str, tuple[int, int]] = {"history_limit": (10, 10000), "retries": (0, 10)}
COUNT_FIELDS = tuple(COUNT_BOUNDS)
# 50 keeps 10,000 jobs' ledgers at about a third of Consul's 1 GB guidance (docs/scale.md);
# raise it per job for a longer history.
COUNT_DEFAULTS: dict[str, int] = {"history_limit": 50, "retries": 0}
# true or false. retry_on_timeout: an attempt stopped at its timeout is retried too.
FLAG_DEFAULTS: dict[str, bool] = {"retry_on_timeout": False}
FLAG_FIELDS = tuple(FLAG_DEFAULTS)
DEFAULT_START_DEADLINE = parse_duration(DEFAULTS["start_deadline"]).seconds

# What a job does after a time nobody ran it (ledger/catchup.py): "skip" leaves the ticks it
# missed missed; "latest" runs the newest of them once, while within its start_deadline; "all"
# runs each of them once, oldest first, within its catchup_window, catchup_limit at most.
CATCHUP_ALL = "all"
CATCHUP_MODES = ("skip", "latest", CATCHUP_ALL)
DEFAULT_CATCHUP = "skip"
CATCHUP_LIMIT_BOUNDS = (1, 1000)

# What a scheduled job's tick does when it comes while the job's previous run still runs
# (tick/overlap.py): "skip" lets the running one go on (the tick runs late if its window allows,
# else it is skipped); "buffer_one" records the tick `buffered` and runs it as soon as the run
# ends, within its start_deadline (one at most: a later one meanwhile is skipped); "cancel"
# stops the running one (recorded `cancelled`) and runs the tick. "allow" is never offered: two
# runs of one job at once is what the lock exists to prevent.
OVERLAP_SKIP = "skip"
OVERLAP_BUFFER_ONE = "buffer_one"
OVERLAP_CANCEL = "cancel"
OVERLAP_MODES = (OVERLAP_SKIP, OVERLAP_BUFFER_ONE, OVERLAP_CANCEL)
DEFAULT_OVERLAP = OVERLAP_SKIP
CATCHUP_WINDOW_BOUNDS = (1.0, 7 * 86400.0)  # a second (ticks are whole seconds) to a week


@dataclass(frozen=True)
class CatchupReach:
    """How far `catchup = "all"` reaches back: ticks at most `window` seconds old, `limit` of
    them at most (the newest ones nobody ran: with limit 1 it is "latest" in a window)."""

    window: float = 3600.0  # catchup_window
    limit: int = 10  # catchup_limit


DEFAULT_CATCHUP_REACH = CatchupReach()


def capacity_problem(value: object) -> str | None:
    """Why `value` cannot be a worker's max_concurrent_runs (a whole number, 1 or more: the
    most runs a `lockctl schedule` replica has at once), or None."""
    if type(value) is not int:  # not True (a bool is an int), not 2.0
        return "must be a whole number, 1 or more"
    if value >= 1:
        return None
    return f"{value if abs(value) < 10**12 else 'the number'} is below 1"


def catchup_problem(value: object) -> str | None:
    """Why `value` cannot be a job's catchup, or None."""
    if value in CATCHUP_MODES:
        return None
    return 'must be "skip", "latest" or "all"'


def overlap_problem(value: object) -> str | None:
    """Why `value` cannot be a job's overlap, or None."""
    if value in OVERLAP_MODES:
        return None
    said = 'must be "skip", "buffer_one" or "cancel"'
    if value == "allow":
        return f"is never offered (two runs of one job at once is what the lock prevents): {said}"
    return said


def catchup_limit_problem(value: object) -> str | None:
    """Why `value` cannot be a job's catchup_limit (a whole number, 1..1000), or None."""
    low, high = CATCHUP_LIMIT_BOUNDS
    if type(value) is not int:  # not True (a bool is an int), not 2.0
        return f"must be a whole number, {low}..{high}"
    if low <= value <= high:
        return None
    return f"{value if abs(value) < 10**12 else 'the number'} is outside {low}..{high}"


def catchup_window_problem(seconds: float) -> str | None:
    """Why `seconds` cannot be a job's catchup_window (above zero, a week at most), or None."""
    low, high = CATCHUP_WINDOW_BOUNDS
    if low <= seconds <= high:
        return None
    return f"is outside {_text(low)}..{_text(high)}"


@dataclass(frozen=True)
class JobTimings:
    """How one job's lock and ticks behave, in seconds: the spec settles it (defaults applied,
    checked) and the worker config carries the same one to the runner and the scheduler."""

    ttl: float
    lock_delay: float
    renew_interval: float
    kill_grace: float
    min_hold: float = 0.0  # 0: no minimum hold
    start_deadline: float = DEFAULT_START_DEADLINE  # how late after its tick a run may claim it
    jitter: float = 0.0  # the most a tick's planned start is put off (ledger/turns.py)
    timeout: float | None = None  # how long a run may go on from its start; None: no limit
    retries: int = 0  # attempts after a failed first one, same lock and tick (tick/retries.py)
    retry_delay: float = 10.0  # seconds between an attempt's end and the next one's start
    retry_on_timeout: bool = False  # an attempt stopped at its timeout is retried too


def default_renew_interval(ttl: float) -> float:
    """TTL/3: two renewals can fail before the session expires."""
    return ttl / 3


def bound_problem(field: str, seconds: float) -> str | None:
    """Why `seconds` is outside the field's bounds (the message names the range), or None."""
    low, high = BOUNDS[field]
    if low <= seconds <= high:
        return None
    return f"is outside {_text(low)}..{_text(high)}"


def count_problem(field: str, value: object) -> str | None:
    """Why `value` cannot be the field's count (not an integer, or outside its bounds), or None."""
    low, high = COUNT_BOUNDS[field]
    if type(value) is not int:  # not True (a bool is an int), not 200.0
        return f"must be a whole number, {low}..{high}"
    if low <= value <= high:
        return None
    shown = str(value) if abs(value) < 10**12 else "the number"  # a hostile one may be huge
    return f"{shown} is outside {low}..{high}"


def renew_problem(renew_interval: float, ttl: float) -> str | None:
    """The renew interval must stay below TTL/2, so one failed renewal can be retried before
    the session expires."""
    if renew_interval < ttl / 2:
        return None
    return f"must be below ttl/2 = {_text(ttl / 2)} (ttl {_text(ttl)})"


def fencing_problem(lock_delay: float, renew_interval: float, kill_grace: float) -> str | None:
    """Why these timings cannot keep the fencing promise, or None when they can."""
    needed = renew_interval + kill_grace + SAFETY_MARGIN
    if lock_delay > needed:
        return None
    return (
        f"lock_delay {lock_delay:g}s must be above renew_interval {renew_interval:g}s + "
        f"kill_grace {kill_grace:g}s + {SAFETY_MARGIN:g}s margin = {needed:g}s, or a lost lock's "
        "job may still run when another worker takes over (raise lock_delay, or lower "
        "renew_interval or kill_grace)"
    )


def jitter_problem(jitter: float, start_deadline: float) -> str | None:
    """A tick's start may be put off by less than its start deadline, or no run could claim it."""
    if jitter < start_deadline:
        return None
    return (
        f"jitter {jitter:g}s must be below start_deadline {start_deadline:g}s (a tick's "
        "planned start must leave time to claim it)"
    )


def retry_problem(retry_delay: float, retries: int, every: float | None) -> str | None:
    """A job retried on an `@every` schedule must wait less than the interval between its ticks,
    or no retry could ever start before the next tick (tick/retries.py cuts it there). For a
    cron schedule the gap varies: there the next tick cuts the retries at run time."""
    if not retries or every is None or retry_delay < every:
        return None
    return (
        f"retry_delay {_text(retry_delay)} must be below the schedule's interval "
        f"{_text(every)}, or no retry could start before the next tick"
    )


def _text(seconds: float) -> str:
    return format_duration(seconds)
