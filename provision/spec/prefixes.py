"""Across a spec's jobs: no job's prefix may share a lock with another's, or touch the root of
the operators' control keys."""

from __future__ import annotations

from dataclasses import dataclass

from provision.spec.hcl import Block
from provision.spec.problems import Problems
from provision.spec.values import prefix_overlaps, prefix_problem, prefix_relation
from provision.system.control_keys import CONTROL_ROOT


def check_job_prefixes(blocks: list[Block], problems: Problems) -> None:
    """Each problem of the job blocks' prefixes taken together, at its job's line."""
    jobs = _job_prefixes(blocks)
    _check_overlaps(jobs, problems)
    _check_control_root(jobs, problems)


@dataclass(frozen=True)
class _JobPrefix:
    name: str
    prefix: str
    line: int


def _job_prefixes(blocks: list[Block]) -> list[_JobPrefix]:
    """Each named job's valid prefix, even when the job has other problems."""
    found: list[_JobPrefix] = []
    for block in blocks:
        name = block.labels[0].text if len(block.labels) == 1 else None
        values = [a.value for a in block.body.attributes if a.name == "prefix"]
        prefix = values[0] if values else None
        if name and isinstance(prefix, str) and prefix_problem(prefix) is None:
            found.append(_JobPrefix(name, prefix, block.line))
    return found


def _check_overlaps(jobs: list[_JobPrefix], problems: Problems) -> None:
    """No job's prefix may contain, or lie inside, another's: that would share a lock."""
    for later, earlier, relation in prefix_overlaps([(job.name, job.prefix) for job in jobs]):
        job, other = jobs[later], jobs[earlier]
        problems.add(
            job.line,
            f'job "{job.name}".prefix',
            f'"{job.prefix}" {relation} job "{other.name}"\'s prefix "{other.prefix}"',
        )


def _check_control_root(jobs: list[_JobPrefix], problems: Problems) -> None:
    """No job's prefix may touch the control keys' root: its workers, who may write all of
    their prefix, could then pause or trigger jobs (the control keys are read-only to them)."""
    for job in jobs:
        relation = prefix_relation(job.prefix, CONTROL_ROOT)
        if relation is not None:
            problems.add(
                job.line,
                f'job "{job.name}".prefix',
                f'"{job.prefix}" {relation} "{CONTROL_ROOT}", where lockctl keeps the operators\' '
                "pause and trigger keys: choose a prefix outside it",
            )
