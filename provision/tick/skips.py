"""Why a tick was skipped, in a word: apart from the core's edges (edge.py), so that a skip
reported without the core (`lockctl run`'s cheap skip, runner/results.py) loads none of it."""

from __future__ import annotations

import enum


class SkipReason(str, enum.Enum):
    """Why a replica did not run a tick it had a turn at, in a word: decided where the skip is,
    never read back from a reason's text (it can quote anyone's record). The values are the
    `reason` label of `lockctl_skips_total`."""

    TAKEN = "taken"  # the tick has a record: another runner has (or had) it
    OVERLAP = "overlap"  # the job's previous tick still runs (here, or holding the lock)
    LOCK_DELAY = "lock-delay"  # the lock's last holder's session ended: Consul's lock-delay
    PAUSED = "paused"  # the job is paused (lockctl pause): its tick is recorded paused
    BLACKOUT = "blackout"  # a blackout window of the spec holds the tick: recorded blackout
    OTHER = "other"  # held by something else, or not come on Consul's clock
    # the replica runs its max_concurrent_runs already: the next in the claim order takes the tick
    AT_CAPACITY = "at-capacity"
