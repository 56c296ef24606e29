"""Whether a replica at its cap of concurrent runs passes a tick on (pure: table-tested in
tests/unit/test_tick_capacity.py). The next worker in the tick's claim order reads it
unclaimed at its own turn and claims it (ledger/turns.py), so the tick runs on time there
instead of late here; a tick the whole fleet is too busy for is missed as any unclaimed one."""

from __future__ import annotations


def capacity_refusal(running: int, cap: int | None) -> str | None:
    """Why a replica with `running` runs (or claims in flight) does not claim another under
    `cap` (None: no cap), in words for its skip note, or None when it may claim."""
    if cap is None or running < cap:
        return None
    return f"{running} of {cap} concurrent runs here"
