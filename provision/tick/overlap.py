"""What a replica does at its turn at a tick while the same job is busy here (pure): the job's
`overlap` policy decides, and only the replica that holds the run can carry it out (the others
see the lock held, or the tick `buffered`, and look at the tick's fate later).

    not busy                       TAKE    the turn goes on: read, claim
    skip, busy                     WAIT    the tick waits for the run's end, taken then if its
                                           window is still open, else skipped (overlap)
    buffer_one, busy, none kept    BUFFER  the tick is recorded `buffered` (one write), and run
                                           over that record as soon as the job is free, by
                                           this replica or the first other whose claim finds
                                           the lock free, within its start deadline
    buffer_one, one kept already   SKIP    at most one buffered: this one passes (overlap)
    cancel, a run going on here    CANCEL  the run is stopped as `lockctl abort` stops it, and
                                           recorded `cancelled`; the tick waits for its end
    cancel, nothing to stop        WAIT    a claim in flight, a run already told to end

"allow" is never offered: two runs of one job at once is what the lock exists to prevent.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from provision.timings import OVERLAP_BUFFER_ONE, OVERLAP_CANCEL


class OverlapAction(str, enum.Enum):
    TAKE = "take"
    WAIT = "wait"
    BUFFER = "buffer"
    SKIP = "skip"
    CANCEL = "cancel"


@dataclass(frozen=True)
class Busy:
    """What goes on for the job here at a turn: `claim_or_run`, its claim or its run; `stoppable`,
    a run that nothing has told to end yet (HeldRun.stoppable); `buffered`, a tick kept."""

    claim_or_run: bool = False
    stoppable: bool = False
    buffered: bool = False


def overlap_action(policy: str, busy: Busy) -> OverlapAction:
    """The action at a turn of a job with overlap `policy`, while `busy` goes on here."""
    if not busy.claim_or_run:
        return OverlapAction.TAKE
    if policy == OVERLAP_CANCEL and busy.stoppable:
        return OverlapAction.CANCEL
    if policy == OVERLAP_BUFFER_ONE:
        return OverlapAction.SKIP if busy.buffered else OverlapAction.BUFFER
    return OverlapAction.WAIT
