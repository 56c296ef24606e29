"""The self-fencing bound, shared by the spec validator and the runner's config loader.

Another session can acquire our lock only after our session is invalidated plus LockDelay (D).
Our session was valid when the server handled our last confirming request, which it did after we
SENT it. So counting from that send time, the runner stops the child at D - kill grace (G) -
margin with SIGTERM and at D - margin with SIGKILL: dead before anyone else can hold the lock.
Renewals go out every renew interval (R); if D - G - margin were not above R, a healthy runner
would fence its own child between two normal renewals. So D must be above R + G + margin.
"""

from __future__ import annotations

SAFETY_MARGIN = 1.0  # seconds: signal delivery, process exit and clock-rate differences


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
