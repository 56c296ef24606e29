"""bench/scheduler.py's parsing of /proc and of its own timed calls (no cluster, no process)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.scheduler import (
    CpuTicks,
    IdleRun,
    _summarise,
    call_kind,
    floor_verdict,
    parse_stat,
    parse_status_kb,
)

# A real /proc/<pid>/stat line's shape, with a command name that holds spaces and parentheses.
STAT = (
    "4242 (lockctl (x) y) S 1 4242 4242 0 -1 4194560 5000 0 0 0 "
    "731 262 17 5 20 0 11 0 123456 300000000 8000 18446744073709551615"
)


def test_parse_stat_reads_utime_stime_and_the_children_after_the_name() -> None:
    assert parse_stat(STAT) == CpuTicks(own=731 + 262, children=17 + 5)


def test_parse_stat_of_this_process_is_consistent_with_os_times() -> None:
    before = os.times()
    ticks = parse_stat(Path("/proc/self/stat").read_text())
    hz = os.sysconf("SC_CLK_TCK")
    after = os.times()
    low = int((before.user + before.system) * hz) - 2  # each of utime, stime rounds down
    assert low <= ticks.own <= (after.user + after.system) * hz + 2


def test_parse_status_kb_finds_the_field() -> None:
    text = "Name:\tlockctl\nVmPeak:\t  300000 kB\nVmHWM:\t   31744 kB\nVmRSS:\t   30000 kB\n"
    assert parse_status_kb(text, "VmHWM") == 31744
    assert parse_status_kb(text, "VmRSS") == 30000
    with pytest.raises(ValueError, match="no VmSwap"):
        parse_status_kb(text, "VmSwap")


def test_parse_status_kb_of_this_process() -> None:
    assert parse_status_kb(Path("/proc/self/status").read_text(), "VmHWM") > 1000


@pytest.mark.parametrize(
    ("method", "path", "params", "body", "kind"),
    [
        ("PUT", "/v1/txn", None, [{"KV": {"Verb": "check-not-exists"}}, {"KV": {"Verb": "lock"}}],
         "claim (txn)"),
        ("PUT", "/v1/txn", None, [{"KV": {"Verb": "cas"}}, {"KV": {"Verb": "unlock"}}],
         "completion (txn)"),
        ("PUT", "/v1/txn", None, [{"KV": {"Verb": "delete"}}], "missed/prune (txn)"),
        ("GET", "/v1/kv/bench/x/ticks/2026-01-01T00:00:00Z", {}, None, "tick read (plan)"),
        ("GET", "/v1/kv/bench/x/ticks/", {"recurse": ""}, None, "ledger read (housekeeping)"),
        ("GET", "/v1/kv/bench/x/ticks/", {"keys": ""}, None, "ledger names (housekeeping)"),
        ("GET", "/v1/kv/bench/x/.lock", {"index": 7, "wait": "5s"}, None,
         "watch (blocking query)"),
        ("PUT", "/v1/session/renew/abc", None, None, "session renew"),
        ("GET", "/v1/agent/self", None, None, "GET /v1/agent/self"),
    ],
)  # fmt: skip
def test_call_kind_names_each_call_of_a_tick(
    method: str, path: str, params: dict[str, object] | None, body: object, kind: str
) -> None:
    assert call_kind(method, path, params, body) == kind


def test_summarise_splits_the_minute_tick_from_the_time_between_ticks() -> None:
    hz = os.sysconf("SC_CLK_TCK")
    start = 60.0 * 1000 + 30  # 30 s past a minute; the next minute tick 30 s in
    samples, used = [], 0
    for second in range(61):
        samples.append((start + second, CpuTicks(used, 0)))
        moment = start + second
        # 1 clock tick per 10 s between ticks; 5 * hz clock ticks in the second after the tick
        used += 5 * hz if 60.0 * 1001 <= moment < 60.0 * 1001 + 1 else (second % 10 == 0)
    samples[-1] = (samples[-1][0], CpuTicks(used, 3))
    run = _summarise(IdleRun(), samples, [])
    assert run.minute_ticks == 1
    assert run.seconds == 60
    assert run.between_ticks_percent == pytest.approx(100 / hz / 10, rel=0.25)
    assert run.tick_cpu_ms == [pytest.approx(5000, rel=0.05)]
    assert run.cpu_percent == pytest.approx(used / hz / 60 * 100)
    assert run.children_cpu_ms == pytest.approx(3 / hz * 1000)


def test_summarise_counts_the_runs_and_claims_in_the_window_only() -> None:
    samples = [(1000.0, CpuTicks(0, 0)), (1001.0, CpuTicks(1, 0))]
    events = [
        {"time": "1970-01-01T00:16:40.500+00:00", "event": "acquired", "waited_ms": 2.5},
        {"time": "1970-01-01T00:16:39.000+00:00", "event": "acquired", "waited_ms": 9.0},
        {"time": "1970-01-01T00:16:40.600+00:00", "event": "released"},
    ]
    run = _summarise(IdleRun(), samples, events)
    assert (run.runs, run.claim_ms) == (1, [2.5])


@pytest.mark.parametrize(
    ("work_ms", "floor_ms", "verdict"),
    [
        (3.5, 1.5, (True, True)),  # two writes fit in 5 ms, and the work is within 2.5 of them
        (4.0, 1.5, (True, False)),  # reachable, but 3 writes' worth: not met
        (7.0, 2.9, (False, True)),  # two writes take 5.8 ms: 5 ms is below the floor
        (11.5, 2.9, (False, False)),
    ],
)
def test_floor_verdict(work_ms: float, floor_ms: float, verdict: tuple[bool, bool]) -> None:
    assert floor_verdict(work_ms, floor_ms) == verdict
