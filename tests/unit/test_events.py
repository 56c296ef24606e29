"""The event log never fails its caller: a broken stream is remembered, later events dropped."""

from __future__ import annotations

import io
import json

import pytest

from provision.runner.events import EventLog


class Broken(io.StringIO):
    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def write(self, text: str) -> int:
        raise self.error


def test_events_are_json_lines_with_job_and_worker() -> None:
    stream = io.StringIO()
    EventLog("nightly", "worker-1", stream).emit("acquired", lock_index=3, session=None)
    record = json.loads(stream.getvalue())
    assert record["event"] == "acquired" and record["job"] == "nightly"
    assert record["worker"] == "worker-1" and record["lock_index"] == 3
    assert "session" not in record  # None fields are left out


@pytest.mark.parametrize(
    "error",
    [BrokenPipeError(32, "Broken pipe"), OSError(28, "No space left"), ValueError("closed")],
)
def test_a_failing_stream_never_raises_and_is_reported_once(error: Exception) -> None:
    events = EventLog("nightly", "worker-1", Broken(error))
    for _ in range(3):
        events.emit("renewed", took_ms=1.0)  # from the renewer thread: must not raise
    assert events.broken is not None and type(error).__name__ in events.broken
    assert events.dropped == 3
