"""What `/metrics` and `/healthz` say, from the job loops' counts (scheduler/counts.py).

The metrics are made by prometheus_client, the official library, from a CollectorRegistry of
the scheduler's own (never the process-global one): each scrape collects a snapshot per job,
so a scrape never sees a loop half-way through a change. Names follow Prometheus's conventions
and reuse those of `lockctl run --metrics-textfile` (runner/metrics.py) where they mean the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from provision.runner.metrics import LABELS, TICKS
from provision.scheduler.counts import OUTCOMES, SKIP_REASONS, CountsSnapshot, SessionState
from provision.system.text import printable

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

Snapshots = Callable[[], Sequence[tuple[str, CountsSnapshot]]]

LAST_SUCCESS = "lockctl_job_last_success_timestamp_seconds"  # as runner/metrics.py's
# What kube-state-metrics has for a CronJob (kube_cronjob_next_schedule_time, _spec_suspend,
# _info) under lockctl's names: the next tick, paused, the schedule and its timezone.
NEXT_TICK = "lockctl_job_next_tick_timestamp_seconds"
INFO = "lockctl_job"  # an info metric: exposed as lockctl_job_info
HELP = {
    LAST_SUCCESS: "When the job last ended with exit status 0 under the lock here (Unix time).",
    TICKS: "Ticks of the job this scheduler handled, by outcome.",
    "lockctl_skips": "Ticks this scheduler skipped, by reason "
    "(taken, overlap, lock-delay, paused, other).",
    "lockctl_run_duration_seconds": "How long the job ran under the lock, per run here.",
    "lockctl_start_lag_seconds": "From the tick's instant to its claim, when the job then "
    "started under the lock (the tick record's start_lag).",
    "lockctl_job_running": "1 while the job runs here under the lock (the sum over replicas "
    "is at most 1).",
    "lockctl_missed_ticks_recorded": "Ticks of the job nobody ran that this scheduler recorded "
    "missed in the ledger (each such tick is recorded by one replica).",
    "lockctl_run_failures": "Runs of the job here that ended with a non-zero exit status "
    "under the lock.",
    "lockctl_job_retries": "Attempts of the job here after a failed one, under the same lock "
    "and tick (retries).",
    "lockctl_retries_cut": "Runs of the job here whose retries left were not made: the next "
    "attempt would have started at or after the next tick (or a stop came).",
    "lockctl_renew_failures": "Renewals of the job's session that Consul did not answer.",
    "lockctl_consul_up": "1 when Consul answered the job loop's last request, else 0.",
    "lockctl_ticks_since_success": "Ticks of the job this scheduler handled since its last "
    "success here, or since it started (the min over the replicas: since a success anywhere).",
    "lockctl_job_failing": "1 while the job's last tick failed for a reason of lockctl's own "
    "(its command cannot start, a refused token, a bug), until a tick goes through.",
    NEXT_TICK: "When the job's next tick is, as this scheduler plans it (Unix time).",
    "lockctl_job_paused": "1 while the job is paused (lockctl pause), as this scheduler last "
    "saw its control keys, else 0.",
    INFO: "The job's schedule and its timezone, as this scheduler runs them (value 1).",
}
HEALTH_LIMIT = 400  # characters of the /healthz line


def metrics_registry(snapshots: Snapshots, worker: str) -> CollectorRegistry:
    """The scheduler's own registry: one collector reading the loops' snapshots at each scrape."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(snapshots, worker))
    return registry


def render(registry: CollectorRegistry, accept: str | None) -> tuple[bytes, str]:
    """The exposition (text format, or OpenMetrics when the scraper asks) and its content type."""
    from prometheus_client.exposition import choose_encoder

    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type


class _Collector:
    def __init__(self, snapshots: Snapshots, worker: str) -> None:
        self.snapshots, self.worker = snapshots, worker

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
            InfoMetricFamily,
        )

        jobs = [([job, self.worker], snap) for job, snap in self.snapshots()]
        last = GaugeMetricFamily(LAST_SUCCESS, HELP[LAST_SUCCESS], labels=LABELS)
        ticks = CounterMetricFamily(TICKS, HELP[TICKS], labels=(*LABELS, "outcome"))
        skips = CounterMetricFamily(
            "lockctl_skips", HELP["lockctl_skips"], labels=(*LABELS, "reason")
        )
        durations = HistogramMetricFamily(
            "lockctl_run_duration_seconds", HELP["lockctl_run_duration_seconds"], labels=LABELS
        )
        lags = HistogramMetricFamily(
            "lockctl_start_lag_seconds", HELP["lockctl_start_lag_seconds"], labels=LABELS
        )
        gauges = {name: GaugeMetricFamily(name, HELP[name], labels=LABELS) for name in _GAUGES}
        counters = {
            name: CounterMetricFamily(name, HELP[name], labels=LABELS) for name in _COUNTERS
        }
        next_tick = GaugeMetricFamily(NEXT_TICK, HELP[NEXT_TICK], labels=LABELS)
        info = InfoMetricFamily(INFO, HELP[INFO], labels=LABELS)
        for labels, snap in jobs:
            if snap.last_success is not None:
                last.add_metric(labels, snap.last_success)
            if snap.next_tick is not None:
                next_tick.add_metric(labels, snap.next_tick)
            if snap.schedule is not None:
                info.add_metric(labels, {"schedule": snap.schedule, "timezone": snap.timezone})
            for outcome in (*OUTCOMES, *sorted(set(snap.outcomes) - set(OUTCOMES))):
                ticks.add_metric([*labels, outcome], snap.outcomes.get(outcome, 0))
            for reason in SKIP_REASONS:
                skips.add_metric([*labels, reason.value], snap.skips.get(reason, 0))
            for family, seen in ((durations, snap.durations), (lags, snap.lags)):
                family.add_metric(labels, seen.cumulative(), seen.total)
            for name, value in _GAUGES.items():
                gauges[name].add_metric(labels, value(snap))
            for name, count in _COUNTERS.items():
                counters[name].add_metric(labels, count(snap))
        yield from (last, ticks, skips, durations, lags, *gauges.values(), *counters.values())
        yield from (next_tick, info)


_GAUGES: dict[str, Callable[[CountsSnapshot], float]] = {
    "lockctl_job_running": lambda snap: 1.0 if snap.running else 0.0,
    "lockctl_consul_up": lambda snap: 1.0 if snap.consul_up else 0.0,
    "lockctl_job_failing": lambda snap: 1.0 if snap.failing is not None else 0.0,
    "lockctl_ticks_since_success": lambda snap: snap.ticks_since_success,
    "lockctl_job_paused": lambda snap: 1.0 if snap.paused else 0.0,
}

_COUNTERS: dict[str, Callable[[CountsSnapshot], float]] = {
    "lockctl_run_failures": lambda snap: snap.run_failures,
    "lockctl_missed_ticks_recorded": lambda snap: snap.missed_recorded,
    "lockctl_renew_failures": lambda snap: snap.renew_failures,
    "lockctl_job_retries": lambda snap: snap.retries,
    "lockctl_retries_cut": lambda snap: snap.retries_cut,
}


@dataclass(frozen=True)
class Health:
    status: int  # 200 or 503
    text: str  # one line


def health_verdict(jobs: Sequence[tuple[str, CountsSnapshot]]) -> Health:
    """200 `ok` when Consul answered every loop's last request and each has a valid session
    (or has not needed one yet); else 503 naming each job that is not, and why."""
    if not jobs:
        return Health(503, "no job loop is running")
    problems = [f"{printable(job, 64)}: {why}" for job, snap in jobs if (why := _unhealthy(snap))]
    if not problems:
        return Health(200, "ok")
    return Health(503, printable("; ".join(problems), HEALTH_LIMIT))


def _unhealthy(snap: CountsSnapshot) -> str | None:
    if not snap.consul_up:
        return f"Consul did not answer its last request ({snap.consul_error or 'no answer'})"
    if snap.failing is not None:
        return f"its last tick failed ({snap.failing})"
    if snap.session is SessionState.LOST:
        return "its session was lost (Consul no longer knows it); the next tick makes a new one"
    return None
