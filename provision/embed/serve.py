"""`Locker.serve()`: an in-process scheduler for the decorated jobs, for an app without one.

One thread a job sleeps until the job's next tick on Consul's clock (the Locker's AgentClock),
then calls the decorated function, which claims that tick as any other caller's would: the
claim's transaction, not this timer, makes the tick run once across the replicas.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from provision.runner.tick_lock import job_schedule

if TYPE_CHECKING:
    from provision.embed.locker import Locker

LATE = 0.05  # seconds past the tick a timer wakes: the tick has come on every clock near ours


def serve_jobs(locker: Locker, stop: threading.Event) -> None:
    """Fire each registered job at its ticks until `stop` is set or the Locker closes."""
    threads = [
        threading.Thread(target=_fire, args=(locker, name, stop), name=f"lockctl-serve-{name}")
        for name in locker.registered
    ]
    for thread in threads:
        thread.daemon = True
        thread.start()
    for thread in threads:
        thread.join()


def _fire(locker: Locker, name: str, stop: threading.Event) -> None:
    schedule = job_schedule(locker.job(name))
    assert schedule is not None
    call = locker.registered[name]
    while not stop.is_set() and not locker.stopping:
        now = locker.wall()
        due = schedule.next_ticks(now, 1)[0]
        if stop.wait(max(0.0, (due - now).total_seconds()) + LATE) or locker.stopping:
            return
        call()
