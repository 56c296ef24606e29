"""How often a job loop reads before its claim and housekeeps after its run
(provision/scheduler/cadence.py): the rules as a table, then the state they keep."""

from __future__ import annotations

from dataclasses import replace

import pytest

from provision.scheduler.cadence import (
    CLOCK_CHECK_EVERY,
    HOUSEKEEP_EVERY,
    Cadence,
    TickWork,
    after_read,
    after_run,
    starting,
    tick_work,
)

NOW = 10_000.0  # monotonic
STEADY = Cadence(  # a loop that housekept and compared the clocks lately
    clocks_read_at=NOW - 60, clocks_agree=True, housekept_at=NOW - 20
)
LATER = NOW - 60 + CLOCK_CHECK_EVERY  # when STEADY's clocks are due to be compared again


@pytest.mark.parametrize(
    ("cadence", "now", "work", "why"),
    [
        (Cadence(), NOW, TickWork(True, True), "the loop's first tick: both"),
        (STEADY, NOW, TickWork(False, False), "steady state: claim and completion only"),
        (replace(STEADY, clocks_agree=False), NOW, TickWork(True, False),
         "the clocks disagreed at the last read: read at every tick"),
        (replace(STEADY, housekept_at=LATER - 20), LATER, TickWork(True, False),
         "the clocks compared again every CLOCK_CHECK_EVERY"),
        (replace(STEADY, housekept_at=LATER - 20), LATER - 2, TickWork(False, False),
         "not before"),
        (STEADY, STEADY.housekept_at + HOUSEKEEP_EVERY, TickWork(False, True),
         "housekeeping once every HOUSEKEEP_EVERY"),
        (STEADY, STEADY.housekept_at + HOUSEKEEP_EVERY - 0.5, TickWork(False, True),
         "a minute schedule's next run, a little under 60 s later, still housekeeps"),
        (STEADY, STEADY.housekept_at + HOUSEKEEP_EVERY - 5, TickWork(False, False),
         "well within the interval: not yet"),
        (replace(STEADY, housekept_at=None), NOW, TickWork(False, True), "never housekept"),
    ],
)  # fmt: skip
def test_tick_work(cadence: Cadence, now: float, work: TickWork, why: str) -> None:
    assert tick_work(cadence, now) == work, why


def test_a_read_records_when_and_whether_the_clocks_agreed() -> None:
    read = after_read(Cadence(), NOW, clocks_agree=True)
    assert (read.clocks_read_at, read.clocks_agree) == (NOW, True)
    assert not after_read(read, NOW + 1, clocks_agree=False).clocks_agree


def test_a_claimed_run_housekept_when_asked() -> None:
    ran = after_run(Cadence(), NOW, TickWork(True, True), claimed=True)
    assert ran.housekept_at == NOW
    later = after_run(ran, NOW + 5, TickWork(False, False), claimed=True)
    assert later.housekept_at == NOW


def test_a_run_that_did_not_claim_changes_nothing() -> None:
    # skipped (another replica has the tick), missed, Consul refused: no record of ours and no
    # housekeeping done (whether the previous tick is missed, the next claim here reads)
    assert after_run(Cadence(), NOW, TickWork(True, True), claimed=False) == Cadence()
    assert tick_work(Cadence(), NOW + 1).housekeep


def test_a_loop_of_a_2s_job_reads_and_housekeeps_a_small_share_of_its_ticks() -> None:
    """Thirty minutes of an `@every 2s` job, every tick run on this replica."""
    cadence, reads, housekeeps, ticks = Cadence(), 0, 0, 900
    for n in range(ticks):
        now = NOW + 2 * n
        work = tick_work(cadence, now)
        if work.read_first:
            reads += 1
            cadence = after_read(cadence, now, clocks_agree=True)
        housekeeps += work.housekeep
        cadence = after_run(cadence, now + 0.05, work, claimed=True)
    assert reads == 6  # once every 5 minutes, not 900 times
    assert housekeeps == 30  # once a minute


def test_a_housekeeping_that_left_work_is_done_again_at_the_next_run() -> None:
    """It failed, or a tick it could not call missed yet has no record: the next run housekeeps,
    not the one a minute later."""
    ran = after_run(STEADY, NOW, TickWork(False, True), claimed=True, again=True)
    assert tick_work(ran, NOW + 1).housekeep
    settled = after_run(ran, NOW + 1, TickWork(False, True), claimed=True)
    assert not tick_work(settled, NOW + 2).housekeep


def test_a_new_loops_first_housekeeping_comes_within_housekeep_every_spread_by_job() -> None:
    firsts = []
    for name in (f"job-{i:03d}" for i in range(300)):
        cadence = starting(NOW, name)
        assert cadence == starting(NOW, name)  # the same at every start and on every replica
        assert not tick_work(cadence, NOW).read_first or cadence.clocks_read_at is None
        first = next(t for t in range(0, 120) if tick_work(cadence, NOW + t).housekeep)
        assert first <= HOUSEKEEP_EVERY
        firsts.append(first)
    # spread over the interval: no second of it holds more than a tenth of the jobs
    assert max(firsts.count(second) for second in set(firsts)) < 30
    assert min(firsts) < 10 and max(firsts) > HOUSEKEEP_EVERY - 10
