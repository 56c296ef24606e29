"""One timings model: the spec validator and the worker-config loader accept and refuse the same
timings and counts, at every bound, because both check them with provision.timings."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from provision.durations import format_duration
from provision.spec import SpecError, parse_spec
from provision.timings import (
    BOUNDS,
    COUNT_BOUNDS,
    COUNT_DEFAULTS,
    DEFAULTS,
    count_problem,
    fencing_problem,
    renew_problem,
)
from provision.workers.config import ConfigError, load_worker_config

# Timings every bound can be varied against: each field at a value far from its own bounds.
BASE = {"ttl": "60s", "lock_delay": "60s", "renew_interval": "10s", "kill_grace": "5s"}
STEP = 0.001  # seconds: just outside a bound (Go durations down to the millisecond)


def _bound_cases() -> list[tuple[str, float]]:
    cases = []
    for field, (low, high) in BOUNDS.items():
        cases += [(field, low), (field, high), (field, low - STEP), (field, high + STEP)]
    return cases


def _count_cases() -> list[tuple[str, Any]]:
    cases: list[tuple[str, Any]] = []
    for field, (low, high) in COUNT_BOUNDS.items():
        cases += [(field, low), (field, high), (field, low - 1), (field, high + 1)]
        cases += [(field, str(low)), (field, float(low)), (field, True), (field, 10**200)]
    return cases


def _fields_refused_by_spec(timings: dict[str, Any]) -> set[str]:
    """Values are written as JSON, which is also their HCL literal (a string, number or bool)."""
    lines = "\n".join(f"  {key} = {json.dumps(value)}" for key, value in timings.items())
    text = f'worker "w" {{}}\njob "a" {{\n  prefix = "locks/a/"\n  workers = ["w"]\n{lines}\n}}\n'
    try:
        parse_spec(text, "s.hcl")
    except SpecError as exc:
        return _fields_named([str(problem) for problem in exc.problems] or [str(exc)])
    return set()


def _fields_refused_by_config(timings: dict[str, Any], tmp_path: Path) -> set[str]:
    job = {"lock_key": "locks/a/.lock", "min_hold": None, "schedule": None, **timings}
    config = {
        "format": 1,
        "worker": "w",
        "consul": {"address": "http://127.0.0.1:8500", "token_file": "/x/w.token"},
        "jobs": {"a": job},
    }
    path = tmp_path / "lockctl.json"
    path.write_text(json.dumps(config))
    try:
        load_worker_config(path)
    except ConfigError as exc:
        return _fields_named(exc.lines)
    return set()


def _fields_named(problems: list[str]) -> set[str]:
    """The timing fields the problems are reported on (the field before the message's colon)."""
    fields = set()
    names = "|".join([*BOUNDS, *COUNT_BOUNDS])
    for problem in problems:
        found = re.search(rf"\.({names}): ", problem)
        assert found, problem
        fields.add(found.group(1))
    return fields


@pytest.mark.parametrize(("field", "seconds"), _bound_cases())
def test_spec_and_worker_config_agree_at_every_bound(
    field: str, seconds: float, tmp_path: Path
) -> None:
    timings = {**BASE, field: format_duration(seconds) if seconds >= 0 else "-1ms"}
    by_spec = _fields_refused_by_spec(timings)
    by_config = _fields_refused_by_config(timings, tmp_path)
    assert by_spec == by_config
    low, high = BOUNDS[field]
    if not low <= seconds <= high:
        assert field in by_spec  # outside the bounds is refused, by both


@pytest.mark.parametrize(("field", "value"), _count_cases())
def test_spec_and_worker_config_agree_on_counts(field: str, value: Any, tmp_path: Path) -> None:
    values = {**BASE, field: value}
    by_spec = _fields_refused_by_spec(values)
    assert by_spec == _fields_refused_by_config(values, tmp_path)
    low, high = COUNT_BOUNDS[field]
    whole = type(value) is int
    assert (field in by_spec) == (not whole or not low <= value <= high)


def test_the_new_fields_have_their_documented_bounds_and_defaults() -> None:
    assert (BOUNDS["start_deadline"], DEFAULTS["start_deadline"]) == ((1.0, 86400.0), "5m")
    assert (COUNT_BOUNDS["history_limit"], COUNT_DEFAULTS["history_limit"]) == ((10, 10000), 50)
    assert count_problem("history_limit", 10**200) == "the number is outside 10..10000"


@pytest.mark.parametrize(
    ("timings", "refused"),
    [
        (BASE, set()),
        ({**BASE, "renew_interval": "30s"}, {"renew_interval"}),  # not below ttl/2
        ({**BASE, "renew_interval": "29.999s"}, set()),
        ({**BASE, "lock_delay": "16s"}, {"lock_delay"}),  # = R + G + margin: fencing bound
        ({**BASE, "lock_delay": "16.001s"}, set()),
        ({**BASE, "renew_interval": "30s", "lock_delay": "30s"}, {"renew_interval"}),
        ({**BASE, "kill_grace": "1m"}, {"lock_delay"}),  # within bounds, breaks fencing
    ],
)
def test_spec_and_worker_config_agree_on_the_rules_between_fields(
    timings: dict[str, str], refused: set[str], tmp_path: Path
) -> None:
    assert _fields_refused_by_spec(timings) == refused
    assert _fields_refused_by_config(timings, tmp_path) == refused


@pytest.mark.parametrize(
    ("renew", "ttl", "ok"), [(4.999, 10.0, True), (5.0, 10.0, False), (1.0, 10.0, True)]
)
def test_renew_interval_must_stay_below_half_the_ttl(renew: float, ttl: float, ok: bool) -> None:
    assert (renew_problem(renew, ttl) is None) == ok


@pytest.mark.parametrize(
    ("delay", "renew", "grace", "ok"),
    [(15.0, 5.0, 5.0, True), (11.0, 5.0, 5.0, False), (11.001, 5.0, 5.0, True), (0, 1, 0, False)],
)
def test_fencing_bound(delay: float, renew: float, grace: float, ok: bool) -> None:
    assert (fencing_problem(delay, renew, grace) is None) == ok
