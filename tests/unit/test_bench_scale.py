"""bench/scale.py's pure part: oracle lines and ledger records -> ticks run, doubled, missing,
unclaimed, start lag. No cluster."""

from __future__ import annotations

import os
from datetime import datetime, timezone

import pytest

from bench import scale
from bench.scale import SCENARIOS, Run, judge, parse_oracle, percentile, tick_slots
from provision.schedule import parse_schedule

EVERY_10S = parse_schedule("@every 10s")
T0 = datetime(2026, 12, 1, 13, 0, 0, tzinfo=timezone.utc).timestamp()


def name(offset: int) -> str:
    moment = datetime.fromtimestamp(T0 + offset, timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_parse_oracle_keeps_whole_lines_only() -> None:
    text = (
        f"{name(0)} worker-1 {T0 + 0.25:.9f}\n"
        "torn line\n"
        f"{name(10)} worker-2 not-a-time\n"
        f"{name(10)} worker-3 {T0 + 10.5:.9f}\n"
    )
    runs = parse_oracle("a", text)
    assert [(r.tick, r.worker) for r in runs] == [(name(0), "worker-1"), (name(10), "worker-3")]
    assert runs[0].start == pytest.approx(T0 + 0.25)


def test_tick_slots_are_the_instants_inside_the_window_with_their_claim_window() -> None:
    slots = tick_slots(["a", "b"], EVERY_10S, 300.0, T0 - 0.5, T0 + 30)
    assert [(s.job, s.tick.timestamp() - T0) for s in slots] == [
        ("a", 0),
        ("a", 10),
        ("a", 20),
        ("b", 0),
        ("b", 10),
        ("b", 20),
    ]
    assert {s.closes - s.tick.timestamp() for s in slots} == {10.0}  # cut at the next tick


def test_tick_slots_claim_window_is_the_start_deadline_when_shorter() -> None:
    (slot,) = tick_slots(["a"], parse_schedule("@hourly"), 300.0, T0, T0 + 1)
    assert slot.closes == T0 + 300


def test_judge_counts_each_kind_of_tick() -> None:
    slots = tick_slots(["a"], EVERY_10S, 300.0, T0, T0 + 60)  # 0, 10, .., 50
    runs = [
        Run("a", name(0), "worker-1", T0 + 0.2),
        Run("a", name(10), "worker-2", T0 + 10.4),
        Run("a", name(10), "worker-3", T0 + 10.9),  # doubled
        Run("a", name(20), "worker-1", T0 + 21.0),
    ]
    records = {
        ("a", name(0)): "succeeded",
        ("a", name(20)): "succeeded",
        ("a", name(30)): "missed",
        ("a", name(40)): "interrupted",  # claimed, the run never wrote its line
    }
    figures = judge(slots, runs, records, end=T0 + 55)
    assert figures.scheduled == 6
    assert figures.ran == 3
    assert figures.doubled == 1
    assert figures.recorded_missed == 1
    assert figures.claimed_no_run == 1
    assert figures.claimed == 4  # 0, 10, 20 (run) and 40 (a claim record)
    assert figures.missing == 0
    assert figures.open == 1  # 50: nothing yet, its window still open at 55
    assert figures.unclaimed == 1  # 30; 50 is younger than UNCLAIMED_AGE at the end
    assert figures.lags == pytest.approx([0.2, 0.4, 1.0])


def test_judge_missing_needs_a_closed_window_and_no_record() -> None:
    slots = tick_slots(["a", "b"], EVERY_10S, 300.0, T0, T0 + 10)  # tick 0 of each
    figures = judge(slots, [], {("b", name(0)): "missed"}, end=T0 + 10)
    assert (figures.missing, figures.recorded_missed, figures.unclaimed) == (1, 1, 2)
    still_open = judge(slots[:1], [], {}, end=T0 + 9.9)
    assert (still_open.missing, still_open.open, still_open.unclaimed) == (0, 1, 0)


def test_judge_doubled_counts_runs_outside_the_window_too() -> None:
    runs = [Run("a", name(-10), "worker-1", T0 - 9.8), Run("a", name(-10), "worker-2", T0 - 9.7)]
    figures = judge([], runs, {}, end=T0 + 10)
    assert figures.doubled == 1
    assert figures.scheduled == 0


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile([3.0], 99) == 3.0
    assert percentile([], 50) is None


def test_targets_read_the_figures() -> None:
    fleet = {t.key: t for t in SCENARIOS["fleet"].targets}
    assert fleet["raft_per_tick"].met({"raft_per_tick": 2.2}) is True
    assert fleet["raft_per_tick"].met({"raft_per_tick": 3.56}) is False
    assert fleet["start_lag_p99_s"].met({"start_lag_p99_s": 1.0}) is False
    assert fleet["doubled"].met({}) is None


def test_cpu_breakdown_splits_the_ticks_cpu_by_part() -> None:
    hz = os.sysconf("SC_CLK_TCK")

    def sample(server_ms: int, client_ms: int, own_ms: int, jobs_ms: int) -> scale.Sample:
        """Clock ticks so far, given in ms (multiples of 10 ms: whole ticks at 100 Hz)."""
        procs = {"worker-1": scale.ProcSample(own_ms * hz // 1000, jobs_ms * hz // 1000, 10, 1)}
        agents = {"server": server_ms * hz // 1000, "client": client_ms * hz // 1000}
        return scale.Sample(0.0, 3, 1, 0.0, procs, 0, agents)

    # over 100 ticks: the servers spent 4 ms per tick, the clients 1, lockctl 5, the jobs 3
    parts = scale.cpu_breakdown(sample(0, 0, 0, 0), sample(400, 100, 500, 300), 100)
    assert parts["cpu_ms_consul_servers"] == 4.0 and parts["cpu_ms_consul_clients"] == 1.0
    assert parts["cpu_ms_lockctl"] == 5.0 and parts["cpu_ms_jobs"] == 3.0
    assert parts["cpu_ms_without_lockctl"] == 8.0
    # 300 jobs' ticks at once at 8 ms each: 2.4 CPU-s over the cores; none with a jitter
    assert scale.burst_cpu_floor(parts, 300, 0.0) == round(2.4 / (os.cpu_count() or 1), 3)
    assert scale.burst_cpu_floor(parts, 300, 5.0) is None
    assert scale.burst_cpu_floor({}, 300, 0.0) is None
