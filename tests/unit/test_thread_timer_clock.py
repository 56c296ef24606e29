"""ThreadTimerClock (tick/clock.py): the real clocks with timers, run by one thread in order of
due time, as a VirtualClock runs them in a simulation. Asserted by order, never by duration."""

from __future__ import annotations

import threading

from provision.tick.clock import ThreadTimerClock

WAIT = 10.0  # seconds a test waits for what must happen (never reached when it works)


def _running(clock: ThreadTimerClock) -> threading.Thread:
    thread = threading.Thread(target=clock.run, daemon=True)
    thread.start()
    return thread


def _closed(clock: ThreadTimerClock, thread: threading.Thread) -> None:
    clock.close()
    thread.join(WAIT)
    assert not thread.is_alive()


def test_timers_run_in_order_of_due_time_ties_in_the_order_set() -> None:
    clock = ThreadTimerClock()
    ran: list[str] = []
    done = threading.Event()
    now = clock.monotonic()
    clock.call_at(now + 0.2, lambda: ran.append("late"))
    clock.call_at(now + 0.1, lambda: ran.append("tie-1"))
    clock.call_at(now + 0.1, lambda: ran.append("tie-2"))
    clock.call_at(now - 5, lambda: ran.append("past"))  # due already: at the first chance
    clock.call_at(now + 0.3, done.set)
    thread = _running(clock)
    assert done.wait(WAIT)
    _closed(clock, thread)
    assert ran == ["past", "tie-1", "tie-2", "late"]


def test_a_cancelled_timer_never_runs() -> None:
    clock = ThreadTimerClock()
    ran: list[str] = []
    done = threading.Event()
    now = clock.monotonic()
    clock.call_at(now + 0.05, lambda: ran.append("dropped")).cancel()
    clock.call_at(now + 0.1, done.set)
    thread = _running(clock)
    assert done.wait(WAIT)
    _closed(clock, thread)
    assert ran == []


def test_a_timer_set_from_another_thread_wakes_the_loop_and_runs_in_its_thread() -> None:
    """The loop waits for a far timer; one set meanwhile, due now, runs first, in the loop's
    thread (a body's reaper hands its news over this way)."""
    clock = ThreadTimerClock()
    seen: list[str | None] = []
    done = threading.Event()
    clock.call_at(clock.monotonic() + 3600, lambda: seen.append("far"))
    thread = _running(clock)

    def from_elsewhere() -> None:
        seen.append(threading.current_thread().name)
        done.set()

    setter = threading.Thread(target=lambda: clock.call_at(clock.monotonic(), from_elsewhere))
    setter.start()
    setter.join(WAIT)
    assert done.wait(WAIT)
    _closed(clock, thread)
    assert seen == [thread.name]


def test_a_callback_may_set_timers_and_close_ends_the_loop() -> None:
    clock = ThreadTimerClock()
    ran: list[int] = []

    def again(n: int) -> None:
        ran.append(n)
        if n < 5:
            clock.call_later(0.0, lambda: again(n + 1))
        else:
            clock.close()  # from inside a callback: the loop ends once it returns

    clock.call_later(0.0, lambda: again(1))
    clock.call_later(3600, lambda: ran.append(-1))
    thread = _running(clock)
    thread.join(WAIT)
    assert not thread.is_alive()
    assert ran == [1, 2, 3, 4, 5]
