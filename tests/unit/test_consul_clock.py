"""Consul's clock as lockctl learns it (provision/consul/clock.py) as tables: the bounds an
answer's Date gives, how answers narrow them, a step of the agent's clock, and a step of this
host's wall clock, which moves nothing. Injected clocks: no Consul, no sleeping."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from provision.consul.clock import AgentClock, OffsetBounds, WallSteps, answer_bounds, learn

UTC = timezone.utc
EPOCH = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC).timestamp()  # the agent's Date, whole s


PINNED = [(100.5, 100.55, 0), (100.6, 100.65, 1)]


def test_one_answer_bounds_the_offset_by_its_round_trip_and_the_dates_second() -> None:
    # sent at monotonic 100.0, received at 100.2, Date 12:00:00: the agent showed
    # [12:00:00, 12:00:01) at some moment of [100.0, 100.2]
    bounds = answer_bounds(100.0, 100.2, EPOCH)
    assert bounds == OffsetBounds(EPOCH - 100.2, EPOCH + 1 - 100.0)
    assert bounds.width == pytest.approx(1.2)


@pytest.mark.parametrize(
    ("answers", "low", "width", "jump"),
    [
        # (sent, received, Date - EPOCH) from an agent whose clock is EPOCH at monotonic 99.6
        ([(100.0, 100.1, 0)], EPOCH - 100.1, 1.1, None),
        # just before and just after its Date turned: pinned within a tenth of a second
        ([(100.5, 100.55, 0), (100.6, 100.65, 1)], EPOCH - 99.65, 0.15, None),
        ([(100.6, 100.65, 1), (100.5, 100.55, 0)], EPOCH - 99.65, 0.15, None),  # any order
        ([(100.5, 100.55, 0), (100.6, 100.65, 1), (100.0, 100.1, 0)], EPOCH - 99.65, 0.15, None),
        # the agent's clock stepped 40 s forward: start again from the new answer, and say so
        ([*PINNED, (200.0, 200.05, 140)], EPOCH + 140 - 200.05, 1.05, 39.45),
        ([*PINNED, (200.0, 200.05, 60)], EPOCH + 60 - 200.05, 1.05, -39.35),  # and back
        # a contradiction under a second (drift) is followed, unsaid
        ([*PINNED, (200.0, 200.05, 101)], EPOCH + 101 - 200.05, 1.05, None),
    ],
)
def test_answers_narrow_the_bounds_and_a_contradiction_is_a_step(answers, low, width, jump):
    known, jumps = None, []
    for sent, received, date in answers:
        known, step = learn(known, answer_bounds(sent, received, EPOCH + date))
        jumps.append(step)
    assert known is not None
    assert known.low == pytest.approx(low)
    assert known.width == pytest.approx(width)
    assert jumps[-1] == (None if jump is None else pytest.approx(jump, abs=0.1))


class Clocks:
    """An injected monotonic and wall clock; `step` moves only the wall one, as a host step."""

    def __init__(self) -> None:
        self.mono, self.wall = 1000.0, EPOCH + 0.3  # the host 0.3 s ahead of the agent

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds

    def step(self, seconds: float) -> None:
        self.wall += seconds


def agent_date(clocks: Clocks, agent_offset: float) -> datetime:
    """The Date the agent writes now, its clock `agent_offset` from EPOCH at mono 1000."""
    shown = EPOCH + agent_offset + (clocks.mono - 1000.0)
    return datetime.fromtimestamp(int(shown), UTC)


def test_the_clock_is_this_hosts_until_an_answer_then_the_agents_whatever_the_host_does():
    clocks = Clocks()
    clock = AgentClock(lambda: clocks.mono, lambda: clocks.wall)
    assert not clock.known and clock() == datetime.fromtimestamp(clocks.wall, UTC)
    for _ in range(12):  # answers at different moments of the agent's second
        clocks.advance(0.37)
        clock.observe(clocks.mono - 0.01, clocks.mono, agent_date(clocks, 0.0))
    truth = datetime.fromtimestamp(EPOCH + (clocks.mono - 1000.0), UTC)
    assert clock.known and clock() <= truth  # the earliest it may show: never ahead of it
    assert truth - clock() < timedelta(seconds=0.1)
    assert clock.host_ahead() == pytest.approx(0.3, abs=0.1)
    clocks.step(40)  # an operator's `date -s`: the host's wall clock only
    assert truth - clock() < timedelta(seconds=0.1)  # no decision moves
    assert clock.host_ahead() == pytest.approx(40.3, abs=0.1)
    assert clock.take_steps() == []  # the agent's clock did not step


def test_a_step_of_the_agents_clock_is_followed_and_taken_once():
    clocks = Clocks()
    clock = AgentClock(lambda: clocks.mono, lambda: clocks.wall)
    for _ in range(6):
        clocks.advance(0.37)
        clock.observe(clocks.mono - 0.01, clocks.mono, agent_date(clocks, 0.0))
    clocks.advance(1.0)
    clock.observe(clocks.mono - 0.01, clocks.mono, agent_date(clocks, -65.0))
    truth = datetime.fromtimestamp(EPOCH - 65 + (clocks.mono - 1000.0), UTC)
    assert timedelta(0) <= truth - clock() <= timedelta(seconds=1.01)
    [jump] = clock.take_steps()
    assert jump == pytest.approx(-65, abs=1.1)
    assert clock.take_steps() == []


def test_an_answer_without_a_date_teaches_nothing():
    clocks = Clocks()
    clock = AgentClock(lambda: clocks.mono, lambda: clocks.wall)
    clock.observe(999.0, 1000.0, None)
    assert not clock.known and clock.uncertainty is None and clock.host_ahead() is None


@pytest.mark.parametrize(
    ("moves", "steps"),
    [
        ([("advance", 5.0)], [None]),  # time passes: both clocks move together
        ([("slew", 0.0005), ("slew", 0.0005)], [None, None]),  # NTP's slew, 0.5 ms a second
        ([("step", 40.0)], [40.0]),  # `date -s`, a VM resumed
        ([("step", -3.0), ("advance", 1.0)], [-3.0, None]),  # said once
        ([("step", 0.4)], [None]),  # under STEP: a slew or noise
    ],
)
def test_a_step_of_the_wall_clock_against_the_monotonic_one(moves, steps) -> None:
    clocks = Clocks()
    watch = WallSteps(lambda: clocks.mono, lambda: clocks.wall)
    seen = []
    for move, seconds in moves:
        if move == "advance":
            clocks.advance(seconds)
        else:
            clocks.step(seconds)
            clocks.advance(1.0 if move == "slew" else 0.0)
        seen.append(watch.step())
    assert seen == [None if s is None else pytest.approx(s) for s in steps]
