"""`lockctl schedule` on the tick core (LOCKCTL_SCHEDULER=core, scheduler/on_core.py) through
the scheduler's own end-to-end scenarios on the real cluster: three replicas run every tick of
an `@every 3s` job exactly once without overlap, one session each; SIGTERM of the replica
running the job hands the next tick to another; no process of a job outlives its scheduler,
after SIGTERM or kill -9. The scenarios are test_scheduler.py's, with a lab of their own; the
store's calls wait aside (tick/aside.py), so this is also that path on Consul."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_scheduler import (
    lab,
    schedulers,
    test_no_process_of_a_job_outlives_its_scheduler,
    test_sigterm_of_the_running_replica_hands_the_next_tick_to_another,
    test_three_schedulers_run_every_tick_exactly_once_without_overlap,
)

__all__ = [
    "lab",
    "schedulers",
    "test_no_process_of_a_job_outlives_its_scheduler",
    "test_sigterm_of_the_running_replica_hands_the_next_tick_to_another",
    "test_three_schedulers_run_every_tick_exactly_once_without_overlap",
]


@pytest.fixture(autouse=True)
def on_the_core(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every `lockctl schedule` these tests start runs on the tick core."""
    monkeypatch.setenv("LOCKCTL_SCHEDULER", "core")
    yield
