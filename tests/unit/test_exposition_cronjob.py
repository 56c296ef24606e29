"""What kube-state-metrics has for a CronJob, on `lockctl schedule --listen`'s /metrics: the next
tick per job, paused per job (0/1), and an info metric with the schedule and the timezone; from
what the scheduler tells its report (scheduler/report.py) and what the trigger watch sees of the
control keys, as tables."""

from __future__ import annotations

import io
from dataclasses import dataclass

import pytest
from prometheus_client.parser import text_string_to_metric_families

from provision.scheduler.listen import render
from provision.scheduler.report import CoreReport
from provision.scheduler.triggers import paused_jobs

NEW = ("lockctl_job_next_tick_timestamp_seconds", "lockctl_job_paused", "lockctl_job_info")
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass(frozen=True)
class Known:
    """What the scheduler told the report of one job (None: not told)."""

    schedule: str = "@every 3s"
    timezone: str = "UTC"
    next_tick: float | None = None
    paused: bool = False


def _report(jobs: dict[str, Known]) -> CoreReport:
    report = CoreReport("worker-1", io.StringIO())
    for name, known in jobs.items():
        report.schedule_known(name, known.schedule, known.timezone)
        if known.next_tick is not None:
            report.next_tick(name, known.next_tick)
    report.paused([name for name, known in jobs.items() if known.paused])
    return report


def _samples(jobs: dict[str, Known], accept: str | None = None) -> Samples:
    """The CronJob metrics' samples as a scrape sees them: (name, sorted labels) -> value."""
    body, _ = render(_report(jobs).registry, accept)
    families = text_string_to_metric_families(body.decode().replace("# EOF\n", ""))
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in families
        for s in family.samples
        if s.name in NEW
    }


def _labels(job: str, **more: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"job": job, "worker": "worker-1", **more}.items()))


@pytest.mark.parametrize(
    ("known", "expected"),
    [
        # no next tick planned yet: paused 0 and the schedule, nothing else
        (
            Known(),
            {
                ("lockctl_job_paused", _labels("a")): 0.0,
                ("lockctl_job_info", _labels("a", schedule="@every 3s", timezone="UTC")): 1.0,
            },
        ),
        (
            Known(next_tick=1796130006.0),
            {
                ("lockctl_job_next_tick_timestamp_seconds", _labels("a")): 1796130006.0,
                ("lockctl_job_paused", _labels("a")): 0.0,
                ("lockctl_job_info", _labels("a", schedule="@every 3s", timezone="UTC")): 1.0,
            },
        ),
        (
            Known("30 2 * * 1-5", "Europe/Berlin", 1796175000.0, paused=True),
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
            Known('@every 1m "x"\n', paused=True),
            {
                ("lockctl_job_paused", _labels("a")): 1.0,
                ("lockctl_job_info", _labels("a", schedule='@every 1m "x"\n', timezone="UTC")): 1.0,
            },
        ),
    ],
)
def test_the_cronjob_metrics_say_what_the_scheduler_knows(known: Known, expected: Samples) -> None:
    assert _samples({"a": known}) == expected


def test_each_job_has_its_own_series_and_openmetrics_says_the_same() -> None:
    jobs = {
        "a": Known("@hourly", next_tick=1796133600.0),
        "b": Known("@every 2s", next_tick=1796130008.0, paused=True),
    }
    text = _samples(jobs)
    assert text[("lockctl_job_paused", _labels("b"))] == 1.0
    assert text[("lockctl_job_paused", _labels("a"))] == 0.0
    assert text[("lockctl_job_next_tick_timestamp_seconds", _labels("a"))] == 1796133600.0
    assert _samples(jobs, "application/openmetrics-text") == text


def test_the_info_metric_is_a_gauge_in_the_text_format_and_info_in_openmetrics() -> None:
    registry = _report({"a": Known("@hourly")}).registry
    assert "# TYPE lockctl_job_info gauge\n" in render(registry, None)[0].decode()
    openmetrics = render(registry, "application/openmetrics-text")[0].decode()
    assert "# TYPE lockctl_job info\n" in openmetrics


@pytest.mark.parametrize(
    ("told", "schedule", "zone", "paused"),
    [
        ((("schedule_known", "@every 3s", "UTC"),), "@every 3s", "UTC", 0.0),
        (
            (("schedule_known", "@hourly", "UTC"), ("schedule_known", "0 2 * * *", "Asia/Tokyo")),
            "0 2 * * *",  # a reload says the new one: one series, the last
            "Asia/Tokyo",
            0.0,
        ),
        ((("schedule_known", "@hourly", "UTC"), ("paused", ["a"])), "@hourly", "UTC", 1.0),
        (
            (("schedule_known", "@hourly", "UTC"), ("paused", ["a"]), ("paused", [])),
            "@hourly",
            "UTC",
            0.0,  # resumed: the watch's next answer has no paused key
        ),
    ],
)
def test_the_last_schedule_and_pause_told_are_the_ones_exposed(
    told: tuple[tuple[object, ...], ...], schedule: str, zone: str, paused: float
) -> None:
    report = CoreReport("worker-1", io.StringIO())
    for name, *args in told:
        getattr(report, str(name))(*(["a", *args] if name == "schedule_known" else args))
    samples = {
        (s.name, s.labels.get("schedule"), s.labels.get("timezone")): s.value
        for family in report.registry.collect()
        for s in family.samples
        if s.name in ("lockctl_job_info", "lockctl_job_paused")
    }
    assert samples == {
        ("lockctl_job_info", schedule, zone): 1.0,
        ("lockctl_job_paused", None, None): paused,
    }


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
