"""The lock spec: parse and validate `locks.hcl` into typed, frozen models.

load_spec(path) / parse_spec(text, path) -> Spec, or SpecError listing every problem.
"""

from __future__ import annotations

from provision.durations import Duration, format_duration, parse_duration
from provision.spec.models import DEFAULT_ADDRESS, Defaults, Job, Spec, Worker
from provision.spec.problems import Problem, SpecError
from provision.spec.validate import MAX_SPEC_BYTES, load_spec, parse_spec, prefix_problem

__all__ = [
    "DEFAULT_ADDRESS",
    "MAX_SPEC_BYTES",
    "Defaults",
    "Duration",
    "Job",
    "Problem",
    "Spec",
    "SpecError",
    "Worker",
    "format_duration",
    "load_spec",
    "parse_duration",
    "parse_spec",
    "prefix_problem",
]
