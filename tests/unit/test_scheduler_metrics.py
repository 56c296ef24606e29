"""`lockctl schedule --listen`: why a claim was refused in a word, the skip reasons' labels,
an unforeseen error said in one line, the flag, and the listener over real sockets serving a
CoreReport (scheduler/report.py)."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

from provision.errors import EXIT_ENVIRONMENT, EXIT_INPUT, InputError
from provision.ledger.records import TickOutcome, TickRecord, tick_name
from provision.runner.results import SkipReason
from provision.runner.tick_verdicts import refused_skip
from provision.scheduler.listen import Health, ListenAddress, Listener, parse_listen
from provision.scheduler.report import SKIP_REASONS, CoreReport, unexpected
from provision.tick.edge import Note

TICK = datetime(2026, 12, 1, 13, 0, 5, tzinfo=timezone.utc)
HOST = "127.0.0.1"


# -- why a claim was refused: decided where it is, in a word ----------------------------------
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
        "blackout",
        "other",
        "at-capacity",
    ]
    # `lockctl run`'s word for a refused claim is the same word
    assert [reason.value for reason in SkipReason] == [reason.value for reason in SKIP_REASONS]


# -- an error nobody foresaw ---------------------------------------------------------------------
def test_an_unexpected_error_is_said_in_one_line_naming_where_in_lockctl_it_was_raised() -> None:
    try:
        tick_name(None)  # type: ignore[arg-type]  # a value nobody foresaw reaches lockctl's code
    except AttributeError as exc:
        said = unexpected(exc)
    assert said.startswith("unexpected AttributeError at records.py:"), said
    assert "\n" not in said and "Traceback" not in said
    assert unexpected(ValueError("x")) == "unexpected ValueError: x"  # raised nowhere: no place


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
CLAIMED = TickRecord(TICK, TickOutcome.RUNNING, worker="worker-1", session="s-1", lock_index=7)


@pytest.fixture
def listener() -> Iterator[tuple[Listener, CoreReport]]:
    report = CoreReport("worker-1", io.StringIO())
    report.schedule_known("job-a", "@every 3s", "UTC")

    def health() -> Health:
        verdict = report.verdict()
        return Health(verdict.status, verdict.text)

    served = Listener(ListenAddress(HOST, 0), report.registry, health)
    served.start()
    yield served, report
    served.stop()


def _get(listener: Listener, path: str) -> tuple[int, str, str]:
    url = f"http://{HOST}:{listener.port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.headers["Content-Type"], answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read().decode()


def test_metrics_healthz_and_404(listener: tuple[Listener, CoreReport]) -> None:
    served, report = listener
    report(Note("session-created", "", None, "TTL 15s, LockDelay 15s"))
    report(Note("claimed", "job-a", TICK, record=CLAIMED))  # the tick's run goes on
    status, content_type, text = _get(served, "/metrics")
    assert (status, content_type.split(";")[0]) == (200, "text/plain")
    assert 'lockctl_job_running{job="job-a",worker="worker-1"} 1.0' in text
    assert 'lockctl_skips_total{job="job-a",reason="lock-delay",worker="worker-1"} 0.0' in text
    assert (
        'lockctl_job_info{job="job-a",schedule="@every 3s",timezone="UTC",worker="worker-1"}'
        in (text)
    )
    assert _get(served, "/healthz") == (200, "text/plain; charset=utf-8", "ok\n")
    report(Note("unavailable", "job-a", None, "Consul at http://127.0.0.1:9: connection refused"))
    status, _, text = _get(served, "/healthz")
    assert status == 503 and text.startswith("job-a: Consul did not answer its last request")
    assert 'lockctl_consul_up{job="job-a",worker="worker-1"} 0.0' in _get(served, "/metrics")[2]
    assert _get(served, "/nope")[0] == 404
    assert _get(served, "/metrics/x")[0] == 404
    assert _get(served, "/metrics?name[]=x")[0] == 200


def test_stop_frees_the_port(listener: tuple[Listener, CoreReport]) -> None:
    served, _ = listener
    served.stop()
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind((HOST, served.port))  # free again
