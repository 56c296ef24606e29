"""The tick core's clocks (provision/tick/clock.py): the VirtualClock a simulation drives (time
moves only when asked, timers run in order of due time, ties in registration order, a sleep
never blocks) and the SystemClock over the agent's clock."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest

from provision.consul import AgentClock
from provision.tick.clock import DEFAULT_START, Clock, SystemClock, VirtualClock

START = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def test_wall_and_monotonic_move_together_and_only_when_asked() -> None:
    clock = VirtualClock(START, monotonic=100.0)
    assert (clock.wall(), clock.monotonic()) == (START, 100.0)
    assert (clock.wall(), clock.monotonic()) == (START, 100.0)  # no real time leaks in
    clock.advance(2.5)
    assert (clock.wall(), clock.monotonic()) == (START + timedelta(seconds=2.5), 102.5)
    clock.advance_to(110.0)
    assert (clock.wall(), clock.monotonic()) == (START + timedelta(seconds=10), 110.0)
    assert VirtualClock().wall() == DEFAULT_START


def test_timers_run_in_order_of_due_time_ties_in_registration_order() -> None:
    clock = VirtualClock(START)
    ran: list[tuple[str, float]] = []

    def note(name: str) -> None:
        ran.append((name, clock.monotonic()))  # each runs at its own due time

    clock.call_at(3.0, lambda: note("c"))
    clock.call_at(1.0, lambda: note("a1"))
    clock.call_later(1.0, lambda: note("a2"))
    clock.call_at(2.0, lambda: note("b"))
    clock.call_at(9.0, lambda: note("late"))
    clock.advance(3.0)
    assert ran == [("a1", 1.0), ("a2", 1.0), ("b", 2.0), ("c", 3.0)]
    assert clock.next_due() == 9.0


def test_a_timer_set_by_a_timer_runs_in_the_same_move_when_due() -> None:
    clock = VirtualClock(START)
    ran: list[float] = []
    clock.call_at(1.0, lambda: clock.call_later(0.5, lambda: ran.append(clock.monotonic())))
    clock.call_at(1.0, lambda: clock.call_at(0.0, lambda: ran.append(clock.monotonic())))
    clock.advance(2.0)
    assert ran == [1.0, 1.5]  # a timer in the past runs at once, at the time it was set


def test_a_cancelled_timer_never_runs() -> None:
    clock = VirtualClock(START)
    ran: list[str] = []
    timer = clock.call_later(1.0, lambda: ran.append("no"))
    timer.cancel()
    clock.advance(5.0)
    assert ran == [] and clock.next_due() is None


def test_monotonic_time_never_goes_back() -> None:
    clock = VirtualClock(START, monotonic=10.0)
    with pytest.raises(ValueError):
        clock.advance(-1.0)
    with pytest.raises(ValueError):
        clock.advance_to(9.0)
    with pytest.raises(ValueError):
        VirtualClock(datetime(2026, 1, 1))  # naive: whose clock?


def test_a_sleep_is_time_passing_with_the_timers_due_on_the_way() -> None:
    clock = VirtualClock(START)
    ran: list[float] = []
    clock.call_at(1.0, lambda: ran.append(clock.monotonic()))
    clock.call_at(7.0, lambda: ran.append(clock.monotonic()))
    assert clock.sleep_until(5.0) is False
    assert clock.monotonic() == 5.0 and ran == [1.0]
    assert clock.sleep_until(4.0) is False and clock.monotonic() == 5.0  # past: at once


def test_a_sleep_ends_at_the_timer_that_sets_its_event() -> None:
    clock = VirtualClock(START)
    event = threading.Event()
    ran: list[str] = []
    clock.call_at(2.0, lambda: ran.append("before"))
    clock.call_at(3.0, event.set)
    clock.call_at(3.0, lambda: ran.append("same time, after"))
    assert clock.sleep_until(60.0, event) is True
    assert clock.monotonic() == 3.0 and ran == ["before"]
    assert clock.sleep_until(60.0, event) is True and clock.monotonic() == 3.0  # already set
    clock.advance(1.0)
    assert ran == ["before", "same time, after"]


def test_a_sleep_inside_a_timer_never_moves_time_back() -> None:
    clock = VirtualClock(START)
    seen: list[float] = []
    clock.call_at(1.0, lambda: clock.sleep_until(8.0))  # a timer whose callback waits
    clock.call_at(4.0, lambda: seen.append(clock.monotonic()))
    clock.advance_to(2.0)
    assert seen == [4.0] and clock.monotonic() == 8.0


def test_a_wall_step_moves_the_wall_only() -> None:
    clock = VirtualClock(START, monotonic=0.0)
    clock.step_wall(-3600.0)
    assert clock.wall() == START - timedelta(hours=1) and clock.monotonic() == 0.0
    clock.advance(1.0)
    assert clock.wall() == START - timedelta(hours=1) + timedelta(seconds=1)


def test_a_skewed_view_shares_time_and_timers_with_its_own_wall() -> None:
    consul = VirtualClock(START)
    replica = consul.skewed(2.0)
    ran: list[float] = []
    replica.call_later(1.0, lambda: ran.append(consul.monotonic()))
    consul.advance(1.0)
    assert ran == [1.0] and replica.monotonic() == consul.monotonic()
    assert replica.wall() - consul.wall() == timedelta(seconds=2)
    replica.step_wall(-5.0)
    assert consul.wall() == START + timedelta(seconds=1)  # the other view's wall is its own
    assert replica.wall() - consul.wall() == timedelta(seconds=-3)


def test_both_clocks_are_clocks() -> None:
    clocks: list[Clock] = [VirtualClock(START), SystemClock()]
    assert all(clock.wall().tzinfo is not None for clock in clocks)


def test_the_system_clock_reads_the_agents_clock_and_the_monotonic_one() -> None:
    agent = AgentClock(monotonic=lambda: 60.0, wall=lambda: 0.0)
    agent.observe(10.0, 10.0, START)  # the agent said START at monotonic 10
    clock = SystemClock(agent, monotonic=lambda: 50.0)
    assert clock.wall() == START + timedelta(seconds=50)  # agent time: monotonic + offset
    assert clock.monotonic() == 50.0


def test_the_system_clock_wait_ends_on_its_event_or_its_deadline() -> None:
    clock = SystemClock()
    event = threading.Event()
    assert clock.sleep_until(clock.monotonic() - 1.0, event) is False  # past, not set
    event.set()
    assert clock.sleep_until(clock.monotonic() + 3600.0, event) is True  # set: at once
    other = threading.Event()
    setter = threading.Thread(target=other.set)
    setter.start()
    assert clock.sleep_until(clock.monotonic() + 120.0, other) is True  # set by another thread
    setter.join()
    assert clock.sleep_until(clock.monotonic() + 0.01) is False
