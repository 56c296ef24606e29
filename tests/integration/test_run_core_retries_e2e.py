"""`lockctl run` on the tick core (LOCKCTL_RUNNER=core, runner/on_core.py) through the retry
scenarios of test_job_retries.py on the real cluster: a flaky tick retried under the same lock
and counted; a job failing every time stops after retries + 1 attempts; the next tick cuts the
retries; a timed-out attempt is retried only with retry_on_timeout; a lock lost during the delay
ends the retries (exit 76, its record lost with the attempt made); a stop during the delay ends
them and releases. The scenarios are test_job_retries.py's `lockctl run` ones, with a lab of
their own (the core's HeldRun retries: tick/retries.py, as the old supervisor's)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_job_retries import (
    lab,
    test_a_job_failing_every_time_stops_after_retries_plus_one_attempts,
    test_a_lock_lost_during_the_delay_ends_the_retries,
    test_a_stop_during_the_delay_ends_the_retries_and_releases,
    test_a_timed_out_attempt_is_retried_only_with_retry_on_timeout,
    test_lockctl_run_retries_a_flaky_tick_and_counts_it,
    test_the_next_tick_cuts_the_retries,
)

__all__ = [
    "lab",
    "test_a_job_failing_every_time_stops_after_retries_plus_one_attempts",
    "test_a_lock_lost_during_the_delay_ends_the_retries",
    "test_a_stop_during_the_delay_ends_the_retries_and_releases",
    "test_a_timed_out_attempt_is_retried_only_with_retry_on_timeout",
    "test_lockctl_run_retries_a_flaky_tick_and_counts_it",
    "test_the_next_tick_cuts_the_retries",
]


@pytest.fixture(autouse=True)
def on_the_core(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every `lockctl run` these tests start runs its tick on the tick core."""
    monkeypatch.setenv("LOCKCTL_RUNNER", "core")
    yield
