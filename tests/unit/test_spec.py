"""The spec: golden cases (tests/golden/spec/CASE.hcl -> CASE.json), durations, the HCL walk."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from provision.durations import DurationSyntaxError
from provision.errors import EXIT_INPUT, InputError
from provision.spec import (
    MAX_SPEC_BYTES,
    Job,
    Spec,
    SpecError,
    format_duration,
    load_spec,
    parse_duration,
    parse_spec,
)
from provision.spec.hcl import Unsupported
from provision.spec.hcl_parse import parse_hcl
from provision.spec.names import (
    DEFAULT_OWNER,
    is_valid_name,
    lock_policy_name,
    session_policy_name,
)

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "spec"
CASES = sorted(path.stem for path in GOLDEN.glob("*.hcl"))
EXAMPLE = Path(__file__).resolve().parents[2] / "policies" / "locks.hcl"


def _describe(spec: Spec) -> dict[str, Any]:
    """The golden JSON form of a valid spec (timings in seconds, as the job carries them)."""

    jobs = [
        {
            "name": job.name,
            "prefix": job.prefix,
            "workers": list(job.workers),
            "ttl": job.timings.ttl,
            "lock_delay": job.timings.lock_delay,
            "renew_interval": job.timings.renew_interval,
            "kill_grace": job.timings.kill_grace,
            "min_hold": job.timings.min_hold,
            "schedule": job.schedule,
            "timezone": job.timezone,
            "start_deadline": job.timings.start_deadline,
            "history_limit": job.history_limit,
            "command": list(job.command) if job.command else None,
            "timeout": job.timings.timeout,
            **({"catchup": job.catchup} if job.catchup != "skip" else {}),
            **(
                {
                    "catchup_window": job.catchup_reach.window,
                    "catchup_limit": job.catchup_reach.limit,
                }
                if job.catchup == "all"
                else {}
            ),
            **({"overlap": job.overlap} if job.overlap != "skip" else {}),
            **(_notifications(job) if job.notifications else {}),
            **({"scope": job.scope} if job.scope else {}),
            **({"keys": list(job.keys)} if job.keys else {}),
            "line": job.line,
        }
        for job in spec.jobs
    ]
    workers = [
        {"name": w.name, "address": w.address, "line": w.line}
        | ({"datacenter": w.datacenter} if w.datacenter else {})
        for w in spec.workers
    ]
    owner = {"owner": spec.owner} if spec.owner != DEFAULT_OWNER else {}  # older cases: none
    return {"valid": True, "jobs": jobs, "workers": workers} | owner


def _target(target: Any) -> dict[str, Any]:
    """A notify block as the older cases describe it (`repeat_after` only when it has one)."""
    shown = {"url_file": target.url_file, "on": list(target.on)}
    return shown | ({"repeat_after": target.repeat_after} if target.repeat_after else {})


def _notifications(job: Job) -> dict[str, Any]:
    told = job.notifications
    notify = {t.name: _target(t) for t in told.targets}
    return {"notify": notify, "ping_url_file": told.ping_url_file}


def test_there_are_golden_cases_for_valid_and_invalid_specs() -> None:
    expected = [json.loads((GOLDEN / f"{case}.json").read_text()) for case in CASES]
    assert sum(1 for e in expected if e["valid"]) >= 3
    assert sum(1 for e in expected if not e["valid"]) >= 60


@pytest.mark.parametrize("case", CASES)
def test_golden_spec(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(GOLDEN)
    expected = json.loads((GOLDEN / f"{case}.json").read_text(encoding="utf-8"))
    if expected["valid"]:
        assert _describe(load_spec(Path(f"{case}.hcl"))) == expected
        return
    with pytest.raises(SpecError) as caught:
        load_spec(Path(f"{case}.hcl"))
    assert [str(problem) for problem in caught.value.problems] == expected["problems"]
    assert str(caught.value) == expected["summary"]


def test_spec_error_is_one_line_input_error_with_every_problem() -> None:
    text = 'worker "w" {}\njob "a" {\n  prefix = ""\n  workers = ["x"]\n  ttl = "1s"\n}\n'
    with pytest.raises(SpecError) as caught:
        parse_spec(text, "s.hcl")
    error = caught.value
    assert isinstance(error, InputError) and error.exit_code == EXIT_INPUT
    assert str(error) == "s.hcl: 3 problems"
    assert [p.line for p in error.problems] == [3, 4, 5]
    assert all("\n" not in str(p) for p in error.problems)


def test_file_larger_than_the_bound_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.hcl"
    big.write_bytes(b"#" * (MAX_SPEC_BYTES + 1))
    with pytest.raises(SpecError) as caught:
        load_spec(big)
    assert f"a spec may be at most {MAX_SPEC_BYTES}" in str(caught.value.problems[0])


def test_missing_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read"):
        load_spec(tmp_path / "nope.hcl")


def test_example_spec_is_realistic() -> None:
    spec = load_spec(EXAMPLE)
    assert len(spec.jobs) == 4 and [w.name for w in spec.workers] == [
        "worker-1",
        "worker-2",
        "worker-3",
    ]
    assert [w.address for w in spec.workers] == [f"https://127.0.0.2{n}:8501" for n in (1, 2, 3)]
    assert any(job.workers == ("worker-1", "worker-2") for job in spec.jobs)
    assert spec.jobs_for("worker-3") and spec.worker("worker-1").line > 0


def test_defaults_fill_in_and_renew_interval_is_a_third_of_the_ttl() -> None:
    spec = parse_spec('worker "w" {}\njob "a" {\n  prefix = "l/a/"\n  workers = ["w"]\n}\n', "s")
    (job,) = spec.jobs
    timings = job.timings
    assert (timings.ttl, timings.lock_delay, timings.kill_grace, timings.renew_interval) == (
        15,
        15,
        5,
        5,
    )
    assert timings.min_hold == 0 and job.schedule is None and job.lock_key == "l/a/.lock"
    assert spec.worker("w").address == "http://127.0.0.1:8500"


def _ledger_settings(text: str) -> dict[str, tuple[float, int]]:
    spec = parse_spec('worker "w" {}\n' + text, "s.hcl")
    return {job.name: (job.timings.start_deadline, job.history_limit) for job in spec.jobs}


def _job(name: str, *lines: str) -> str:
    body = "".join(f"  {line}\n" for line in lines)
    return f'job "{name}" {{\n  prefix = "l/{name}/"\n  workers = ["w"]\n{body}}}\n'


def test_start_deadline_and_history_limit_default_to_5m_and_50() -> None:
    settings = _ledger_settings(_job("a", 'schedule = "@hourly"') + _job("b"))
    assert settings == {"a": (300.0, 50), "b": (300.0, 50)}


def test_a_job_s_start_deadline_and_history_limit_override_the_defaults_block() -> None:
    defaults = 'defaults {\n  start_deadline = "1m"\n  history_limit = 20\n}\n'
    jobs = _job("a", 'schedule = "@hourly"', 'start_deadline = "30s"', "history_limit = 10000")
    jobs += _job("b", 'schedule = "@daily"', "history_limit = 10") + _job("c")
    assert _ledger_settings(defaults + jobs) == {
        "a": (30.0, 10000),
        "b": (60.0, 10),
        "c": (60.0, 20),  # no schedule: start_deadline is accepted, and unused
    }
    spec = parse_spec('worker "w" {}\n' + defaults + jobs, "s.hcl")
    assert (spec.defaults.start_deadline.text, spec.defaults.history_limit) == ("1m", 20)


@pytest.mark.parametrize("field", ["history_limit", "ttl"])
def test_a_number_too_long_for_python_is_a_problem_not_a_traceback(field: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec('worker "w" {}\n' + _job("a", f"{field} = {'9' * 5000}"), "s.hcl")
    (problem,) = caught.value.problems
    assert str(problem).startswith(f's.hcl:5: job "a".{field}: must be ')
    assert str(problem).endswith("not a number of over 100 digits")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("15s", 15),
        ("1m30s", 90),
        ("500ms", 0.5),
        ("2h", 7200),
        ("1.5h", 5400),
        ("0", 0),
        ("-1s", -1),
        ("+2m", 120),
        ("1h0m10.5s", 3610.5),
        ("250us", 0.00025),
        ("250µs", 0.00025),
        ("10ns", 1e-8),
    ],
)
def test_go_durations_parse(text: str, seconds: float) -> None:
    assert parse_duration(text).seconds == pytest.approx(seconds)
    assert parse_duration(text).text == text


@pytest.mark.parametrize("text", ["", "15", "15 s", "s", "1d", "1.2.3s", "-", "1m 30s", "fifteen"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(DurationSyntaxError):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (0.5, "500ms"), (5, "5s"), (90, "1m30s"), (3600, "1h"), (10 / 3, "3.333s")],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text).seconds == pytest.approx(seconds, abs=0.001)


def test_hcl_walk_keeps_lines_decodes_escapes_and_marks_computed_values() -> None:
    body = parse_hcl('a = "x\\ty\\u00e9\\U0010FFFF"\n\nb "l" {\n  c = [1, true, null, d]\n}\n')
    (a,) = body.attributes
    assert (a.name, a.value, a.line) == ("a", "x\ty\u00e9\U0010ffff", 1)
    (block,) = body.blocks
    assert (block.type, block.labels[0].text, block.line) == ("b", "l", 3)
    (c,) = block.body.attributes
    assert c.value == (1, True, None, Unsupported("a bare word (quote it)"))


def test_hcl_out_of_range_unicode_escape_stays_literal() -> None:
    (a,) = parse_hcl('a = "\\UFFFFFFFF"').attributes
    assert a.value == "\\UFFFFFFFF"


def test_policy_names_derive_from_job_and_worker_names() -> None:
    assert lock_policy_name("nightly") == "lock-nightly"
    assert session_policy_name("worker-1") == "session-worker-1"
    assert is_valid_name("a") and is_valid_name("a_b-9") and not is_valid_name("a" * 65)


def test_jitter_defaults_to_none_and_a_job_s_own_overrides_the_defaults_block() -> None:
    defaults = 'defaults {\n  jitter = "20s"\n}\n'
    jobs = _job("a", 'schedule = "* * * * *"', 'jitter = "45s"') + _job("b", 'schedule = "@hourly"')
    spec = parse_spec('worker "w" {}\n' + defaults + jobs, "s.hcl")
    assert {job.name: job.timings.jitter for job in spec.jobs} == {"a": 45.0, "b": 20.0}
    plain = parse_spec('worker "w" {}\n' + _job("c"), "s.hcl")
    assert plain.jobs[0].timings.jitter == 0.0


@pytest.mark.parametrize(
    ("lines", "problem"),
    [
        (
            ['jitter = "5m"'],  # the built-in start_deadline is 5m: the jitter must be below it
            's.hcl:6: job "a".jitter: jitter 300s must be below start_deadline 300s',
        ),
        (
            ['start_deadline = "10s"', 'jitter = "30s"'],
            's.hcl:7: job "a".jitter: jitter 30s must be below start_deadline 10s',
        ),
        (['jitter = "2h"'], 's.hcl:6: job "a".jitter: 2h is outside 0s..1h'),
        (['jitter = "-1s"'], 's.hcl:6: job "a".jitter: '),
    ],
)
def test_a_jitter_that_leaves_no_time_to_claim_is_refused_at_its_line(
    lines: list[str], problem: str
) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec('worker "w" {}\n' + _job("a", 'schedule = "@hourly"', *lines), "s.hcl")
    assert str(caught.value.problems[0]).startswith(problem)


def test_a_shorter_start_deadline_of_the_job_is_blamed_for_the_defaults_jitter() -> None:
    defaults = 'defaults {\n  jitter = "30s"\n}\n'
    with pytest.raises(SpecError) as caught:
        parse_spec('worker "w" {}\n' + defaults + _job("a", 'start_deadline = "20s"'), "s.hcl")
    (problem,) = caught.value.problems
    assert str(problem).startswith('s.hcl:8: job "a".start_deadline: jitter 30s must be below')
