"""`lockctl run` on the tick core (LOCKCTL_RUNNER=core, runner/on_core.py) through the catch-up
scenarios of test_catchup.py on the real cluster: two runs back at once after a gap catch up the
newest tick nobody ran once (its record says catchup), older ticks stay missed; a tick a pause
held is not caught up though the pause was resumed meanwhile; a catch-up claims over a `missed`
record at the index it read only. The scenarios are test_catchup.py's `lockctl run` ones, with a
lab of their own (the core's catch-up look after its one tick: core.py `take`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_catchup import (
    lab,
    test_a_catchup_claims_over_a_missed_record_at_its_index_only,
    test_lockctl_run_catches_up_once_when_two_come_back_at_once,
    test_no_catchup_of_a_tick_a_pause_held_though_it_was_resumed_meanwhile,
)

__all__ = [
    "lab",
    "test_a_catchup_claims_over_a_missed_record_at_its_index_only",
    "test_lockctl_run_catches_up_once_when_two_come_back_at_once",
    "test_no_catchup_of_a_tick_a_pause_held_though_it_was_resumed_meanwhile",
]


@pytest.fixture(autouse=True)
def on_the_core(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every `lockctl run` these tests start runs its tick on the tick core."""
    monkeypatch.setenv("LOCKCTL_RUNNER", "core")
    yield
