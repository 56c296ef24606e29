"""The alerting rules in alerts/ checked and unit-tested by Prometheus's own promtool (Debian's
`prometheus` package, which scripts/install-test-packages installs): the rules parse, each alert
fires on its test series and stays silent on the others, and a broken rule fails the test."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ALERTS = Path(__file__).resolve().parents[2] / "alerts"
RULES = ALERTS / "lockctl.rules.yml"
RULE_TESTS = ALERTS / "lockctl.rules.test.yml"


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: scripts/install-test-packages installs it (root)"
    return subprocess.run(
        [promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_rules_parse() -> None:
    done = _promtool("check", "rules", RULES.name, cwd=ALERTS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 9 rules found" in done.stdout, done.stdout


def test_each_alert_fires_on_its_series_and_only_there() -> None:
    done = _promtool("test", "rules", RULE_TESTS.name, cwd=ALERTS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout, done.stdout


@pytest.mark.parametrize(
    ("rule", "broken"),
    [
        (
            "increase(lockctl_missed_ticks_recorded_total[15m])) > 0",
            "increase(lockctl_missed_ticks_recorded_total[15m])) > 5",
        ),
        (
            "increase(lockctl_run_failures_total[15m])) > 0",
            "increase(lockctl_run_failures_total[15m])) > 1",
        ),
        ("sum by (job) (lockctl_job_running) > 1", "sum by (job) (lockctl_job_running) > 0"),
        ('{result=~"failed|dropped"}', '{result="failed"}'),
        (
            "min by (job) (lockctl_ticks_since_success) >= 3",
            "max by (job) (lockctl_ticks_since_success) >= 3",
        ),
    ],
)
def test_a_broken_rule_fails_its_tests(tmp_path: Path, rule: str, broken: str) -> None:
    text = RULES.read_text()
    assert text.count(rule) == 1, rule
    (tmp_path / RULES.name).write_text(text.replace(rule, broken))
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    done = _promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert done.returncode != 0, done.stdout
    assert "FAILED" in done.stdout + done.stderr
