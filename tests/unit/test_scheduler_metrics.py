"""`lockctl schedule --listen`: the pure parts (skip reasons, counts from events, the health
verdict, the flag), the loop's own overlap skip counted, and the listener over real sockets."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from provision.consul.models import KVEntry
from provision.errors import EXIT_ENVIRONMENT, EXIT_INPUT, InputError
from provision.ledger.records import TickOutcome, TickRecord, taken_fields
from provision.runner.tick_lock import TickLock
from provision.scheduler.counts import (
    LOCK_DELAY,
    OTHER,
    OVERLAP,
    TAKEN,
    CountsSnapshot,
    LoopCounts,
    Observations,
    SessionState,
    observed,
    skip_reason,
)
from provision.scheduler.exposition import health_verdict, metrics_registry
from provision.scheduler.listen import ListenAddress, Listener, parse_listen
from provision.scheduler.loop import CountingEventLog, JobTicks
from provision.workers.config import JobConfig, JobTimings

TICK = datetime(2026, 12, 1, 13, 0, 5, tzinfo=timezone.utc)
HOST = "127.0.0.1"


# -- skip reasons: every reason lockctl writes, classified ----------------------------------
def _job(schedule: str = "@every 3s") -> JobConfig:
    return JobConfig(
        "job-a", "locks/a/.lock", JobTimings(15.0, 15.0, 5.0, 5.0, 0.0), schedule, command=("true",)
    )


class _KV:
    def __init__(self, value: dict[str, str]) -> None:
        self.value = json.dumps(value).encode()

    def get(self, key: str) -> tuple[KVEntry, int]:
        return KVEntry(key, self.value, 0, "holder-session", 3, 1, 3), 3


class _Consul:
    def __init__(self, holder: dict[str, str]) -> None:
        self.kv = _KV(holder)


def _engine_refusal(holder: dict[str, str], refusal: str | None = None) -> dict[str, object]:
    """The `skipped` fields the engine's TickLock writes when the lock refused the claim."""
    lock = TickLock(_Consul(holder), _job(), "worker-1", TICK)  # type: ignore[arg-type]
    lock._lock_refusal = refusal
    return lock._lock_fields()


def _taken(outcome: TickOutcome, worker: str | None = "worker-2") -> dict[str, object]:
    return taken_fields(TickRecord(TICK, outcome, worker=worker))


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        (_taken(TickOutcome.RUNNING), TAKEN),
        (_taken(TickOutcome.SUCCEEDED), TAKEN),
        (_taken(TickOutcome.MISSED), TAKEN),
        (_taken(TickOutcome.UNREADABLE, None), TAKEN),
        (_taken(TickOutcome.RUNNING, "overlap: x"), TAKEN),  # a hostile worker name changes nothing
        (_engine_refusal({"worker": "worker-2", "tick": "2026-12-01T13:00:02Z"}), OVERLAP),
        (_engine_refusal({"worker": "worker-2"}, "lock delay in effect"), LOCK_DELAY),
        (_engine_refusal({"worker": "worker-2"}), OTHER),  # held, no tick: a plain `lockctl run`
        (_engine_refusal({"worker": "x (claims lock-delay) overlap, "}), OTHER),
        ({"reason": "overlap: 2 tick(s) passed while tick 2026-12-01T13:00:02Z ran here"}, OVERLAP),
        ({"reason": "tick 2026-12-01T13:00:05Z has not come on the Consul agent's clock"}, OTHER),
        ({"reason": "tick x: something new"}, OTHER),
        ({"reason": 42}, OTHER),
        ({}, OTHER),
    ],
)
def test_skip_reason_is_one_of_a_fixed_few(fields: dict[str, object], reason: str) -> None:
    assert skip_reason(fields) == reason


# -- counts from events ------------------------------------------------------------------------
def _replay(*events: tuple[str, dict[str, Any]], now: float = TICK.timestamp()) -> CountsSnapshot:
    state = CountsSnapshot()
    for event, fields in events:
        state = observed(state, event, fields, now)
    return state


def test_acquired_means_running_until_released_or_lost_and_measures_the_start_lag() -> None:
    acquired = ("acquired", {"tick": "2026-12-01T13:00:05Z"})
    running = _replay(acquired, now=TICK.timestamp() + 0.008)
    assert running.running
    assert running.lags.total == pytest.approx(0.008, abs=1e-5)
    assert running.lags.cumulative()[:3] == [("0.005", 0), ("0.01", 1), ("0.025", 1)]
    assert not _replay(acquired, ("released", {})).running
    assert not _replay(acquired, ("lost", {})).running
    assert _replay(("acquired", {"tick": "not a tick"})).lags.counts == ()  # no lag, no crash


def test_session_events_give_the_session_state() -> None:
    assert _replay().session is SessionState.NOT_YET
    assert _replay(("session-created", {})).session is SessionState.VALID
    assert _replay(("session-created", {}), ("session-lost", {})).session is SessionState.LOST
    destroyed = _replay(("session-created", {}), ("session-destroyed", {}))
    assert destroyed.session is SessionState.NOT_YET


def test_consul_up_follows_the_last_answer() -> None:
    failed = _replay(("renew-failed", {"error": "Consul at http://a: no answer in 2s\x1b[2J"}))
    assert (failed.consul_up, failed.renew_failures) == (False, 1)
    assert failed.consul_error is not None and "\x1b" not in failed.consul_error
    assert _replay(("renew-failed", {"error": "x"}), ("renewed", {})).consul_up
    assert _replay(
        ("renew-failed", {"error": "x"}), ("skipped", _taken(TickOutcome.RUNNING))
    ).consul_up
    # the loop's own overlap skip asks Consul nothing: it says nothing about Consul
    overlap = {"reason": "overlap: 1 tick(s) passed while tick T ran here", "ticks": 1}
    assert not _replay(("renew-failed", {"error": "x"}), ("skipped", overlap)).consul_up
    assert not _replay(("housekeeping-failed", {"warning": "x"})).consul_up


def test_skips_count_by_reason_and_by_the_ticks_an_overlap_passed() -> None:
    state = _replay(
        ("skipped", _taken(TickOutcome.RUNNING)),
        ("skipped", {"reason": "overlap: 3 tick(s) passed while tick T ran here", "ticks": 3}),
        ("skipped", {"reason": "tick x: held", "ticks": True}),  # not a count: one
    )
    assert state.skips == {TAKEN: 1, OVERLAP: 3, OTHER: 1}


def test_histogram_buckets_are_cumulative_with_inf() -> None:
    seen = Observations((1.0, 10.0)).added(0.5).added(1.0).added(5.0).added(99.0)
    assert seen.cumulative() == [("1.0", 2), ("10.0", 3), ("+Inf", 4)]
    assert seen.total == pytest.approx(105.5)


def test_the_loop_counts_an_overlap_skip_as_skipped_ticks_with_its_reason() -> None:
    counts = LoopCounts()
    stream = io.StringIO()
    now = [TICK + timedelta(seconds=10.5)]
    events = CountingEventLog("job-a", "worker-1", stream, counts)
    ticks = JobTicks(None, _job(), "worker-1", events, None, wall=lambda: now[0], counts=counts)  # type: ignore[arg-type]
    ticks._last_tick = TICK  # a run of TICK lasted until now: ticks +3, +6 and +9 s passed
    ticks.next_turn()
    snap = counts.snapshot()
    assert snap.outcomes == {"skipped": 3}
    assert snap.skips == {OVERLAP: 3}
    assert json.loads(stream.getvalue())["ticks"] == 3


# -- the health verdict ------------------------------------------------------------------------
def test_health_is_ok_when_every_loop_is_answered_and_has_a_session_or_needs_none() -> None:
    assert health_verdict([("a", CountsSnapshot()), ("b", _replay(("session-created", {})))]) == (
        health_verdict([("a", CountsSnapshot())])
    )
    verdict = health_verdict([("a", CountsSnapshot())])
    assert (verdict.status, verdict.text) == (200, "ok")


def test_health_says_which_job_and_why_in_one_line_nothing_raw() -> None:
    down = _replay(("renew-failed", {"error": "connection refused\n\x1b]0;pwned\x07" + "x" * 900}))
    lost = _replay(("session-created", {}), ("session-lost", {}))
    verdict = health_verdict([("ok-job", CountsSnapshot()), ("a", down), ("b\x1b", lost)])
    assert verdict.status == 503
    assert verdict.text.startswith("a: Consul did not answer its last request (connection refused")
    assert "b\\x1b: its session was lost" in verdict.text
    assert verdict.text.isprintable() and len(verdict.text) <= 400
    assert "ok-job" not in verdict.text
    assert health_verdict([]).status == 503


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
    counts.observe("session-created", {}, 0.0)
    counts.observe("acquired", {"tick": "2026-12-01T13:00:05Z"}, TICK.timestamp() + 0.01)
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
