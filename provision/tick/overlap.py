"""What a replica does at its turn at a tick while the same job is busy here (pure): the job's
`overlap` policy decides, and only the replica that holds the run can carry it out (the others
see the lock held and look at the tick's fate after its window).

    not busy                     TAKE    the turn goes on: read, claim
    skip, busy                   WAIT    the tick waits for the run's end, taken then if its
                                         window is still open, else skipped (overlap)
    cancel, a run going on here  CANCEL  the run is stopped as `lockctl abort` stops it, and
                                         recorded `cancelled`; the tick waits for its end
    cancel, nothing to stop      WAIT    a claim in flight, a run already told to end

"allow" is never offered: two runs of one job at once is what the lock exists to prevent.
"""

from __future__ import annotations

import enum

from provision.timings import OVERLAP_CANCEL


class OverlapAction(str, enum.Enum):
    TAKE = "take"
    WAIT = "wait"
    CANCEL = "cancel"


def overlap_action(policy: str, busy: bool, stoppable: bool) -> OverlapAction:
    """The action at a turn: `busy`, the job's claim or run goes on here; `stoppable`, a run
    of it goes on here that nothing has told to end yet (HeldRun.stoppable)."""
    if not busy:
        return OverlapAction.TAKE
    if policy == OVERLAP_CANCEL and stoppable:
        return OverlapAction.CANCEL
    return OverlapAction.WAIT
