"""The lock spec: parse and validate `locks.hcl` into typed, frozen models.

load_spec(path) / parse_spec(text, path) -> Spec, or SpecError listing every problem.

Modules: `hcl_parse` (HCL read with line numbers into the values of `hcl`; `hcl_fast` its fast
path), `validate` (the walk over blocks, rules across jobs),
`values` (single values), `job_timings` (a job's durations), `problems` (collector and error),
`models` (the typed result), `names` (name rules and derived names).
"""

from __future__ import annotations

from provision.durations import Duration, format_duration, parse_duration
from provision.spec.models import DEFAULT_ADDRESS, Defaults, Job, Spec, Worker
from provision.spec.problems import Problem, SpecError
from provision.spec.validate import MAX_SPEC_BYTES, load_spec, parse_spec
from provision.spec.values import prefix_problem

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
