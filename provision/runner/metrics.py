"""A job's Prometheus metrics for node_exporter's textfile collector, one file per worker and job.

Each run reads the file the last run left (bounded; garbage is replaced, with a warning), adds
its own outcome to `lockctl_ticks_total`, moves the last_* gauges when the job ran, and writes
the file again atomically (a temporary file in the same folder, renamed over it: node_exporter
never reads half a file). The exposition text is made and parsed by prometheus_client, the
official library; it is imported only by runs that ask for metrics.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from provision.outcomes import PREVIOUS_METRIC_WORDS, RUN_METRIC_OUTCOMES, Outcome
from provision.system.files import PUBLIC_MODE, UnreadableFile, read_regular_file, write_atomically
from provision.system.text import printable

if TYPE_CHECKING:
    from prometheus_client.samples import Sample

    from provision.runner.results import RunResult

SUFFIX = ".prom"  # node_exporter's textfile collector reads *.prom and nothing else
MAX_FILE_BYTES = 64 * 1024  # one job's file is well under 2 KiB; more is not ours
ERROR = Outcome.ERROR.value  # a run that ended in an error (Consul unreachable, refused, ...)
OUTCOMES = RUN_METRIC_OUTCOMES
LABELS = ("job", "worker")

GAUGES = {  # name -> (JobMetrics field, help)
    "lockctl_job_last_success_timestamp_seconds": (
        "last_success",
        "When the job last ended with exit status 0 under the lock (Unix time).",
    ),
    "lockctl_job_last_run_timestamp_seconds": (
        "last_run",
        "When the job last ran (ended) on this worker, whatever its outcome (Unix time).",
    ),
    "lockctl_job_last_duration_seconds": ("last_duration", "How long the job's last run took."),
    "lockctl_job_last_exit_status": ("last_exit_status", "The exit status of the job's last run."),
}
TICKS = "lockctl_ticks"  # a counter: exposed as lockctl_ticks_total
TICKS_HELP = (
    "Runs of lockctl run for the job on this worker, by outcome "
    "(gave-up: --wait ran out; timed-out: the job ran past its timeout)."
)
# The help the release before wrote: its file's `timed-out` was a --wait that ran out, its
# `job-timed-out` a job past its timeout (outcomes.py PREVIOUS_METRIC_WORDS).
PREVIOUS_TICKS_HELP = "Runs of lockctl run for the job on this worker, by outcome."
RETRIES = "lockctl_job_retries"  # a counter: exposed as lockctl_job_retries_total
RETRIES_HELP = "Attempts of the job on this worker after a failed one (retries)."


@dataclass(frozen=True)
class JobMetrics:
    """One job's metrics on one worker; None: never happened here (no sample is written)."""

    last_success: float | None = None
    last_run: float | None = None
    last_duration: float | None = None
    last_exit_status: float | None = None
    ticks: dict[str, float] = field(default_factory=dict)
    retries: float = 0.0  # counted from each result's attempts, never from the events' text


def metrics_path_problem(path: Path) -> str | None:
    """Why `path` cannot be the metrics file (checked at the flag, before any lock), or None.

    A folder that cannot be written is not refused here: it is a warning after the run, which
    keeps the job's exit status (the file may be writable by then, and the job matters more).
    """
    if path.is_dir():
        return "is a folder, not a file"
    if path.suffix != SUFFIX:
        return f"must end in {SUFFIX} (node_exporter's textfile collector reads only *{SUFFIX})"
    parent = path.parent
    if not parent.exists():
        return f"folder {parent} does not exist"
    if not parent.is_dir():
        return f"{parent} is not a folder"
    return None


@dataclass(frozen=True)
class Owner:
    """Whose runs a metrics file counts: the job and worker, and a keyed run's key (its own
    file, with a `key` label the unkeyed runs' files do not have; node_exporter fills it in
    empty for them)."""

    job: str
    worker: str
    key: str | None = None

    @property
    def labels(self) -> dict[str, str]:
        found = {"job": self.job, "worker": self.worker}
        return found if self.key is None else {**found, "key": self.key}


def write_run_metrics(
    path: Path,
    owner: Owner,
    result: RunResult | None,
    now: float,
    *,
    elapsed: float | None = None,
) -> list[str]:
    """Add this run to the job's metrics file; the warnings (the file is then replaced or not
    written), never an exception for a file or folder that is not as it should be.

    `result` None: the run ended in an error before it had a result (outcome "error").
    `now`: the wall clock (Unix time) at the run's end. The duration is the result's own when it
    has one (`duration`), else `elapsed`, the whole run's.
    """
    previous, warnings = read_metrics(path, owner)
    metrics = updated_metrics(previous, result, now, elapsed)
    try:
        write_atomically(path, render_metrics(metrics, owner), mode=PUBLIC_MODE)
    except OSError as exc:
        warnings.append(f"metrics not written: {exc.strerror or exc}")
    return warnings


def updated_metrics(
    previous: JobMetrics, result: RunResult | None, now: float, elapsed: float | None
) -> JobMetrics:
    """`previous` with this run counted; the last_* gauges move only when the job ran."""
    outcome = ERROR if result is None else Outcome(result.outcome).value
    if result is not None and getattr(result, "skip", None) == Outcome.BLACKOUT.value:
        outcome = Outcome.BLACKOUT.value  # a window held the tick: its own word, not a skip
    ticks = {**previous.ticks, outcome: previous.ticks.get(outcome, 0.0) + 1}
    if result is None or result.lock_index is None:  # skipped, gave up, stopped before: no run
        return replace(previous, ticks=ticks)
    duration = getattr(result, "duration", None)
    succeeded = result.outcome is Outcome.RAN and result.exit_code == 0
    return JobMetrics(
        last_success=now if succeeded else previous.last_success,
        last_run=now,
        last_duration=duration if duration is not None else elapsed,
        last_exit_status=float(result.exit_code),
        ticks=ticks,
        retries=previous.retries + getattr(result, "attempts", 1) - 1,
    )


def render_metrics(metrics: JobMetrics, owner: Owner) -> str:
    """The exposition text (prometheus_client's own), samples labelled job and worker (and
    key, for a keyed run's)."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(metrics, owner))
    return generate_latest(registry).decode("utf-8")


class _Collector:
    """Hands prometheus_client the metric families of one JobMetrics."""

    def __init__(self, metrics: JobMetrics, owner: Owner) -> None:
        self.metrics = metrics
        self.names, self.labels = list(owner.labels), list(owner.labels.values())

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        for name, (attribute, help_text) in GAUGES.items():
            gauge = GaugeMetricFamily(name, help_text, labels=self.names)
            value = getattr(self.metrics, attribute)
            if value is not None:
                gauge.add_metric(self.labels, value)
            yield gauge
        ticks = CounterMetricFamily(TICKS, TICKS_HELP, labels=(*self.names, "outcome"))
        for outcome in sorted(self.metrics.ticks):
            ticks.add_metric([*self.labels, outcome], self.metrics.ticks[outcome])
        yield ticks
        retries = CounterMetricFamily(RETRIES, RETRIES_HELP, labels=self.names)
        if self.metrics.retries:  # sparse as the outcomes: from the first retry here on
            retries.add_metric(self.labels, self.metrics.retries)
        yield retries


def read_metrics(path: Path, owner: Owner) -> tuple[JobMetrics, list[str]]:
    """The metrics the last run left at `path`, and a warning when that file was not usable
    (it is then replaced: starting the counters again is what Prometheus handles as a reset)."""
    if not os.path.lexists(path):
        return JobMetrics(), []
    try:
        data = read_regular_file(path, MAX_FILE_BYTES)
        if len(data) > MAX_FILE_BYTES:
            raise UnreadableFile(f"larger than {MAX_FILE_BYTES} bytes")
        return _parse(data.decode("utf-8"), owner), []
    except (UnreadableFile, UnicodeDecodeError, _NotOurs) as exc:
        why = printable(str(exc), 200)  # the file's text: shown, never raw
        return JobMetrics(), [f"previous file not usable ({why}); replaced"]


def _in_todays_words(sample: Sample, documentation: str) -> Sample:
    """A sample of the file the release before left, its outcome in today's words: the help
    text says which release wrote it (its `timed-out` is today's `gave-up`)."""
    outcome = sample.labels.get("outcome")
    if documentation != PREVIOUS_TICKS_HELP or outcome not in PREVIOUS_METRIC_WORDS:
        return sample
    return sample._replace(labels={**sample.labels, "outcome": PREVIOUS_METRIC_WORDS[outcome]})


class _NotOurs(Exception):
    """The previous file holds something this job's runs did not write."""


def _parse(text: str, owner: Owner) -> JobMetrics:
    from prometheus_client.parser import text_string_to_metric_families

    gauges: dict[str, float] = {}
    ticks: dict[str, float] = {}
    retries = 0.0
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as exc:  # the parser's errors are of no one documented type
        raise _NotOurs(f"not Prometheus text: {exc}") from None
    samples = [
        _in_todays_words(sample, family.documentation)
        for family in families
        for sample in family.samples
    ]
    for sample in samples:
        identity = {k: v for k, v in sample.labels.items() if k != "outcome"}
        if identity != owner.labels:
            said = ", ".join(f"{name}={value!r}" for name, value in owner.labels.items())
            raise _NotOurs(f"{sample.name} is not labelled {said}")
        if not math.isfinite(sample.value) or sample.value < 0:
            raise _NotOurs(f"{sample.name} is {sample.value}")
        if sample.name in GAUGES and "outcome" not in sample.labels:
            gauges[sample.name] = sample.value
        elif sample.name == f"{TICKS}_total" and sample.labels.get("outcome") in OUTCOMES:
            ticks[sample.labels["outcome"]] = sample.value
        elif sample.name == f"{RETRIES}_total" and "outcome" not in sample.labels:
            retries = sample.value
        else:
            raise _NotOurs(f"unexpected sample {sample.name}")

    def gauge(name: str) -> float | None:
        return gauges.get(name)

    return JobMetrics(
        last_success=gauge("lockctl_job_last_success_timestamp_seconds"),
        last_run=gauge("lockctl_job_last_run_timestamp_seconds"),
        last_duration=gauge("lockctl_job_last_duration_seconds"),
        last_exit_status=gauge("lockctl_job_last_exit_status"),
        ticks=ticks,
        retries=retries,
    )
