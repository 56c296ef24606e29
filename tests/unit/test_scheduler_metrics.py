"""`lockctl schedule --listen`: the pure parts (why a claim was refused, counts from results and
from the engine's helper events, the health verdict, the flag), the loop's own overlap skips
counted, and the listener over real sockets."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from provision.errors import EXIT_ENVIRONMENT, EXIT_INPUT, InputError
from provision.fencing import Outcome
from provision.ledger.records import tick_name
from provision.runner.results import RunResult, SkipReason
from provision.runner.tick_verdicts import refused_skip
from provision.scheduler import loop
from provision.scheduler.counts import (
    SKIP_REASONS,
    CountsSnapshot,
    LoopCounts,
    Observations,
    SessionState,
    after_helper_event,
    after_result,
    after_skips,
    failed,
)
from provision.scheduler.exposition import health_verdict, metrics_registry
from provision.scheduler.listen import ListenAddress, Listener, parse_listen
from provision.scheduler.loop import CountingEventLog, JobTicks
from provision.workers.config import JobConfig, JobTimings

TICK = datetime(2026, 12, 1, 13, 0, 5, tzinfo=timezone.utc)
HOST = "127.0.0.1"


# -- why a claim was refused: decided where it is, in a word ----------------------------------
def _job(schedule: str = "@every 3s") -> JobConfig:
    return JobConfig(
        "job-a", "locks/a/.lock", JobTimings(15.0, 15.0, 5.0, 5.0, 0.0), schedule, command=("true",)
    )


@pytest.mark.parametrize(
    ("recorded", "lock_delay", "running", "paused", "skip"),
    [
        (True, False, None, False, SkipReason.TAKEN),  # the tick has a record, whoever holds it
        (True, True, "2026-12-01T13:00:02Z", False, SkipReason.TAKEN),
        (False, True, None, False, SkipReason.LOCK_DELAY),  # Consul said so in the claim's answer
        (False, True, "2026-12-01T13:00:02Z", False, SkipReason.LOCK_DELAY),
        (False, False, "2026-12-01T13:00:02Z", False, SkipReason.OVERLAP),  # the holder runs one
        (False, False, "overlap, lock-delay", False, SkipReason.OVERLAP),  # its text means nothing
        (False, False, None, False, SkipReason.OTHER),  # held, no tick: a plain `lockctl run`
        # paused: the claim's pause check failed and the tick was recorded paused
        (False, False, None, True, SkipReason.PAUSED),
        (False, True, None, True, SkipReason.PAUSED),  # paused outranks the lock's state
        (False, False, "2026-12-01T13:00:02Z", True, SkipReason.PAUSED),
        (True, False, None, True, SkipReason.TAKEN),  # a record exists: that is what counts
    ],
)
def test_a_refused_claim_says_why_in_a_word(
    recorded: bool, lock_delay: bool, running: str | None, paused: bool, skip: SkipReason
) -> None:
    decided = refused_skip(recorded=recorded, lock_delay=lock_delay, running=running, paused=paused)
    assert decided is skip


def test_the_skip_reasons_are_the_labels_dashboards_know() -> None:
    assert [reason.value for reason in SKIP_REASONS] == [
        "taken",
        "overlap",
        "lock-delay",
        "paused",
        "other",
    ]


# -- counts from results -------------------------------------------------------------------
NOW = TICK.timestamp() + 30.0
DOWN = replace(CountsSnapshot(), consul_up=False, consul_error="x", running=True)


@pytest.mark.parametrize(
    ("result", "outcomes", "skips", "consul_up", "last_success"),
    [
        (RunResult(Outcome.RAN, 0, 7, TICK, 1.5, start_lag=0.008), {"ran": 1}, {}, False, NOW),
        (RunResult(Outcome.RAN, 3, 7, TICK, 1.5, start_lag=0.008), {"ran": 1}, {}, False, None),
        (RunResult(Outcome.LOST, 9, 7, TICK, 1.5, start_lag=0.2), {"lost": 1}, {}, False, None),
        (RunResult(Outcome.INTERRUPTED, 143, None, TICK), {"interrupted": 1}, {}, False, None),
        (
            RunResult(Outcome.JOB_TIMED_OUT, 124, 7, TICK, 2.0),
            {"job-timed-out": 1},
            {},
            False,
            None,  # not a success: the job did not finish
        ),
        (
            RunResult(Outcome.SKIPPED, 0, tick=TICK, skip=SkipReason.TAKEN),
            {"skipped": 1},
            {SkipReason.TAKEN: 1},
            True,  # the read (or the claim) answered
            None,
        ),
        (
            RunResult(Outcome.SKIPPED, 0, tick=TICK, skip=SkipReason.LOCK_DELAY),
            {"skipped": 1},
            {SkipReason.LOCK_DELAY: 1},
            True,
            None,
        ),
        (  # the CLI's cheap skip says no reason: counted, as other
            RunResult(Outcome.SKIPPED, 0, tick=TICK),
            {"skipped": 1},
            {SkipReason.OTHER: 1},
            True,
            None,
        ),
        (RunResult(Outcome.MISSED, 0, tick=TICK), {"missed": 1}, {}, True, None),
    ],
)
def test_a_result_is_counted_by_what_it_says(
    result: RunResult,
    outcomes: dict[str, int],
    skips: dict[SkipReason, int],
    consul_up: bool,
    last_success: float | None,
) -> None:
    state = after_result(DOWN, result, NOW)
    assert (state.outcomes, state.skips) == (outcomes, skips)
    assert (state.consul_up, state.last_success, state.running) == (consul_up, last_success, False)
    assert state.durations.total == (result.duration or 0.0)
    assert sum(state.durations.counts) == (result.duration is not None)
    assert state.lags.total == (result.start_lag or 0.0)
    assert sum(state.lags.counts) == (result.start_lag is not None)


@pytest.mark.parametrize(
    ("result", "run_failures"),
    [
        (RunResult(Outcome.RAN, 0, tick=TICK, duration=1.0), 0),
        (RunResult(Outcome.RAN, 3, tick=TICK, duration=1.0), 1),
        (RunResult(Outcome.LOST, 76, tick=TICK, duration=1.0), 0),  # fenced: counted as lost
        (RunResult(Outcome.JOB_TIMED_OUT, 124, tick=TICK, duration=1.0), 0),  # as job-timed-out
        (RunResult(Outcome.SKIPPED, 0, tick=TICK), 0),
    ],
)
def test_only_a_run_that_exited_non_zero_is_a_run_failure(
    result: RunResult, run_failures: int
) -> None:
    assert after_result(CountsSnapshot(), result, NOW).run_failures == run_failures


def test_ticks_since_success_count_every_outcome_until_a_success() -> None:
    state = after_skips(CountsSnapshot(), SkipReason.OVERLAP, 2)
    state = after_result(state, RunResult(Outcome.SKIPPED, 0, tick=TICK), NOW)
    state = after_result(state, RunResult(Outcome.RAN, 1, tick=TICK, duration=1.0), NOW)
    assert state.ticks_since_success == 4
    state = after_result(state, RunResult(Outcome.RAN, 0, tick=TICK, duration=1.0), NOW)
    assert state.ticks_since_success == 0
    assert failed(state, "a bug").ticks_since_success == 1


def test_missed_ticks_recorded_are_counted_from_housekeeping_alone() -> None:
    counts = LoopCounts()
    events = CountingEventLog("job-a", "worker-1", io.StringIO(), counts)
    events.emit("housekeeping", missed_recorded=2, missed_ticks=["a", "b"], pruned=0)
    events.emit("housekeeping", missed_recorded=0, pruned=3)
    events.emit("housekeeping", missed_recorded="9")  # not lockctl's own: ignored
    events.emit("released", missed_recorded=5)  # no other event counts it
    assert counts.snapshot().missed_recorded == 2


def test_the_start_lag_lands_in_its_bucket() -> None:
    result = RunResult(Outcome.RAN, 0, 7, TICK, 1.0, start_lag=0.008)
    lags = after_result(CountsSnapshot(), result, NOW).lags
    assert lags.cumulative()[:3] == [("0.005", 0), ("0.01", 1), ("0.025", 1)]


def test_the_loops_own_skips_count_as_skipped_ticks_and_ask_consul_nothing() -> None:
    state = after_skips(after_skips(DOWN, SkipReason.OVERLAP, 3), SkipReason.OVERLAP, 1)
    assert (state.outcomes, state.skips) == ({"skipped": 4}, {SkipReason.OVERLAP: 4})
    assert not state.consul_up


# -- what only the engine's threads see: by the event's name ---------------------------------
def _replay(*events: tuple[str, object]) -> CountsSnapshot:
    state = CountsSnapshot()
    for event, error in events:
        state = after_helper_event(state, event, error)
    return state


@pytest.mark.parametrize(
    ("events", "running", "consul_up", "renew_failures"),
    [
        ((("acquired", None),), True, True, 0),
        ((("acquired", None), ("released", None)), False, True, 0),
        ((("acquired", None), ("lost", None)), False, True, 0),
        ((("acquired", None), ("renew-failed", "x")), True, False, 1),
        ((("renew-failed", "x"), ("renewed", None)), False, True, 1),
        ((("renew-failed", "x"), ("renew-failed", "y")), False, False, 2),
        ((("released", None), ("housekeeping-failed", "x")), False, False, 0),
        ((("housekeeping-failed", "x"), ("housekeeping", None)), False, True, 0),
    ],
)
def test_helper_events_give_running_consul_up_and_renew_failures(
    events: tuple[tuple[str, object], ...], running: bool, consul_up: bool, renew_failures: int
) -> None:
    state = _replay(*events)
    assert (state.running, state.consul_up, state.renew_failures) == (
        running,
        consul_up,
        renew_failures,
    )


def test_session_state_follows_the_loop_and_the_pool() -> None:
    counts = LoopCounts()
    assert counts.snapshot().session is SessionState.NOT_YET
    counts.session_made()
    assert counts.snapshot().session is SessionState.VALID
    counts.helper_event("session-lost", None)
    assert counts.snapshot().session is SessionState.LOST
    counts.session_made()
    counts.helper_event("session-destroyed", None)
    assert counts.snapshot().session is SessionState.NOT_YET


def test_a_consul_error_is_kept_printable_and_bounded() -> None:
    failed = _replay(("renew-failed", "Consul at http://a: no answer in 2s\x1b[2J" + "x" * 900))
    assert failed.consul_error is not None and failed.consul_error.isprintable()
    assert len(failed.consul_error) <= 160


def test_the_event_log_counts_no_outcome_and_reads_no_text() -> None:
    """A `skipped` or `missed` event (whatever its reason says) changes no count: the loop
    counts those from the RunResult."""
    counts = LoopCounts()
    events = CountingEventLog("job-a", "worker-1", io.StringIO(), counts)
    events.emit("skipped", tick="2026-12-01T13:00:05Z", reason="overlap: 3 tick(s)", ticks=3)
    events.emit("skipped", tick="2026-12-01T13:00:05Z", taken_outcome="running")
    events.emit("missed", tick="2026-12-01T13:00:05Z", reason="tick x: the lock is in lock-delay")
    assert counts.snapshot() == CountsSnapshot()
    events.emit("acquired", tick="2026-12-01T13:00:05Z", session="s")
    assert counts.snapshot().running and counts.snapshot().lags.counts == ()


def test_histogram_buckets_are_cumulative_with_inf() -> None:
    seen = Observations((1.0, 10.0)).added(0.5).added(1.0).added(5.0).added(99.0)
    assert seen.cumulative() == [("1.0", 2), ("10.0", 3), ("+Inf", 4)]
    assert seen.total == pytest.approx(105.5)


LAST = datetime(2026, 12, 1, 13, 0, 3, tzinfo=timezone.utc)  # a tick of @every 3s (:00, :03...)


@pytest.mark.parametrize(
    ("ran_for", "deadline", "passed"),
    [
        (2.5, 300.0, 0),  # ended before the next tick (:06): it is due, nothing passed
        (3.5, 300.0, 0),  # ended just after :06, which can still be claimed: due, not skipped
        (10.5, 300.0, 2),  # ended at :13.5: :06 and :09 passed, :12 is due
        (10.5, 1.0, 3),  # ... and :12 too, 1.5 s late for a 1 s deadline: :15 is due
        (61.0, 300.0, 19),  # a minute: :06 to 13:01:00 passed
    ],
)
def test_the_loop_counts_its_overlap_skips_as_skipped_ticks(
    ran_for: float, deadline: float, passed: int
) -> None:
    counts = LoopCounts()
    stream = io.StringIO()
    job = replace(_job(), timings=replace(_job().timings, start_deadline=deadline))
    events = CountingEventLog("job-a", "worker-1", stream, counts)
    now = LAST + timedelta(seconds=ran_for)
    ticks = JobTicks(None, job, "worker-1", events, None, wall=lambda: now, counts=counts)  # type: ignore[arg-type]
    ticks._last_tick = LAST  # a run of LAST lasted until now
    ticks.next_turn()
    snap = counts.snapshot()
    assert snap.outcomes == ({"skipped": passed} if passed else {})
    assert snap.skips == ({SkipReason.OVERLAP: passed} if passed else {})
    said = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [event["ticks"] for event in said] == ([passed] if passed else [])
    assert snap.consul_up  # the loop asked Consul nothing


@pytest.mark.parametrize(
    ("back", "due"),
    [
        (0.0, LAST + timedelta(seconds=3)),  # no step: the next tick
        (2.0, LAST + timedelta(seconds=3)),  # 2 s back, into LAST's window: still the next
        (40.0, LAST + timedelta(seconds=3)),  # 40 s back: never a tick it has had again
    ],
)
def test_a_loop_never_goes_back_to_a_tick_it_had_when_consuls_clock_steps_back(
    back: float, due: datetime
) -> None:
    counts = LoopCounts()
    events = CountingEventLog("job-a", "worker-1", io.StringIO(), counts)
    now = LAST + timedelta(seconds=1 - back)  # LAST ran; then the agent's clock stepped back
    ticks = JobTicks(None, _job(), "worker-1", events, None, wall=lambda: now, counts=counts)  # type: ignore[arg-type]
    ticks._last_tick = LAST
    assert ticks.next_turn().tick == due


class _OneSession:
    def session_for(self, timings: JobTimings) -> str:
        return "session-1"

    def subscribe(self, listener: object) -> None:
        pass


def test_an_unexpected_error_in_a_run_fails_that_tick_only_and_says_where(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counts = LoopCounts()
    stream = io.StringIO()
    events = CountingEventLog("job-a", "worker-1", stream, counts)
    ticks = JobTicks(None, _job(), "worker-1", events, None, counts=counts, sessions=_OneSession())  # type: ignore[arg-type]
    # a bug deep in the run: a value nobody foresaw reaches lockctl's own code
    monkeypatch.setattr(loop, "scheduled_run", lambda *args, **kwargs: tick_name(None))  # type: ignore[arg-type]
    ticks.run_tick(TICK)  # does not raise: the loop goes on at its next tick
    said = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [e["event"] for e in said] == ["tick-due", "tick-failed"]
    assert said[-1]["tick"] == "2026-12-01T13:00:05Z"
    assert said[-1]["error"].startswith("unexpected AttributeError at records.py:"), said[-1]
    snap = counts.snapshot()
    assert snap.outcomes == {"error": 1} and not snap.running
    assert snap.failing == said[-1]["error"]


# -- the health verdict ------------------------------------------------------------------------
def test_health_is_ok_when_every_loop_is_answered_and_has_a_session_or_needs_none() -> None:
    valid = replace(CountsSnapshot(), session=SessionState.VALID)
    assert health_verdict([("a", CountsSnapshot()), ("b", valid)]) == (
        health_verdict([("a", CountsSnapshot())])
    )
    verdict = health_verdict([("a", CountsSnapshot())])
    assert (verdict.status, verdict.text) == (200, "ok")


def test_health_says_which_job_and_why_in_one_line_nothing_raw() -> None:
    down = _replay(("renew-failed", "connection refused\n\x1b]0;pwned\x07" + "x" * 900))
    lost = _replay(("session-lost", None))
    verdict = health_verdict([("ok-job", CountsSnapshot()), ("a", down), ("b\x1b", lost)])
    assert verdict.status == 503
    assert verdict.text.startswith("a: Consul did not answer its last request (connection refused")
    assert "b\\x1b: its session was lost" in verdict.text
    assert verdict.text.isprintable() and len(verdict.text) <= 400
    assert "ok-job" not in verdict.text
    assert health_verdict([]).status == 503


def test_a_failing_tick_is_an_error_on_healthz_until_a_tick_goes_through() -> None:
    state = failed(CountsSnapshot(running=True), "unexpected KeyError at store.py:88: 'x\x1b[2J'")
    assert state.outcomes == {"error": 1} and not state.running
    assert state.failing == "unexpected KeyError at store.py:88: 'x\\x1b[2J'"  # printable
    verdict = health_verdict([("ok-job", CountsSnapshot()), ("bad", state)])
    assert verdict.status == 503
    assert verdict.text == "bad: its last tick failed (unexpected KeyError at store.py:88: " + (
        "'x\\x1b[2J')"
    )
    again = failed(state, "cannot start 'job.sh': not found or not executable")
    assert again.outcomes == {"error": 2} and again.failing is not None
    assert "cannot start" in again.failing
    # any tick that ends with a result, whatever its outcome, is lockctl working again
    for result in (RunResult(Outcome.RAN, 1), RunResult(Outcome.SKIPPED, 0, skip=SkipReason.TAKEN)):
        back = after_result(again, result, 1.0)
        assert back.failing is None
        assert health_verdict([("bad", back)]).status == 200
    assert failed(CountsSnapshot(), "x" * 5000).failing is not None
    assert len(failed(CountsSnapshot(), "x" * 5000).failing or "") <= 160


# -- the flag ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "address"),
    [
        ("127.0.0.1:9464", ListenAddress("127.0.0.1", 9464)),
        ("9464", ListenAddress("127.0.0.1", 9464)),
        (":9464", ListenAddress("127.0.0.1", 9464)),
        ("localhost:1", ListenAddress("localhost", 1)),
        ("[::1]:65535", ListenAddress("::1", 65535)),
        ("0.0.0.0:9464", ListenAddress("0.0.0.0", 9464)),
    ],
)
def test_listen_flag_values(value: str, address: ListenAddress) -> None:
    assert parse_listen(value) == address
    assert address.loopback == (address.host != "0.0.0.0")


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("", "the port must be a number"),
        ("127.0.0.1:", "the port must be a number"),
        ("127.0.0.1:0", "from 1 to 65535"),
        ("127.0.0.1:65536", "from 1 to 65535"),
        ("127.0.0.1:-1", "from 1 to 65535"),
        ("127.0.0.1:\uff19\uff14", "from 1 to 65535"),  # fullwidth digits: isdigit(), not ASCII
        ("127.0.0.1: 80", "from 1 to 65535"),
        ("::1:9464", "an IPv6 address goes in brackets"),
        ("[127.0.0.1]:9464", "brackets are for an IPv6 address only"),
        ("example.com:9464", "an IP address or localhost"),
        ("999.1.1.1:9464", "an IP address or localhost"),
        ("127.0.0.1\x1b[2J:9464", "an IP address or localhost"),
    ],
)
def test_bad_listen_values_are_refused_naming_the_flag(value: str, why: str) -> None:
    with pytest.raises(InputError) as raised:
        parse_listen(value)
    message = str(raised.value)
    assert message.startswith("--listen ") and why in message
    assert message.isprintable()


def _schedule(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "lockctl.json"
    token = tmp_path / "w1.token"
    token.write_text("00000000-0000-0000-0000-000000000000\n")
    token.chmod(0o600)
    job = {
        "lock_key": "locks/a/.lock",
        "ttl": "15s",
        "lock_delay": "15s",
        "renew_interval": "5s",
        "kill_grace": "5s",
        "min_hold": None,
        "schedule": "@every 3s",
        "command": ["/bin/true"],
    }
    consul = {"address": "http://127.0.0.1:9", "token_file": str(token)}  # nothing listens
    config.write_text(
        json.dumps({"format": 1, "worker": "w1", "consul": consul, "jobs": {"a": job}})
    )
    return subprocess.run(
        [sys.executable, "-m", "provision", "schedule", "--config", str(config), *flags],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_a_bad_listen_value_is_exit_2_in_one_line(tmp_path: Path) -> None:
    result = _schedule(tmp_path, "--listen", "127.0.0.1:99999")
    assert result.returncode == EXIT_INPUT
    assert result.stderr.splitlines() == [
        "lockctl: error: --listen 127.0.0.1:99999: the port must be a number from 1 to 65535"
    ]


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind((HOST, 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_a_port_in_use_is_exit_6_in_one_line_before_any_job_starts(
    tmp_path: Path, taken_port: int
) -> None:
    result = _schedule(tmp_path, "--listen", f"{HOST}:{taken_port}")
    assert result.returncode == EXIT_ENVIRONMENT, result.stderr
    assert result.stderr.splitlines() == [
        f"lockctl: error: --listen {HOST}:{taken_port}: the port is in use (another process "
        "listens on it)"
    ]


# -- the listener, over a real socket ----------------------------------------------------------
@pytest.fixture
def listener() -> Iterator[tuple[Listener, LoopCounts]]:
    counts = LoopCounts()
    snapshots = lambda: [("job-a", counts.snapshot())]  # noqa: E731
    served = Listener(
        ListenAddress(HOST, 0),
        metrics_registry(snapshots, "worker-1"),
        lambda: health_verdict(snapshots()),
    )
    served.start()
    yield served, counts
    served.stop()


def _get(listener: Listener, path: str) -> tuple[int, str, str]:
    url = f"http://{HOST}:{listener.port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.headers["Content-Type"], answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read().decode()


def test_metrics_healthz_and_404(listener: tuple[Listener, LoopCounts]) -> None:
    served, counts = listener
    counts.session_made()
    counts.finished(RunResult(Outcome.RAN, 0, 7, TICK, 1.0, start_lag=0.01), NOW)
    counts.helper_event("acquired", None)  # the next tick's run
    status, content_type, text = _get(served, "/metrics")
    assert (status, content_type.split(";")[0]) == (200, "text/plain")
    assert 'lockctl_job_running{job="job-a",worker="worker-1"} 1.0' in text
    assert 'lockctl_skips_total{job="job-a",reason="lock-delay",worker="worker-1"} 0.0' in text
    assert 'lockctl_start_lag_seconds_count{job="job-a",worker="worker-1"} 1.0' in text
    assert _get(served, "/healthz") == (200, "text/plain; charset=utf-8", "ok\n")
    counts.consul_failed("Consul at http://127.0.0.1:9: connection refused", renewing=True)
    status, _, text = _get(served, "/healthz")
    assert status == 503 and text.startswith("job-a: Consul did not answer its last request")
    assert 'lockctl_consul_up{job="job-a",worker="worker-1"} 0.0' in _get(served, "/metrics")[2]
    assert _get(served, "/nope")[0] == 404
    assert _get(served, "/metrics/x")[0] == 404
    assert _get(served, "/metrics?name[]=x")[0] == 200


def test_stop_frees_the_port(listener: tuple[Listener, LoopCounts]) -> None:
    served, _ = listener
    served.stop()
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind((HOST, served.port))  # free again
