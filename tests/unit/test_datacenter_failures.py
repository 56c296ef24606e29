"""A datacenter that cannot be read or written: its failure in a few printable words, the exit
code of a command done in some datacenters only, check's verdict with one it cannot vouch for
(pure tables); then status, history, check and pause through the real client, with Consul's
answers faked over HTTP: dc2's calls fail with the client's own errors, dc1's answer, and
dc1's state is still shown in full."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import requests
import responses
from typer.testing import CliRunner

from provision.cli.app import app
from provision.cli.datacenters import DatacentersFailed, Each, Failure, exit_code, failure
from provision.consul.errors import (
    ConsulNotReached,
    ConsulServerError,
    ConsulUnavailable,
    PermissionDenied,
)
from provision.errors import EXIT_CONSUL_API, EXIT_PARTIAL, EXIT_UNAVAILABLE, LockctlError
from provision.ledger.health import State, worst
from provision.ledger.operator import TriggerRefused

ADDRESS = "http://127.0.0.1:8500"
WHERE = f"GET /v1/kv/x on {ADDRESS} (datacenter dc2)"


@pytest.mark.parametrize(
    ("error", "detail", "code", "consul"),
    [
        (
            ConsulServerError("500", status=500, body="No path to datacenter"),
            "Consul answered 500: No path to datacenter",
            5,
            True,
        ),
        (
            PermissionDenied("403", status=403, body="Permission denied"),
            "Consul answered 403: Permission denied",
            4,
            True,
        ),
        (
            ConsulNotReached(f"consul: {WHERE}: cannot connect (ConnectionError)"),
            "Consul not reached: cannot connect (ConnectionError)",
            3,
            True,
        ),
        (
            ConsulUnavailable(f"consul: {WHERE}: no answer within the client timeout"),
            "Consul not reached: no answer within the client timeout",
            3,
            True,
        ),
        (  # Consul's body is untrusted: its first line only, every control escaped
            ConsulServerError("500", status=500, body="\x1b[2Jrpc error\nsecond line"),
            "Consul answered 500: \\x1b[2Jrpc error",
            5,
            True,
        ),
        (ConsulServerError("500", status=503, body=""), "Consul answered 503", 5, True),
        (  # the command's own refusal (a trigger pending there): its words, its code
            LockctlError("job j: a trigger is already pending"),
            "job j: a trigger is already pending",
            1,
            False,
        ),
    ],
)
def test_a_failure_in_a_few_printable_words(
    error: LockctlError, detail: str, code: int, consul: bool
) -> None:
    assert failure("dc2", error) == Failure("dc2", detail, code, consul)


def test_a_long_error_body_is_cut() -> None:
    said = failure("dc2", ConsulServerError("500", status=500, body="x" * 5000)).detail
    assert len(said) < 250 and said.startswith("Consul answered 500: xxx")


@pytest.mark.parametrize(
    ("done", "codes", "expected"),
    [
        (2, [], 0),  # every datacenter done
        (0, [], 0),
        (1, [EXIT_CONSUL_API], EXIT_PARTIAL),  # done in one, failed in another: 7
        (3, [EXIT_UNAVAILABLE, EXIT_CONSUL_API], EXIT_PARTIAL),
        (0, [EXIT_UNAVAILABLE, EXIT_CONSUL_API], EXIT_UNAVAILABLE),  # done nowhere: the first's
        (0, [1], 1),  # a trigger refused in the only datacenter asked
    ],
)
def test_the_exit_code_of_a_command_in_several_datacenters(
    done: int, codes: list[int], expected: int
) -> None:
    failures = [Failure(f"dc{i}", "why", code) for i, code in enumerate(codes)]
    assert exit_code(done, failures) == expected


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ([], State.OK),
        ([State.OK, State.WARNING], State.WARNING),
        ([State.OK, State.UNKNOWN], State.UNKNOWN),  # cannot vouch for one: not OK
        ([State.WARNING, State.UNKNOWN], State.UNKNOWN),  # what was not read may be worse
        ([State.CRITICAL, State.UNKNOWN], State.CRITICAL),  # a judged CRITICAL is not hidden
        ([State.UNKNOWN, State.CRITICAL, State.OK], State.CRITICAL),
    ],
)
def test_checks_verdict_over_datacenters(states: list[State], expected: State) -> None:
    assert worst(states) is expected


class _Stub:
    def __init__(self, datacenter: str | None = None) -> None:
        self.datacenter = datacenter

    def in_datacenter(self, datacenter: str | None) -> _Stub:
        return _Stub(datacenter)


def test_a_datacenter_that_failed_is_not_asked_again() -> None:
    asked: list[str] = []

    def act(consul: Any) -> str:
        asked.append(consul.datacenter)
        if consul.datacenter == "dc2":
            raise ConsulNotReached("consul: GET /v1/kv/x: cannot connect (ConnectTimeout)")
        return f"read in {consul.datacenter}"

    each = Each(_Stub())  # type: ignore[arg-type]
    answers = [each.ask(dc, act) for dc in ("dc1", "dc2", "dc1", "dc2", "dc3")]
    assert answers == ["read in dc1", None, "read in dc1", None, "read in dc3"]
    assert asked == ["dc1", "dc2", "dc1", "dc3"]  # dc2 cost its timeout once
    assert each.done == {"dc1", "dc3"} and list(each.lost) == ["dc2"]
    assert [lost.datacenter for lost in each.failures] == ["dc2"]


def test_a_refusal_of_one_job_leaves_its_datacenters_other_jobs_asked() -> None:
    """Not Consul failing: the command refused for one job there (its trigger refused). The
    datacenter's other jobs are still asked; the end says which failed, exit 7."""
    asked: list[tuple[str, str]] = []

    def act(job: str) -> Any:
        def on(consul: Any) -> str:
            asked.append((consul.datacenter, job))
            if (consul.datacenter, job) == ("dc2", "a"):
                raise TriggerRefused("job a is paused: not triggered")
            return f"{job} in {consul.datacenter}"

        return on

    each = Each(_Stub())  # type: ignore[arg-type]
    answers = [each.ask(dc, act(job)) for dc in ("dc1", "dc2") for job in ("a", "b")]
    assert answers == ["a in dc1", "b in dc1", None, "b in dc2"]
    assert asked == [("dc1", "a"), ("dc1", "b"), ("dc2", "a"), ("dc2", "b")]
    assert each.lost == {} and each.failure_in("dc2").detail == "job a is paused: not triggered"
    with pytest.raises(DatacentersFailed) as failed:
        each.end("failed")
    assert failed.value.exit_code == EXIT_PARTIAL


# --- the commands, through the real client; Consul's answers faked over HTTP ---

SPEC = """worker "w-east" {
  address    = "http://127.0.0.1:8500"
  datacenter = "dc1"
}
worker "w-west" {
  address    = "http://127.0.0.1:8500"
  datacenter = "dc2"
}
job "report" {
  prefix   = "jobs/report/"
  workers  = ["w-east", "w-west"]
  scope    = "datacenter"
  schedule = "@every 6h"
  command  = ["/bin/true"]
}
"""
DATE = "Mon, 05 Jan 2026 19:00:00 GMT"  # Consul's clock, as every answer's Date says
NO_PATH = (500, "No path to datacenter")


def _fake_consul(dc2: tuple[int, str] | Exception) -> None:
    """dc1's KV is empty (404), its writes succeed, the token is alice's; every call sent
    with `?dc=dc2` fails with `dc2`: an error answer, or the connection's own error."""

    def answer(request: Any) -> tuple[int, dict[str, str], str]:
        headers = {"Date": DATE, "X-Consul-Index": "7"}
        if "dc=dc2" in request.url:
            if isinstance(dc2, Exception):
                raise dc2
            return dc2[0], headers, dc2[1]
        if "/v1/acl/token/self" in request.url:
            return 200, headers, json.dumps({"AccessorID": "a1", "Description": "alice"})
        if request.method == "PUT":
            return 200, headers, "true"
        return 404, headers, ""

    for method in ("GET", "PUT", "DELETE"):
        responses.add_callback(method, re.compile(rf"{re.escape(ADDRESS)}/v1/.*"), answer)


def _invoke(tmp_path: Path, *argv: str) -> Any:
    spec = tmp_path / "locks.hcl"
    spec.write_text(SPEC)
    flags = ["--spec", str(spec), "--address", ADDRESS, "--timeout", "1"]
    return CliRunner().invoke(app, [*argv, *flags])


@responses.activate
def test_status_shows_dc1_in_full_and_says_dc2_could_not_be_read(tmp_path: Path) -> None:
    _fake_consul(NO_PATH)
    result = _invoke(tmp_path, "status", "--json")
    rows = json.loads(result.stdout)
    assert [(row["job"], row["datacenter"], row.get("held")) for row in rows] == [
        ("report", "dc1", False),
        ("report", "dc2", None),
    ]
    assert rows[1] == {  # what could not be read says so in the document too
        "job": "report",
        "datacenter": "dc2",
        "error": "could not be read: Consul answered 500: No path to datacenter",
    }
    assert result.stderr.splitlines() == [
        "lockctl: error: dc2: could not be read: Consul answered 500: No path to datacenter",
        "lockctl: error: failed in dc2 (1 of 2 datacenters done)",
    ]
    assert result.exit_code == EXIT_PARTIAL


@responses.activate
def test_history_shows_dc1_and_says_dc2_was_not_reached(tmp_path: Path) -> None:
    _fake_consul(requests.exceptions.ConnectionError("connection reset"))
    result = _invoke(tmp_path, "history", "--json")
    entries = json.loads(result.stdout)
    assert [(entry["datacenter"], "ticks" in entry) for entry in entries] == [
        ("dc1", True),
        ("dc2", False),
    ]
    assert entries[1]["error"] == (
        "could not be read: Consul not reached: connection failed (ConnectionError)"
    )
    lines = result.stderr.splitlines()
    assert lines[0] == "lockctl: error: dc2: could not be read: Consul not reached: " + (
        "connection failed (ConnectionError)"
    )
    assert result.exit_code == EXIT_PARTIAL


@responses.activate
def test_history_tables_show_dc1_before_the_line_about_dc2(tmp_path: Path) -> None:
    _fake_consul((403, "Permission denied"))
    result = _invoke(tmp_path, "history")
    assert "report in dc1: @every 6h (UTC)" in result.stdout
    assert "report in dc2" not in result.stdout
    assert "dc2: could not be read: Consul answered 403: Permission denied" in result.stderr
    assert result.exit_code == EXIT_PARTIAL


@responses.activate
def test_check_judges_dc1_and_is_unknown_for_dc2(tmp_path: Path) -> None:
    _fake_consul(NO_PATH)
    result = _invoke(tmp_path, "check")
    assert result.stdout.splitlines() == [
        "UNKNOWN: 2 jobs, 1 unknown (report in dc2), 1 ok",
        "OK report in dc1: no ticks recorded yet, next 2026-01-06T00:00:00Z",
        "UNKNOWN report in dc2: could not be read: Consul answered 500: No path to datacenter",
    ]
    assert result.exit_code == State.UNKNOWN


@responses.activate
def test_pause_goes_on_in_dc1_and_says_dc2_failed(tmp_path: Path) -> None:
    _fake_consul((403, "Permission denied"))
    result = _invoke(tmp_path, "pause", "report")
    assert result.stdout.startswith("dc1: job report paused by alice at "), result.output
    assert result.stderr.splitlines() == [
        "lockctl: error: dc2: failed: Consul answered 403: Permission denied",
        "lockctl: error: failed in dc2 (1 of 2 datacenters done)",
    ]
    assert result.exit_code == EXIT_PARTIAL


@responses.activate
def test_only_a_datacenter_that_fails_is_its_failures_own_code(tmp_path: Path) -> None:
    _fake_consul(NO_PATH)
    result = _invoke(tmp_path, "status", "--datacenter", "dc2", "--json")
    assert result.stdout == "" and result.exit_code == EXIT_CONSUL_API  # nothing done: not 7
    assert result.stderr.splitlines() == [
        "lockctl: error: dc2: could not be read: Consul answered 500: No path to datacenter",
        "lockctl: error: failed in dc2 (0 of 1 datacenters done)",
    ]


@responses.activate
def test_abort_where_the_job_runs_nowhere_says_each_and_exits_1(tmp_path: Path) -> None:
    """Not running in a datacenter is not a failure there (nothing to stop); running in none
    of them is the single datacenter's refusal: exit 1, not 7."""
    _fake_consul((404, ""))
    result = _invoke(tmp_path, "abort", "report")
    assert result.stdout.splitlines() == [
        "dc1: job report is not running: nothing aborted",
        "dc2: job report is not running: nothing aborted",
    ]
    assert result.stderr.splitlines() == [
        "lockctl: error: job report is not running in any of its datacenters: nothing aborted"
    ]
    assert result.exit_code == 1


@responses.activate
def test_abort_with_a_datacenter_unread_is_partial(tmp_path: Path) -> None:
    _fake_consul(NO_PATH)
    result = _invoke(tmp_path, "abort", "report")
    assert result.stdout.splitlines() == ["dc1: job report is not running: nothing aborted"]
    assert "lockctl: error: dc2: failed: Consul answered 500: No path to datacenter" in (
        result.stderr
    )
    assert result.exit_code == EXIT_PARTIAL  # dc2 could not be told: it may run there
