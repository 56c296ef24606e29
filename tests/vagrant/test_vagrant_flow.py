"""The Vagrant flow end to end (issue 7): real VMs, `lockctl verify` over them, the tick check,
the scheduler service (issue 15).

Root, about 10 minutes: `make test` runs it after the rest of the suite (scripts/check), and so
does CI; by hand: `.venv/bin/pytest -m vagrant tests/vagrant` (a plain `pytest` leaves it out).
It runs `scripts/vagrant-verify` (what `make vagrant-verify` runs) and asserts on the artifacts it
keeps in .lockctl/vagrant/: the JUnit report of `lockctl verify` is all green over HTTPS, its
`tls-http` and `gossip-encrypted` checks included (issue 16: the VMs' agents serve HTTPS only,
verify certificates both ways and encrypt gossip), and the tick check
saw each tick run exactly once (from the ledger, the job's own log and the runners' events), and
so did the scheduler check of lockctl-scheduler.service on both workers, stopped cleanly.
LOCKCTL_VAGRANT_REPORT_ONLY=1 asserts on the last run's artifacts without starting VMs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / ".lockctl" / "vagrant"
# A bound, not a speed target: the flow takes about 11-13 minutes cold on 2 cores (docs/vagrant.md).
FLOW_TIMEOUT = 35 * 60  # CI took 24.8 min with the tick job on @every 20s; 30s adds a minute
TEARDOWN_TIMEOUT = 10 * 60

pytestmark = pytest.mark.vagrant


@pytest.fixture(scope="module")
def flow() -> dict[str, object]:
    """Run the flow once (unless only the last report is asked for); its summary.json.

    Deselected by default (pyproject's addopts say -m 'not vagrant'); `pytest -m vagrant` runs it.
    On timeout the flow gets SIGTERM, so its exit trap tears the VMs and daemons down.
    """
    if os.environ.get("LOCKCTL_VAGRANT_REPORT_ONLY") != "1":
        if os.geteuid() != 0:
            pytest.skip("the Vagrant flow needs root (network namespace, libvirtd)")
        flow_process = subprocess.Popen([str(REPO / "scripts" / "vagrant-verify")], cwd=REPO)
        try:
            returncode = flow_process.wait(timeout=FLOW_TIMEOUT)
        except subprocess.TimeoutExpired:
            flow_process.terminate()
            flow_process.wait(timeout=TEARDOWN_TIMEOUT)
            pytest.fail(f"scripts/vagrant-verify ran past {FLOW_TIMEOUT} s; stopped")
        print(f"scripts/vagrant-verify exit {returncode}")
    summary = json.loads((ARTIFACTS / "summary.json").read_text(encoding="utf-8"))
    assert isinstance(summary, dict)
    return summary


def test_flow_succeeded_left_nothing_behind_and_leaked_no_secret(flow: dict[str, object]) -> None:
    report = (ARTIFACTS / "report.txt").read_text(encoding="utf-8")
    assert flow["exit_status"] == 0, report
    assert "LEFT BEHIND" not in report
    # The teardown searched everything the flow keeps, its whole output included, for the token
    # secrets it minted (management and workers'), every line of each TLS private key it made
    # (CA, 5 agents, lockctl's) and the gossip key, and found none.
    assert "SECRET FOUND" not in report
    assert re.search(
        r"none of the \d+ token secrets, 7 TLS private keys \(\d+ lines\) and the gossip key is in"
        r" the artifacts or the output",
        report,
    ), report


NEEDS_A_JWT = {"login-confined", "login-refused", "login-expiry"}
# the flow hands verify no operator's token (--operator-token-file): its break check is proven
# on the local cluster by tests/integration/test_verify.py and test_break_lock.py
NEEDS_AN_OPERATOR_TOKEN = {"operator-token-break"}


def test_verify_report_is_all_green(flow: dict[str, object]) -> None:
    root = ET.parse(ARTIFACTS / "verify.xml").getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    cases = [case for suite in suites for case in suite.iter("testcase")]
    names = {case.get("name") for case in cases}
    failed = [
        case.get("name")
        for case in cases
        if case.find("failure") is not None or case.find("error") is not None
    ]
    skipped = [case.get("name") for case in cases if case.find("skipped") is not None]
    assert not failed
    # The flow gives the management token: every check really ran, but the login checks, which
    # need a JWT of a worker's identity and say "not applicable" (the VMs' spec declares no auth
    # method; login is proven on the local cluster by tests/integration/test_login.py).
    allowed = NEEDS_A_JWT | NEEDS_AN_OPERATOR_TOKEN
    assert [name for name in skipped if name not in allowed] == []
    reasons = [case.find("skipped") for case in cases if case.find("skipped") is not None]
    assert all(r.get("message", "").startswith("not applicable: ") for r in reasons), reasons
    checks = (
        "tls-http",
        "gossip-encrypted",
        "anonymous-denied",
        "worker-token-allowed",
        "single-holder",
        "lock-delay",
        "tick-once",
    )
    for check in checks:
        assert any(check in (name or "") for name in names), names


def test_each_tick_ran_exactly_once_from_the_ledger_without_min_hold(
    flow: dict[str, object],
) -> None:
    """The job has a schedule and no min_hold and takes milliseconds; both workers' timers fire
    at every tick. The ledger has one succeeded record per tick, the job ran once for each (on
    the worker the record names, with its LockIndex), and the other runner skipped the tick
    because it was taken (vagrant/flow/ticks.py checks it all; this reads its evidence)."""
    spec = (ARTIFACTS / "logs" / "spec.hcl").read_text(encoding="utf-8")
    assert not re.search(r"^\s*min_hold\s*=", spec, re.MULTILINE), spec
    assert re.search(r'^\s*schedule\s*=\s*"@every ', spec, re.MULTILINE), spec
    ticks = json.loads((ARTIFACTS / "ticks.json").read_text(encoding="utf-8"))
    assert ticks["passed"], ticks["problems"]
    # A tick a stalled VM started past its deadline ran nowhere and is recorded missed, with
    # the late runner's numbers (ticks.py); every other ran once. Six at least ran.
    late = ticks["missed_late"]
    assert len(ticks["ticks"]) - len(late) >= 6, late
    assert ticks["ticks_run_once"] == len(ticks["ticks"]) - len(late)
    for tick in ticks["ticks"]:
        if tick["tick"] in late:
            assert (tick["outcome"], tick["runs"]) == ("missed", []), tick
            continue
        assert tick["outcome"] == "succeeded", tick
        assert [run["worker"] for run in tick["runs"]] == [tick["claimed_by"]]
        assert [run["lock_index"] for run in tick["runs"]] == [tick["lock_index"]]
    # The race was real: on most ticks both runners answered, one ran it, the other was told it
    # was taken. Not on every tick: in emulated VMs a run takes 5-24 s of the 30 s between ticks
    # (mostly Python's start), and a timer that elapses while its service still runs starts
    # nothing (systemd). Exactly-once above holds on every tick regardless.
    raced = [t for t in ticks["ticks"] if "-" not in t["fired"].values()]
    assert len(raced) >= len(ticks["ticks"]) / 2, ticks["ticks"]
    for tick in raced:
        did = sorted(tick["fired"].values())
        assert did[0] == "ran it" and all("(taken by " in other for other in did[1:]), tick


def test_the_scheduler_service_ran_each_tick_once_and_stopped_cleanly(
    flow: dict[str, object],
) -> None:
    """After the timers, lockctl-scheduler.service (as `lockctl worker-config` wrote it) ran on
    both workers for ~30 s of an `@every 5s` job, then `systemctl stop` ended each
    (vagrant/flow/sched_check.py checks it all; this reads its evidence): every tick of the
    window has one succeeded record and one run of the job, on the worker the record names with
    its LockIndex; no overlap; each scheduler exited 0 (Result=success) on SIGTERM, destroyed its
    sessions, none is left in Consul; no error event in either journal."""
    spec = (ARTIFACTS / "logs" / "spec.hcl").read_text(encoding="utf-8")
    assert re.search(r'job "vagrant-sched" \{[^}]*schedule = "@every 5s"', spec), spec
    sched = json.loads((ARTIFACTS / "scheduler.json").read_text(encoding="utf-8"))
    assert flow["scheduler_check_passed"] is True
    assert sched["passed"], sched["problems"]
    assert sched["job"] == "vagrant-sched"
    assert len(sched["window"]) >= 4
    recorded = {tick["tick"] for tick in sched["ticks"]}
    assert set(sched["window"]) <= recorded
    assert sched["ticks_run_once"] == len(sched["ticks"])
    for tick in sched["ticks"]:
        assert tick["outcome"] == "succeeded", tick
        assert [run["worker"] for run in tick["runs"]] == [tick["claimed_by"]]
        assert [run["lock_index"] for run in tick["runs"]] == [tick["lock_index"]]
    assert sum(sched["ran_by"].values()) == len(sched["ticks"])
    for worker, stop in sched["stops"].items():
        assert stop.startswith("Result=success exit 0 "), (worker, stop)
    assert json.loads((ARTIFACTS / "logs" / "sched-sessions-left.json").read_text()) == []
