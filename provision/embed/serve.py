"""`Locker.serve()`: the decorated jobs run at their ticks on `lockctl schedule`'s own machinery,
for an app without a scheduler of its own.

One TickTimer (scheduler/timer.py) for all the jobs, one JobTicks loop (scheduler/loop.py) per
job with the app's body instead of a command: the same claim order and jitter, the same cadence
of reads and housekeeping, the same overlap skips and `consul-unavailable` handling, under the
Locker's session pool and on its Consul clock. Each job's runs are one after the other, so one
RunEvents per job tells each run of its fencing in turn.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from provision.embed.run import RunEvents
from provision.runner.body import JobBody
from provision.scheduler.loop import JobTicks
from provision.scheduler.timer import TickTimer

if TYPE_CHECKING:
    from collections.abc import Callable

    from provision.embed.locker import Locker

STOP_POLL = 0.5  # seconds: how soon a set `stop` event retires the timer


def serve_jobs(locker: Locker, stop: threading.Event) -> None:
    """Until `stop` is set (the timer retires: runs under way end as they will) or the Locker
    closes (its stop request: runs under way are told to stop)."""
    loops = [_loop(locker, name) for name in locker.served]
    timer = TickTimer(loops, locker.stop_request, wall=locker.wall)
    watcher = threading.Thread(
        target=_retire_when, args=(stop, locker, timer), name="lockctl-serve", daemon=True
    )
    watcher.start()
    try:
        timer.run()
    finally:
        stop.set()  # the watcher's end too
        watcher.join()
        for loop in loops:
            loop.leave()


def _loop(locker: Locker, name: str) -> JobTicks:
    from provision.embed.locker import body_maker

    config, served = locker.job(name), locker.served[name]
    events = RunEvents(name, locker.worker, locker.stream, served.on_lost)
    make = body_maker(config, served.function, served.isolation)
    body: Callable[[], JobBody] = lambda: make(events)  # noqa: E731
    return JobTicks(
        locker.consul,
        config,
        locker.worker,
        events,
        locker.stop_request,
        wall=locker.wall,
        sessions=locker.sessions,
        body=body,
    )


def _retire_when(stop: threading.Event, locker: Locker, timer: TickTimer) -> None:
    while not stop.wait(STOP_POLL):
        if locker.stopping:
            return  # the timer sees the stop request itself
    timer.retire()
