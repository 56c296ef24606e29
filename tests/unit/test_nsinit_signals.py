"""PID 1 of a job's namespace never loses a signal the runner forwards: one that comes while the
job is being spawned (after the go, before it exists) reaches the job once it does. Without
this, a runner SIGTERMed right after its go left the job running through the kill grace, then
SIGKILLed it (exit 137 where 143 was due). The decision only: kill(-1) is recorded, never sent."""

from __future__ import annotations

import signal

import pytest

from provision.runner import nsinit


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    seen: list[int] = []
    monkeypatch.setattr(nsinit, "_early", [])
    monkeypatch.setattr(nsinit, "_kill_all", seen.append)
    return seen


def test_a_signal_before_the_job_exists_reaches_it_once_it_does(sent: list[int]) -> None:
    nsinit._forward(signal.SIGTERM, None)
    assert sent == []  # nobody to send it to yet: kept
    nsinit._job_started()
    assert sent == [signal.SIGTERM]


def test_signals_before_and_after_the_start_arrive_in_order_and_once(sent: list[int]) -> None:
    nsinit._forward(signal.SIGHUP, None)
    nsinit._forward(signal.SIGTERM, None)
    nsinit._job_started()
    nsinit._forward(signal.SIGINT, None)
    nsinit._job_started()  # a second call sends nothing again
    assert sent == [signal.SIGHUP, signal.SIGTERM, signal.SIGINT]


def test_without_an_early_signal_nothing_is_sent_at_the_start(sent: list[int]) -> None:
    nsinit._job_started()
    assert sent == []
