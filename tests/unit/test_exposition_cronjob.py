"""What kube-state-metrics has for a CronJob, on `lockctl schedule --listen`'s /metrics: the next
tick per job, paused per job (0/1), and an info metric with the schedule and the timezone; from
the counts the loop and the trigger watch keep (scheduler/counts.py), as tables."""

from __future__ import annotations

import io
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest
from prometheus_client.parser import text_string_to_metric_families

from provision.scheduler import loop
from provision.scheduler.counts import CountsSnapshot, LoopCounts
from provision.scheduler.exposition import metrics_registry, render
from provision.scheduler.loop import CountingEventLog, JobTicks
from provision.scheduler.triggers import paused_jobs
from provision.workers.config import JobConfig, JobTimings

TICK = datetime(2026, 12, 1, 13, 0, 6, tzinfo=timezone.utc)  # a tick of @every 3s
NEW = ("lockctl_job_next_tick_timestamp_seconds", "lockctl_job_paused", "lockctl_job_info")
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _samples(snapshots: list[tuple[str, CountsSnapshot]], accept: str | None = None) -> Samples:
    """The new metrics' samples as a scrape sees them: (name, sorted labels) -> value."""
    body, _ = render(metrics_registry(lambda: snapshots, "worker-1"), accept)
    text = body.decode()
    families = text_string_to_metric_families(text.replace("# EOF\n", ""))
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in families
        for s in family.samples
        if s.name in NEW
    }


def _labels(job: str, **more: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"job": job, "worker": "worker-1", **more}.items()))


@pytest.mark.parametrize(
    ("snapshot", "expected"),
    [
        # a loop not made yet by a scheduler (its counts alone): paused 0, nothing else known
        (CountsSnapshot(), {("lockctl_job_paused", _labels("a")): 0.0}),
        (
            replace(CountsSnapshot(), schedule="@every 3s", next_tick=1796130006.0),
            {
                ("lockctl_job_next_tick_timestamp_seconds", _labels("a")): 1796130006.0,
                ("lockctl_job_paused", _labels("a")): 0.0,
                ("lockctl_job_info", _labels("a", schedule="@every 3s", timezone="UTC")): 1.0,
            },
        ),
        (
            replace(
                CountsSnapshot(),
                schedule="30 2 * * 1-5",
                timezone="Europe/Berlin",
                next_tick=1796175000.0,
                paused=True,
            ),
            {
                ("lockctl_job_next_tick_timestamp_seconds", _labels("a")): 1796175000.0,
                ("lockctl_job_paused", _labels("a")): 1.0,
                (
                    "lockctl_job_info",
                    _labels("a", schedule="30 2 * * 1-5", timezone="Europe/Berlin"),
                ): 1.0,
            },
        ),
        # label values are escaped by the library, never cut or read back
        (
            replace(CountsSnapshot(), schedule='@every 1m "x"\n', paused=True),
            {
                ("lockctl_job_paused", _labels("a")): 1.0,
                ("lockctl_job_info", _labels("a", schedule='@every 1m "x"\n', timezone="UTC")): 1.0,
            },
        ),
    ],
)
def test_the_cronjob_metrics_say_what_the_snapshot_holds(
    snapshot: CountsSnapshot, expected: Samples
) -> None:
    assert _samples([("a", snapshot)]) == expected


def test_each_job_has_its_own_series_and_openmetrics_says_the_same() -> None:
    a = replace(CountsSnapshot(), schedule="@hourly", next_tick=1796133600.0)
    b = replace(CountsSnapshot(), schedule="@every 2s", paused=True, next_tick=1796130008.0)
    text = _samples([("a", a), ("b", b)])
    assert text[("lockctl_job_paused", _labels("b"))] == 1.0
    assert text[("lockctl_job_paused", _labels("a"))] == 0.0
    assert text[("lockctl_job_next_tick_timestamp_seconds", _labels("a"))] == 1796133600.0
    assert _samples([("a", a), ("b", b)], "application/openmetrics-text") == text


def test_the_info_metric_is_a_gauge_in_the_text_format_and_info_in_openmetrics() -> None:
    snapshots = [("a", replace(CountsSnapshot(), schedule="@hourly"))]
    registry = metrics_registry(lambda: snapshots, "worker-1")
    assert "# TYPE lockctl_job_info gauge\n" in render(registry, None)[0].decode()
    openmetrics = render(registry, "application/openmetrics-text")[0].decode()
    assert "# TYPE lockctl_job info\n" in openmetrics


# -- the counts: kept by the loop and the trigger watch ----------------------------------------
@pytest.mark.parametrize(
    ("calls", "schedule", "zone", "next_tick", "paused"),
    [
        ((), None, "UTC", None, False),
        ((("schedule_known", "@every 3s", "UTC"),), "@every 3s", "UTC", None, False),
        (
            (("schedule_known", "@hourly", "UTC"), ("schedule_known", "0 2 * * *", "Asia/Tokyo")),
            "0 2 * * *",  # a reload's loop says the new one
            "Asia/Tokyo",
            None,
            False,
        ),
        ((("tick_planned", 5.0), ("tick_planned", 8.0)), None, "UTC", 8.0, False),
        ((("pause_known", True),), None, "UTC", None, True),
        ((("pause_known", True), ("pause_known", False)), None, "UTC", None, False),
    ],
)
def test_the_loop_counts_keep_the_schedule_the_next_tick_and_the_pause(
    calls: tuple[tuple[object, ...], ...],
    schedule: str | None,
    zone: str,
    next_tick: float | None,
    paused: bool,
) -> None:
    counts = LoopCounts()
    for name, *args in calls:
        getattr(counts, str(name))(*args)
    snap = counts.snapshot()
    assert (snap.schedule, snap.timezone, snap.next_tick, snap.paused) == (
        schedule,
        zone,
        next_tick,
        paused,
    )


def _job(schedule: str = "@every 3s", zone: str = "UTC") -> JobConfig:
    timings = JobTimings(15.0, 15.0, 5.0, 5.0, 0.0)
    return JobConfig("job-a", "locks/a/.lock", timings, schedule, zone, command=("true",))


def _loop(job: JobConfig, counts: LoopCounts, now: datetime) -> JobTicks:
    events = CountingEventLog(job.name, "worker-1", io.StringIO(), counts)
    return JobTicks(None, job, "worker-1", events, None, wall=lambda: now, counts=counts)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("schedule", "zone", "had", "now", "planned"),
    [
        ("@every 3s", "UTC", TICK, TICK + timedelta(seconds=1), TICK + timedelta(seconds=3)),
        ("@every 3s", "UTC", None, TICK + timedelta(seconds=1), TICK),  # still claimable: it
        (
            "0 2 * * *",
            "Europe/Berlin",
            None,
            datetime(2026, 12, 1, 13, 0, tzinfo=timezone.utc),
            datetime(2026, 12, 2, 1, 0, tzinfo=timezone.utc),  # 02:00 in Berlin (CET)
        ),
    ],
)
def test_a_loop_says_its_schedule_at_once_and_its_next_tick_when_it_plans_it(
    schedule: str, zone: str, had: datetime | None, now: datetime, planned: datetime
) -> None:
    counts = LoopCounts()
    ticks = _loop(_job(schedule, zone), counts, now)
    ticks._last_tick = had  # the tick the loop ran last, if any
    assert (counts.snapshot().schedule, counts.snapshot().timezone) == (schedule, zone)
    assert counts.snapshot().next_tick is None
    assert ticks.next_turn().tick == planned
    assert counts.snapshot().next_tick == planned.timestamp()


class _OneSession:
    def session_for(self, timings: JobTimings) -> str:
        return "session-1"

    def subscribe(self, listener: object) -> None:
        pass


def test_while_a_tick_runs_the_next_tick_is_the_one_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counts = LoopCounts()
    events = CountingEventLog("job-a", "worker-1", io.StringIO(), counts)
    ticks = JobTicks(None, _job(), "worker-1", events, None, counts=counts, sessions=_OneSession())  # type: ignore[arg-type]
    seen: list[float | None] = []

    def run(*args: object, **kwargs: object) -> None:  # the run, as the listener sees it
        seen.append(counts.snapshot().next_tick)
        raise RuntimeError("the run ends here")

    monkeypatch.setattr(loop, "scheduled_run", run)
    ticks.run_tick(TICK)
    assert seen == [(TICK + timedelta(seconds=3)).timestamp()]


@pytest.mark.parametrize(
    ("keys", "jobs", "paused"),
    [
        ((), ("a",), set()),
        ((("lockctl/control/a/paused", b'{"format": 1, "by": "ops"}'),), ("a", "b"), {"a"}),
        # a value that is not a note still pauses: the key's existence does (ledger/control.py)
        ((("lockctl/control/a/paused", b"garbage"),), ("a",), {"a"}),
        ((("lockctl/control/a/paused", None),), ("a",), {"a"}),
        # the pauses resumed, a trigger, another job's key, a deeper key: not paused
        (
            (
                ("lockctl/control/a/pauses", b"{}"),
                ("lockctl/control/a/trigger", b"{}"),
                ("lockctl/control/c/paused", b"{}"),
                ("lockctl/control/b/x/paused", b"{}"),
                ("locks/a/paused", b"{}"),
            ),
            ("a", "b"),
            set(),
        ),
    ],
)
def test_the_trigger_watch_says_which_jobs_are_paused(
    keys: tuple[tuple[str, bytes | None], ...], jobs: tuple[str, ...], paused: set[str]
) -> None:
    assert paused_jobs(keys, jobs) == paused
