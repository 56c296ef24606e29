"""Where workers live and how far a job reaches, in a spec across Consul datacenters (pure).

A worker's `datacenter` names the datacenter its agent (or, agentless, its server) is in; none
named anywhere is one datacenter, as before. Consul's KV and sessions are per datacenter, so a
job whose workers are in more than one must say which promise it wants: `scope = "datacenter"`,
once per tick in each datacenter that has workers for it (its lock and ledger in each one's own
KV), or `home_datacenter = "dc1"`, once per tick across all of them (every claim in the home's
KV). The second is refused for now: nothing claims across datacenters yet, and a job that
silently ran once per datacenter instead would run twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from provision.errors import InputError
from provision.spec.hcl import Attribute
from provision.spec.models import Job, Worker
from provision.spec.names import is_valid_name
from provision.spec.problems import Problems, shown
from provision.spec.values import read_checked_string

DATACENTER_KEY = "datacenter"  # a worker's
SCOPE_KEY = "scope"  # a job's: once per tick in each datacenter
HOME_KEY = "home_datacenter"  # a job's: once per tick across all of them, claimed in the home
JOB_DATACENTER_KEYS = (SCOPE_KEY, HOME_KEY)
PER_DATACENTER = "datacenter"
SCOPES = (PER_DATACENTER,)
DATACENTER_FLAG = "--datacenter"  # the operators' commands': one datacenter of a job's


def job_datacenters(workers: Sequence[Worker], job: Job) -> tuple[str, ...]:
    """The datacenters JOB's workers are in, sorted; () in a spec that names none."""
    where_is = {worker.name: worker.datacenter for worker in workers}
    return tuple(sorted({dc for name in job.workers if (dc := where_is.get(name)) is not None}))


def check_datacenter_flag(workers: Sequence[Worker], only: str | None) -> None:
    """--datacenter names a datacenter some worker of the spec is in (InputError if not)."""
    if only is None:
        return
    known = sorted({worker.datacenter for worker in workers if worker.datacenter is not None})
    if not known:
        raise InputError(f"{DATACENTER_FLAG} {shown(only[:64])}: the spec names no datacenters")
    if only not in known:
        raise InputError(
            f"{DATACENTER_FLAG} {shown(only[:64])}: no worker of the spec is in it "
            f"(datacenters: {', '.join(known)})"
        )


def chosen_datacenters(
    workers: Sequence[Worker], job: Job, only: str | None
) -> tuple[str | None, ...]:
    """Where an operator's command reads or writes JOB's keys: each datacenter its workers are
    in, or only `only` (InputError when no worker of JOB is there); (None,): the agent's own,
    in a spec that names no datacenters."""
    check_datacenter_flag(workers, only)
    mine = job_datacenters(workers, job)
    if only is None:
        return mine or (None,)
    if only not in mine:
        raise InputError(
            f"{DATACENTER_FLAG} {shown(only[:64])}: job {job.name} has no workers there "
            f"(its datacenters: {', '.join(mine)})"
        )
    return (only,)


def read_datacenter(attribute: Attribute | None, where: str, problems: Problems) -> str | None:
    """A datacenter's name as Consul spells one (lower case, digits, `-` and `_`), or None."""
    if attribute is None:
        return None
    return read_checked_string(attribute, where, problems, _datacenter_problem)


def read_scope(attribute: Attribute | None, where: str, problems: Problems) -> str | None:
    if attribute is None:
        return None
    return read_checked_string(
        attribute,
        where,
        problems,
        lambda text: (
            None
            if text in SCOPES
            else f'"{shown(text)}": expected "{PER_DATACENTER}" (once per tick in each datacenter)'
        ),
    )


def refuse_home(attribute: Attribute | None, where: str, problems: Problems) -> None:
    """`home_datacenter`: read (a bad name is said as such), then refused until claims cross
    datacenters."""
    if attribute is None or read_datacenter(attribute, where, problems) is None:
        return
    problems.add(
        attribute.line,
        where,
        "once per tick across datacenters is not built yet; "
        f'scope = "{PER_DATACENTER}" runs it once per tick in each datacenter',
    )


def check_datacenters(workers: Sequence[Worker], jobs: Iterable[Job], problems: Problems) -> None:
    """Every worker names its datacenter or none does; a job whose workers span datacenters
    says its scope."""
    named = [worker for worker in workers if worker.datacenter is not None]
    if not named:
        return
    first = min(named, key=lambda worker: worker.line)
    unnamed = [worker for worker in workers if worker.datacenter is None]
    for worker in unnamed:
        problems.add(
            worker.line,
            f'worker "{worker.name}"',
            f'{DATACENTER_KEY} missing: worker "{first.name}" (line {first.line}) names one '
            f'("{first.datacenter}"), so every worker must',
        )
    where_is = {worker.name: worker.datacenter for worker in named if worker.datacenter}
    for job in jobs:
        spans = sorted({where_is[w] for w in job.workers if w in where_is})
        if len(spans) > 1 and job.scope is None:
            problems.add(
                job.line,
                f'job "{job.name}"',
                f"its workers are in {' and '.join(spans)}: say {SCOPE_KEY} = "
                f'"{PER_DATACENTER}" (once per tick in each datacenter)',
            )


def _datacenter_problem(text: str) -> str | None:
    if is_valid_name(text):
        return None
    return f'"{shown(text)}": a datacenter is lower case letters, digits, "-" and "_"'
