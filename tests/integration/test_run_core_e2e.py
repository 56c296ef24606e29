"""`lockctl run` on the tick core (LOCKCTL_RUNNER=core, runner/on_core.py) through the tick
scenarios of test_ticks.py on the real cluster: runners up to a second apart run each tick of an
`@every 3s` job exactly once; a tick nobody ran is recorded missed, once; a tick whose previous
run still goes is skipped as an overlap; with --wait the next tick runs once the previous run
ends. The scenarios are test_ticks.py's, with a lab of their own; every `lockctl run` they start
runs its tick on the core (its read, claim, held run and completion: core.py `take`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_ticks import (
    lab,
    test_a_tick_nobody_ran_is_recorded_missed_once,
    test_a_tick_whose_previous_run_still_goes_is_skipped_as_an_overlap,
    test_runners_up_to_a_second_apart_run_each_tick_exactly_once,
    test_with_wait_the_next_tick_runs_once_the_previous_run_ends,
)

__all__ = [
    "lab",
    "test_a_tick_nobody_ran_is_recorded_missed_once",
    "test_a_tick_whose_previous_run_still_goes_is_skipped_as_an_overlap",
    "test_runners_up_to_a_second_apart_run_each_tick_exactly_once",
    "test_with_wait_the_next_tick_runs_once_the_previous_run_ends",
]


@pytest.fixture(autouse=True)
def on_the_core(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every `lockctl run` these tests start runs its tick on the tick core."""
    monkeypatch.setenv("LOCKCTL_RUNNER", "core")
    yield
