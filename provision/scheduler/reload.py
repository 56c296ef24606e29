"""What a SIGHUP changes among the scheduler's job loops: only what the new config changed.

    the running jobs (by name, their JobConfig), the new config's, and whether the connection
    (address, token file, TLS) changed -> keep (the job goes on: its counters, its next turn,
    its session), add (starts at its next tick), remove (retires as its current run ends),
    replace (the new job takes over as the old one's current run ends)

A reload never waits for the longest job: each job is dealt with on its own, by the tick core
(scheduler/on_core.py hands it the new jobs: tick/core.py `update`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from provision.workers.config import JobConfig


@dataclass(frozen=True)
class ReloadPlan:
    keep: tuple[str, ...]
    add: tuple[str, ...]
    remove: tuple[str, ...]
    replace: tuple[str, ...]

    def event_fields(self) -> dict[str, list[str]]:
        """The `reloaded` event's fields (the names, sorted)."""
        return {
            "kept": list(self.keep),
            "added": list(self.add),
            "removed": list(self.remove),
            "replaced": list(self.replace),
        }


def plan_reload(
    running: Mapping[str, JobConfig], fresh: Mapping[str, JobConfig], connection_changed: bool
) -> ReloadPlan:
    """Which loops a reload keeps, adds, removes and replaces. A job whose config and connection
    are both unchanged keeps its loop; a new connection replaces every loop (new runs use the
    new client, runs under way finish on theirs)."""
    both = sorted(set(running) & set(fresh))
    same = [name for name in both if running[name] == fresh[name] and not connection_changed]
    return ReloadPlan(
        keep=tuple(same),
        add=tuple(sorted(set(fresh) - set(running))),
        remove=tuple(sorted(set(running) - set(fresh))),
        replace=tuple(name for name in both if name not in same),
    )
