"""The textfile metrics of `lockctl run --metrics-textfile` (provision/runner/metrics.py): what each
outcome moves, what a skip keeps, a previous file that is garbage, and atomic writes."""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from provision.cli.runjob import _write_metrics
from provision.outcomes import Outcome
from provision.runner.events import EventLog
from provision.runner.metrics import (
    MAX_FILE_BYTES,
    JobMetrics,
    Owner,
    metrics_path_problem,
    read_metrics,
    render_metrics,
    write_run_metrics,
)
from provision.runner.results import RunResult
from provision.tick.skips import SkipReason

JOB, WORKER = "nightly-ingest", "worker-2"
OWNER = Owner(JOB, WORKER)
T0 = 1_796_000_000.0


def samples(path: Path) -> dict[str, float]:
    """Every sample of the file, keyed `name{outcome}` (job and worker checked on the way)."""
    found = {}
    for family in text_string_to_metric_families(path.read_text()):
        for sample in family.samples:
            labels = dict(sample.labels)
            assert labels.pop("job") == JOB and labels.pop("worker") == WORKER
            outcome = labels.pop("outcome", None)
            assert labels == {}
            found[sample.name + (f"{{{outcome}}}" if outcome else "")] = sample.value
    return found


def ran(exit_code: int = 0, outcome: Outcome = Outcome.RAN) -> RunResult:
    return RunResult(outcome, exit_code, lock_index=7)


@pytest.fixture
def prom(tmp_path: Path) -> Path:
    return tmp_path / "lockctl-nightly-ingest.prom"


def write(prom: Path, result: RunResult | None, now: float, elapsed: float = 0.5) -> list[str]:
    return write_run_metrics(prom, OWNER, result, now, elapsed=elapsed)


def test_a_first_run_that_skips_counts_the_skip_and_claims_no_run(prom: Path) -> None:
    assert write(prom, RunResult(Outcome.SKIPPED, 0), T0) == []
    assert samples(prom) == {"lockctl_ticks_total{skipped}": 1.0}


def test_a_success_then_skips_and_a_failure(prom: Path) -> None:
    assert write(prom, ran(0), T0, elapsed=2.5) == []
    assert samples(prom) == {
        "lockctl_job_last_success_timestamp_seconds": T0,
        "lockctl_job_last_run_timestamp_seconds": T0,
        "lockctl_job_last_duration_seconds": 2.5,
        "lockctl_job_last_exit_status": 0.0,
        "lockctl_ticks_total{ran}": 1.0,
    }
    for minute in (1, 2):  # skips keep every last_* value and count themselves
        assert write(prom, RunResult(Outcome.SKIPPED, 0), T0 + 60 * minute) == []
    assert samples(prom)["lockctl_job_last_run_timestamp_seconds"] == T0
    assert samples(prom)["lockctl_ticks_total{skipped}"] == 2.0
    assert write(prom, ran(3), T0 + 180, elapsed=1.0) == []
    after = samples(prom)
    assert after["lockctl_job_last_success_timestamp_seconds"] == T0  # still the success's
    assert after["lockctl_job_last_run_timestamp_seconds"] == T0 + 180
    assert after["lockctl_job_last_exit_status"] == 3.0
    assert after["lockctl_job_last_duration_seconds"] == 1.0
    assert (after["lockctl_ticks_total{ran}"], after["lockctl_ticks_total{skipped}"]) == (2.0, 2.0)


@pytest.mark.parametrize(
    ("result", "outcome", "moves_run"),
    [
        (ran(76, Outcome.LOST), "lost", True),  # the job ran, then was fenced
        (ran(143, Outcome.INTERRUPTED), "interrupted", True),  # stopped while it ran
        (RunResult(Outcome.INTERRUPTED, 143), "interrupted", False),  # before it started
        (RunResult(Outcome.GAVE_UP, 75), "gave-up", False),  # --wait ran out
        (ran(124, Outcome.TIMED_OUT), "timed-out", True),  # the job's timeout: stopped
        (None, "error", False),  # Consul unreachable, refused, ...
    ],
)
def test_each_outcome_is_counted_and_only_runs_move_the_last_run(
    prom: Path, result: RunResult | None, outcome: str, moves_run: bool
) -> None:
    write(prom, ran(0), T0)
    write(prom, result, T0 + 60)
    after = samples(prom)
    assert after[f"lockctl_ticks_total{{{outcome}}}"] == 1.0
    assert after["lockctl_job_last_success_timestamp_seconds"] == T0
    assert after["lockctl_job_last_run_timestamp_seconds"] == (T0 + 60 if moves_run else T0)


@dataclass(frozen=True)
class TimedResult:
    """A RunResult as the engine may give it, with the job's own duration."""

    outcome: Outcome
    exit_code: int
    lock_index: int | None
    duration: float


def test_the_results_own_duration_wins_over_the_whole_runs(prom: Path) -> None:
    write(prom, TimedResult(Outcome.RAN, 0, 3, duration=0.25), T0, elapsed=0.4)  # type: ignore[arg-type]
    assert samples(prom)["lockctl_job_last_duration_seconds"] == 0.25


def test_the_file_is_prometheus_text_with_help_and_type_and_no_created_series(prom: Path) -> None:
    write(prom, ran(0), T0)
    text = prom.read_text()
    for name in ("lockctl_job_last_success_timestamp_seconds", "lockctl_ticks_total"):
        assert f"# HELP {name} " in text and f"# TYPE {name} " in text
    assert "_created" not in text
    assert oct(prom.stat().st_mode & 0o777) == oct(0o644)  # node_exporter runs as another user


def test_what_is_written_reads_back_the_same(prom: Path) -> None:
    metrics = JobMetrics(T0, T0 + 1, 0.125, 2.0, {"ran": 5.0, "skipped": 12.0, "error": 1.0})
    prom.write_text(render_metrics(metrics, OWNER))
    assert read_metrics(prom, OWNER) == (metrics, [])


def test_a_keyed_runs_file_is_labelled_with_its_key_and_not_another_keys() -> None:
    metrics = JobMetrics(T0, T0 + 1, 0.125, 0.0, {"ran": 2.0})
    keyed = Owner(JOB, WORKER, "tenant-42")
    text = render_metrics(metrics, keyed)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            assert sample.labels["key"] == "tenant-42", sample
    assert "key=" not in render_metrics(metrics, OWNER)  # an unkeyed run's: as before


def test_another_keys_file_is_not_ours(prom: Path) -> None:
    metrics = JobMetrics(T0, T0 + 1, 0.125, 0.0, {"ran": 2.0})
    prom.write_text(render_metrics(metrics, Owner(JOB, WORKER, "tenant-41")))
    found, warnings = read_metrics(prom, Owner(JOB, WORKER, "tenant-42"))
    assert found == JobMetrics() and len(warnings) == 1 and "key='tenant-42'" in warnings[0]
    assert read_metrics(prom, OWNER)[0] == JobMetrics()  # nor an unkeyed run's


GARBAGE = {
    "binary": b"\x00\xff\xfe garbage \x80",
    "not-prometheus": b"hello {{{ world\n",
    "another-job": b'lockctl_ticks_total{job="other",worker="worker-2",outcome="ran"} 3\n',
    "another-worker": b'lockctl_ticks_total{job="nightly-ingest",worker="w9",outcome="ran"} 3\n',
    "negative": (b'lockctl_ticks_total{job="nightly-ingest",worker="worker-2",outcome="ran"} -1\n'),
    "nan": b'lockctl_job_last_exit_status{job="nightly-ingest",worker="worker-2"} NaN\n',
    "unknown-outcome": (
        b'lockctl_ticks_total{job="nightly-ingest",worker="worker-2",outcome="odd"} 1\n'
    ),
    "foreign-metric": b'node_load1{job="nightly-ingest",worker="worker-2"} 1\n',
    "escape": b"\x1b[31m red \x1b[0m {\n",
    "too-large": b"#" * (MAX_FILE_BYTES + 10),
}


@pytest.mark.parametrize("content", GARBAGE.values(), ids=GARBAGE.keys())
def test_a_previous_file_that_is_not_ours_is_replaced_with_a_warning(
    prom: Path, content: bytes
) -> None:
    prom.write_bytes(content)
    warnings = write(prom, ran(0), T0)
    assert len(warnings) == 1 and warnings[0].startswith("previous file not usable (")
    assert warnings[0].endswith("); replaced")
    assert "\x1b" not in warnings[0] and len(warnings[0]) < 300
    assert samples(prom)["lockctl_ticks_total{ran}"] == 1.0  # counting again from scratch


def test_a_fifo_at_the_path_is_neither_waited_on_nor_kept(prom: Path) -> None:
    os.mkfifo(prom)
    warnings = write(prom, ran(0), T0)
    assert "a FIFO, not a regular file" in warnings[0]
    assert samples(prom)["lockctl_ticks_total{ran}"] == 1.0


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=300))
def test_no_previous_text_makes_the_reader_raise(
    tmp_path_factory: pytest.TempPathFactory, text: str
) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "j.prom"
    path.write_text(text)
    metrics, warnings = read_metrics(path, OWNER)
    assert isinstance(metrics, JobMetrics) and len(warnings) <= 1


def test_a_folder_that_cannot_be_written_is_a_warning_not_an_error() -> None:
    path = Path("/proc/lockctl-metrics-test.prom")  # even root cannot make files in /proc
    warnings = write_run_metrics(path, OWNER, ran(0), T0)
    assert len(warnings) == 1 and warnings[0].startswith("metrics not written: ")


def test_a_failed_write_leaves_the_previous_file_whole_and_no_temporary_file(
    prom: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(prom, ran(0), T0)
    before = prom.read_bytes()

    def refuse(*_args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    warnings = write(prom, ran(1), T0 + 60)
    assert warnings == ["metrics not written: No space left on device"]
    assert prom.read_bytes() == before
    assert sorted(p.name for p in prom.parent.iterdir()) == [prom.name]


def test_the_temporary_file_is_one_node_exporter_does_not_read(
    prom: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    real_replace = os.replace

    def spy(source: str, target: object) -> None:
        seen.append(os.path.basename(source))
        real_replace(source, target)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", spy)
    write(prom, ran(0), T0)
    (temporary,) = seen
    assert temporary.startswith(".") and not temporary.endswith(".prom")  # hidden, not *.prom
    assert os.path.dirname(prom) == str(prom.parent)  # same folder: the rename is atomic


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("j.prom", None),
        ("j.txt", "must end in .prom (node_exporter's textfile collector reads only *.prom)"),
        ("folder.prom", "is a folder, not a file"),
        ("missing/j.prom", "does not exist"),
        ("file/j.prom", "is not a folder"),
    ],
)
def test_the_path_is_checked_at_the_flag(tmp_path: Path, name: str, problem: str | None) -> None:
    (tmp_path / "folder.prom").mkdir()
    (tmp_path / "file").write_text("")
    found = metrics_path_problem(tmp_path / name)
    assert found == problem if problem is None else problem in (found or "")


def test_the_cli_turns_warnings_into_events_on_stderr(prom: Path) -> None:
    prom.write_bytes(b"garbage {\n")
    stream = io.StringIO()
    _write_metrics(prom, EventLog(JOB, WORKER, stream), RunResult(Outcome.SKIPPED, 0), 0.1)
    (event,) = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert event["event"] == "metrics-warning" and event["path"] == str(prom)
    assert event["warning"].startswith("previous file not usable")


PREVIOUS_RELEASE_FILE = """\
# HELP lockctl_ticks_total Runs of lockctl run for the job on this worker, by outcome.
# TYPE lockctl_ticks_total counter
lockctl_ticks_total{job="nightly-ingest",outcome="ran",worker="worker-2"} 4.0
lockctl_ticks_total{job="nightly-ingest",outcome="timed-out",worker="worker-2"} 2.0
lockctl_ticks_total{job="nightly-ingest",outcome="job-timed-out",worker="worker-2"} 1.0
"""


def test_a_file_the_release_before_left_is_read_in_todays_words(prom: Path) -> None:
    """Its `timed-out` was a --wait that ran out (today's `gave-up`), its `job-timed-out` a job
    past its timeout (today's `timed-out`): the counters carry on, never swapped or reset."""
    prom.write_text(PREVIOUS_RELEASE_FILE)
    assert write(prom, RunResult(Outcome.GAVE_UP, 75), T0) == []
    after = samples(prom)
    assert after["lockctl_ticks_total{gave-up}"] == 3.0
    assert after["lockctl_ticks_total{timed-out}"] == 1.0
    assert after["lockctl_ticks_total{ran}"] == 4.0
    assert "lockctl_ticks_total{job-timed-out}" not in after
    # written again in today's words, and read back as they are (no second translation)
    assert write(prom, RunResult(Outcome.SKIPPED, 0), T0 + 60) == []
    assert samples(prom)["lockctl_ticks_total{timed-out}"] == 1.0


def test_a_tick_a_blackout_window_held_is_counted_blackout_not_skipped(prom: Path) -> None:
    held = RunResult(Outcome.SKIPPED, 0, skip=SkipReason.BLACKOUT)
    assert write(prom, held, T0) == [] and write(prom, RunResult(Outcome.SKIPPED, 0), T0) == []
    assert samples(prom) == {
        "lockctl_ticks_total{blackout}": 1.0,
        "lockctl_ticks_total{skipped}": 1.0,
    }
    assert read_metrics(prom, OWNER)[0].ticks == {"blackout": 1.0, "skipped": 1.0}
