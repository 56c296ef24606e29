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


# -- a call made aside ---------------------------------------------------------------------------
def test_a_call_aside_lets_the_other_timers_run_until_its_answer_comes() -> None:
    """A callback's call to a Consul that does not answer yet: a fence due meanwhile runs, in
    the loop's thread, before the call's answer reaches the callback."""
    clock = ThreadTimerClock()
    order: list[str] = []
    answer_now = threading.Event()
    done = threading.Event()

    def slow_call() -> str:
        assert answer_now.wait(WAIT)
        return "answer"

    def fence() -> None:
        order.append(f"fence in {threading.current_thread().name}")
        answer_now.set()  # the answer comes after the fence ran: never before, whatever load

    def turn() -> None:
        clock.call_at(clock.monotonic(), fence)
        order.append(clock.aside(slow_call))
        done.set()

    clock.call_at(clock.monotonic(), turn)
    thread = _running(clock)
    assert done.wait(WAIT)
    _closed(clock, thread)
    assert order == [f"fence in {thread.name}", "answer"]


def test_a_call_aside_raises_what_the_call_raised() -> None:
    clock = ThreadTimerClock()
    caught: list[BaseException] = []
    done = threading.Event()

    def refused() -> None:
        raise PermissionError("403")

    def turn() -> None:
        try:
            clock.aside(refused)
        except PermissionError as exc:
            caught.append(exc)
        done.set()

    clock.call_at(clock.monotonic(), turn)
    thread = _running(clock)
    assert done.wait(WAIT)
    _closed(clock, thread)
    assert [str(exc) for exc in caught] == ["403"]


def test_calls_aside_nest_up_to_the_bound_then_run_inline() -> None:
    """Each waiting call lets the next callback run, which makes a call of its own: at most
    MAX_ASIDE wait at once, each on a worker; the next ones run inline, in the loop's thread
    (the first of them lets every waiting call answer)."""
    clock = ThreadTimerClock()
    bound = ThreadTimerClock.MAX_ASIDE
    where: dict[int, str] = {}
    release, done = threading.Event(), threading.Event()
    loops: list[str] = []  # the loop thread's name, as the first turn sees it

    def call(n: int) -> None:
        where[n] = threading.current_thread().name
        if where[n] == loops[0]:
            release.set()
        else:
            assert release.wait(WAIT)

    def turn(n: int) -> None:
        loops.append(threading.current_thread().name)
        if n < bound + 2:
            clock.call_at(clock.monotonic(), lambda: turn(n + 1))
        clock.aside(lambda: call(n))
        if n == 1:
            done.set()

    clock.call_at(clock.monotonic(), lambda: turn(1))
    loop = _running(clock)
    assert done.wait(WAIT)
    _closed(clock, loop)
    assert sorted(where) == list(range(1, bound + 3))
    assert all(where[n] != loop.name for n in range(1, bound + 1))
    assert where[bound + 1] == where[bound + 2] == loop.name


def test_a_call_aside_from_outside_the_loop_runs_inline() -> None:
    clock = ThreadTimerClock()
    assert clock.aside(threading.current_thread) is threading.current_thread()


def test_a_prompt_timer_runs_ahead_of_a_backlog_due_before_it() -> None:
    """Callbacks due before it and not run yet (a burst's backlog) do not hold a prompt timer
    back: once due, it runs next (a renewal, or its answer)."""
    clock = ThreadTimerClock()
    ran: list[str] = []
    done = threading.Event()
    now = clock.monotonic()
    for n in range(3):
        clock.call_at(now - 10 + n, lambda n=n: ran.append(f"backlog-{n}"))
    clock.prompt_at(now - 1, lambda: ran.append("prompt"))
    clock.call_at(now - 0.5, done.set)
    thread = _running(clock)
    assert done.wait(WAIT)
    _closed(clock, thread)
    assert ran == ["prompt", "backlog-0", "backlog-1", "backlog-2"]


def test_a_call_sent_is_made_off_the_loop_and_answered_in_it_with_its_send_time() -> None:
    """send_at: the call runs on another thread; its answer (a value, or the exception it
    raised) comes back to the loop's thread with the time it was sent."""
    clock = ThreadTimerClock()
    made_in: list[int] = []
    answers: list[tuple[float, int | str, int]] = []
    done = threading.Event()

    def call(value: int) -> int:
        made_in.append(threading.get_ident())
        if value < 0:
            raise ValueError("refused")
        return value

    def answered(sent: float, answer: object) -> None:
        try:
            said: int | str = answer()  # type: ignore[operator]
        except ValueError as exc:
            said = str(exc)
        answers.append((sent, said, threading.get_ident()))
        if len(answers) == 2:
            done.set()

    now = clock.monotonic()
    clock.send_at(now, lambda: call(7), answered)
    clock.send_at(now, lambda: call(-1), answered)
    thread = _running(clock)
    assert done.wait(WAIT)
    _closed(clock, thread)
    assert sorted(str(said) for _, said, _ in answers) == ["7", "refused"]
    assert all(sent >= now for sent, _, _ in answers)
    assert {loop for _, _, loop in answers} == {thread.ident}
    assert thread.ident not in made_in and len(made_in) == 2
