"""A TickStore whose every call waits aside (tick/clock.py ThreadTimerClock.aside): while one
call waits for Consul's answer, the core's other timers run as they come due (a fence, another
run's renewal), as they do in the simulation, where a slow answer is a nested sleep. Without
it, a Consul that accepts a connection and never answers would hold the core's one thread, and
every fence and renewal with it, for a client's whole timeout."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from provision.tick.clock import ThreadTimerClock
from provision.tick.store import TickStore

# the protocol's calls (tick/store.py); anything else a store has is reached as it is
CALLS = frozenset(name for name in vars(TickStore) if not name.startswith("_"))


class _Aside:
    def __init__(self, store: object, clock: ThreadTimerClock) -> None:
        self._store, self._clock = store, clock

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._store, name)
        if name not in CALLS:
            return found
        return lambda *args, **kwargs: self._clock.aside(_bound(found, args, kwargs))


def _bound(
    call: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Callable[[], Any]:
    return lambda: call(*args, **kwargs)


def aside_store(store: TickStore, clock: ThreadTimerClock) -> TickStore:
    """`store`, its TickStore calls made aside on `clock` (its other attributes as they are)."""
    return cast(TickStore, _Aside(store, clock))
