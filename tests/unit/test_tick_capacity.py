"""A replica's cap of concurrent runs (max_concurrent_runs, tick/capacity.py): the pure
decision as a table, then a fleet of real TickCores in virtual time on the in-memory Consul,
one of them at its cap: the ticks it passes on run on time elsewhere, once each."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest
from tick_fleet import KEYS, START, TIMINGS, WORKERS, Body, Held, at

from provision.errors import InputError
from provision.ledger.records import TickOutcome
from provision.ledger.turns import claim_order
from provision.runner.stop import StopRequest
from provision.schedule import parse_schedule
from provision.scheduler.on_core import CoreScheduler
from provision.spec import SpecError, parse_spec
from provision.tick.capacity import capacity_refusal
from provision.tick.clock import VirtualClock
from provision.tick.core import CoreJob, Identity, TickCore
from provision.tick.edge import Note, SkipReason
from provision.tick.memory import MemoryTickStore
from provision.tick.store import JobKeys
from provision.workers.config import config_record, load_worker_config


@pytest.mark.parametrize(
    ("running", "cap", "refused"),
    [
        (0, None, False),  # no cap: today's behaviour
        (500, None, False),
        (0, 1, False),
        (1, 1, True),  # the one run it may have goes on: the tick is passed on
        (1, 2, False),
        (2, 2, True),
        (3, 2, True),  # over it (the cap lowered by a reload while runs go on)
    ],
)
def test_a_replica_claims_only_below_its_cap(running: int, cap: int | None, refused: bool) -> None:
    why = capacity_refusal(running, cap)
    assert (why is not None) is refused
    if why is not None:
        assert f"{running} of {cap}" in why


LONG = CoreJob(JobKeys("long", "jobs/long/.lock"), parse_schedule("@every 1h"), TIMINGS, ("w1",))
SHORT = CoreJob(KEYS, parse_schedule("@every 10s"), TIMINGS, WORKERS)


class CapFleet:
    """Cores for WORKERS running LONG (w1's alone: it never ends) and SHORT (2 s a run), on one
    clock and store; `caps`: each worker's max_concurrent_runs."""

    def __init__(self, caps: dict[str, int], jobs: tuple[CoreJob, ...] = (LONG, SHORT)) -> None:
        self.clock = VirtualClock(START)
        self.store = MemoryTickStore(self.clock)
        self.runs: list[tuple[str, str, datetime, Body]] = []  # worker, job, tick, body
        self.notes: list[tuple[str, Note]] = []
        self.most: dict[str, int] = dict.fromkeys(WORKERS, 0)  # the most runs at once, each
        for worker in WORKERS:
            mine = tuple(job for job in jobs if worker in job.workers)
            core = TickCore(
                self.store,
                Held(self.clock),
                Identity(worker),
                mine,
                self._body_for(worker),
                lambda note, w=worker: self.notes.append((w, note)),
            )
            core.capacity = caps.get(worker)
            core.start()
            self._watch(worker, core)

    def _body_for(self, worker: str):  # type: ignore[no-untyped-def]
        def body(job: str, tick: datetime) -> Body:
            made = Body(self.clock, None if job.startswith("long") else 2.0, False)
            self.runs.append((worker, job, tick, made))
            return made

        return body

    def _watch(self, worker: str, core: TickCore) -> None:
        def look() -> None:
            self.most[worker] = max(self.most[worker], len(core.runs))
            self.clock.call_later(0.25, look)

        look()

    def ran(self, job: str, tick: datetime) -> list[str]:
        return [w for w, j, t, _ in self.runs if j == job and t == tick]

    def skips(self, worker: str, reason: SkipReason) -> list[Note]:
        return [n for w, n in self.notes if w == worker and n.skip is reason]


def test_ticks_a_replica_at_its_cap_passes_on_run_once_each_on_time_elsewhere() -> None:
    fleet = CapFleet({"w1": 1})
    fleet.clock.advance(305)
    assert fleet.ran("long", START) == ["w1"]  # w1's one run goes on throughout
    ticks = [at(10 * n) for n in range(1, 30)]
    for tick in ticks:
        ran = fleet.ran("report", tick)
        assert len(ran) == 1 and ran != ["w1"], (tick, ran)  # none lost, none twice, not on w1
        record = fleet.store.read_tick(KEYS, tick)[0]
        assert record is not None and record.outcome is TickOutcome.SUCCEEDED
    assert fleet.most["w1"] == 1
    # w1 said why at each turn it was first for, and wrote nothing of those ticks
    first_for = [t for t in ticks if claim_order(KEYS.name, t, WORKERS)[0] == "w1"]
    assert first_for  # the table is not empty: the case happens
    passed = {n.tick for n in fleet.skips("w1", SkipReason.AT_CAPACITY)}
    assert set(first_for) <= passed
    for tick in passed:  # taken by another: w1 wrote no skip or missed record of its own
        record = fleet.store.read_tick(KEYS, tick)[0] if tick is not None else None
        assert record is not None and record.worker != "w1", record
    # the next in the claim order ran it at its turn (one stagger later), not late
    for tick in first_for:
        record = fleet.store.read_tick(KEYS, tick)[0]
        assert record is not None and record.start_lag is not None and record.start_lag < 3.0


def test_a_replica_below_its_cap_claims_as_without_one() -> None:
    fleet = CapFleet({"w1": 2, "w2": 1, "w3": 1})
    fleet.clock.advance(305)
    ticks = [at(10 * n) for n in range(1, 30)]
    for tick in ticks:
        assert fleet.ran("report", tick) == [claim_order(KEYS.name, tick, WORKERS)[0]]
    assert not any(n.skip is SkipReason.AT_CAPACITY for _, n in fleet.notes)


def test_a_tick_the_whole_fleet_is_too_busy_for_is_missed_once_by_its_fate() -> None:
    longs = tuple(
        CoreJob(JobKeys(f"long-{w}", f"jobs/long-{w}/.lock"), LONG.schedule, TIMINGS, (w,))
        for w in WORKERS
    )
    fleet = CapFleet(dict.fromkeys(WORKERS, 1), (*longs, SHORT))
    fleet.clock.advance(125)
    assert all(fleet.ran(f"long-{w}", START) == [w] for w in WORKERS)
    for n in range(1, 8):  # windows closed (start_deadline 30 s) and fates looked at
        assert fleet.ran("report", at(10 * n)) == []
        record = fleet.store.read_tick(KEYS, at(10 * n))[0]
        assert record is not None and record.outcome is TickOutcome.MISSED
    for worker in WORKERS:  # each said it passed the ticks on; none wrote a skip
        assert fleet.skips(worker, SkipReason.AT_CAPACITY)


# -- where the cap comes from: the spec's worker, carried by its worker config ---------------------
SPEC = """
worker "busy" {
  max_concurrent_runs = 2
}
worker "free" {}
job "report" {
  prefix  = "locks/report/"
  workers = ["busy", "free"]
}
"""


def test_the_spec_s_cap_reaches_the_worker_config_and_only_where_it_is_set(tmp_path: Path) -> None:
    spec = parse_spec(SPEC, "s.hcl")
    assert (spec.worker("busy").max_concurrent_runs, spec.worker("free").max_concurrent_runs) == (
        2,
        None,
    )
    busy = config_record(spec, "busy", Path("/run/t"))
    free = config_record(spec, "free", Path("/run/t"))
    assert busy["max_concurrent_runs"] == 2 and "max_concurrent_runs" not in free
    path = tmp_path / "lockctl.json"
    path.write_text(json.dumps(busy))
    assert load_worker_config(path).max_concurrent_runs == 2
    path.write_text(json.dumps(free))
    assert load_worker_config(path).max_concurrent_runs is None
    path.write_text(json.dumps({**busy, "max_concurrent_runs": 0}))
    with pytest.raises(InputError, match="max_concurrent_runs: 0 is below 1"):
        load_worker_config(path)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("0", "0 is below 1"),
        ("-3", "must be a whole number, 1 or more, not an expression"),
        ('"2"', "must be a whole number, 1 or more, not a string"),
        ("1.5", "must be a whole number, 1 or more, not a decimal number"),
        ("true", "must be a whole number, 1 or more, not a boolean"),
    ],
)
def test_a_cap_must_be_a_whole_number_from_1_at_its_line(value: str, problem: str) -> None:
    job = 'job "j" {\n  prefix = "l/j/"\n  workers = ["w"]\n}\n'
    text = f'worker "w" {{\n  max_concurrent_runs = {value}\n}}\n{job}'
    with pytest.raises(SpecError) as caught:
        parse_spec(text, "s.hcl")
    expected = f's.hcl:2: worker "w".max_concurrent_runs: {problem}'
    assert [str(p) for p in caught.value.problems] == [expected]


def test_the_flag_wins_over_the_config_s_cap(tmp_path: Path) -> None:
    spec = parse_spec(SPEC, "s.hcl")
    path = tmp_path / "lockctl.json"
    path.write_text(json.dumps(config_record(spec, "busy", Path("/run/t"))))
    config = load_worker_config(path)
    from_config = CoreScheduler(config, StopRequest(), io.StringIO())
    from_flag = CoreScheduler(config, StopRequest(), io.StringIO(), capacity=1)
    assert (from_config._capacity(), from_flag._capacity()) == (2, 1)
    uncapped = replace(config, max_concurrent_runs=None)
    assert CoreScheduler(uncapped, StopRequest(), io.StringIO())._capacity() is None
