"""The contract's fixture: a Harness (tick_harness.py) for each store in turn, the model on a
virtual clock and Consul on the session's real cluster; afterwards, the sessions it made are
destroyed and its keys deleted, so no session of one test expires during another."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest
from tick_harness import STORES, ConsulOperator, Harness

from provision.consul import AgentClock, Consul, ConsulError
from provision.tick.clock import SystemClock, VirtualClock
from provision.tick.consul_store import ConsulTickStore
from provision.tick.memory import MemoryTickStore
from provision.tick.store import JobKeys

if TYPE_CHECKING:
    from tests.conftest import LiveCluster


@pytest.fixture(params=STORES)
def h(request: pytest.FixtureRequest) -> Iterator[Harness]:
    name = f"contract-{uuid.uuid4().hex[:10]}"
    job = JobKeys(name, f"test/{name}/.lock")
    if request.param == "memory":
        clock = VirtualClock()
        memory = MemoryTickStore(clock)
        yield Harness("memory", memory, clock, job, memory, clock.call_later)
        return
    live: LiveCluster = request.getfixturevalue("live_cluster")
    agent = AgentClock()  # the client teaches it the agent's clock; the SystemClock reads it
    consul = Consul(live.management("worker-1").settings, agent_clock=agent)
    timers: list[threading.Timer] = []

    def later(seconds: float, callback: Callable[[], None]) -> None:
        timer = threading.Timer(seconds, callback)
        timers.append(timer)
        timer.start()

    store = ConsulTickStore(consul)
    made = Harness("consul", store, SystemClock(agent), job, ConsulOperator(consul), later)
    try:
        yield made
    finally:
        for timer in timers:
            timer.cancel()
            timer.join()
        for session_id in made.made:
            with contextlib.suppress(ConsulError):
                consul.session.destroy(session_id)
        for prefix in (f"test/{name}/", job.control):
            with contextlib.suppress(ConsulError):
                consul.kv.delete(prefix, recurse=True)
