"""An operator's command in each datacenter of a job's: each datacenter asked on its own, one
that fails (not reached, refused, an error answer) said in one line and the others still
asked and shown; the exit code says whether every one, some or none was done."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import typer

from provision.errors import EXIT_OK, EXIT_PARTIAL, LockctlError

if TYPE_CHECKING:
    from provision.consul import Consul

Datacenters = tuple[str | None, ...]  # (None,): the agent's own, in a spec that names none
T = TypeVar("T")
DETAIL_LIMIT = 160  # a failure's reason: a few words, never a whole error body


class DatacentersFailed(LockctlError):
    """The command failed in some of the datacenters asked (each said on stderr): exit 7 when
    it was done in others, else the first failure's code (3 not reached, 4 refused, ...)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class Failure:
    """Why a datacenter could not be read or written, in a few printable words."""

    datacenter: str
    detail: str
    exit_code: int
    consul: bool = True  # Consul failed (not reached, an error answer), not the command

    def said(self, failed: str) -> str:
        """`dc2: could not be read: Consul answered 500: ...`; a refusal of the command's own
        (a trigger refused, no such tick there) in its own words."""
        return f"{self.datacenter}: " + (f"{failed}: " if self.consul else "") + self.detail


def failure(datacenter: str, exc: LockctlError) -> Failure:
    """`Consul answered 500: No path to datacenter`, `Consul not reached: cannot connect
    (ConnectionError)`, or the error's own words; printable, bounded, never Consul's raw text."""
    from provision.consul import ConsulError, ConsulHTTPError, ConsulUnavailable
    from provision.system.text import printable

    if isinstance(exc, ConsulHTTPError):
        body = exc.body.strip().splitlines()
        detail = f"Consul answered {exc.status}" + (f": {body[0]}" if body else "")
    elif isinstance(exc, ConsulUnavailable):  # `consul: GET ... on ...: cannot connect (...)`
        detail = "Consul not reached: " + str(exc).rsplit(": ", 1)[-1]
    else:
        detail = str(exc)
    shown = printable(detail, DETAIL_LIMIT)
    return Failure(datacenter, shown, exc.exit_code, isinstance(exc, ConsulError))


def exit_code(done: int, failures: list[Failure]) -> int:
    """0 when nothing failed; 7 (partial) when done in `done` datacenters and failed in
    others; when done in none, the first failure's code, as a single datacenter's."""
    if not failures:
        return EXIT_OK
    return EXIT_PARTIAL if done else failures[0].exit_code


@dataclass
class Each:
    """Acts asked per datacenter, collecting which were done and which failed. A datacenter
    where Consul failed once is not asked again in this command (an unreachable one costs its
    timeout once); a refusal of the command's own (one job's trigger refused there) fails that
    act only, the datacenter's other jobs are still asked. In a spec that names no datacenters
    (None), errors are raised as they always were."""

    consul: Consul
    done: set[str] = field(default_factory=set)
    failures: list[Failure] = field(default_factory=list)
    lost: dict[str, Failure] = field(default_factory=dict)  # Consul failed there

    def ask(self, datacenter: str | None, act: Callable[[Consul], T]) -> T | None:
        """`act`'s answer in `datacenter`; None when that act failed, or Consul failed there
        before."""
        if datacenter is None:
            return act(self.consul)
        if datacenter in self.lost:
            return None
        try:
            answer = act(self.consul.in_datacenter(datacenter))
        except LockctlError as exc:
            self.failures.append(failed := failure(datacenter, exc))
            if failed.consul:
                self.lost[datacenter] = failed
            return None
        self.done.add(datacenter)
        return answer

    def unread(self, job: str, datacenter: str) -> dict[str, str]:
        """The `--json` entry of `job` in `datacenter` where its act answered None (it failed
        there): `{"job", "datacenter", "error"}`, the error as stderr says it."""
        said = self.failure_in(datacenter).said("could not be read")
        return {"job": job, "datacenter": datacenter, "error": said.split(": ", 1)[1]}

    def failure_in(self, datacenter: str) -> Failure:
        """The last failure in `datacenter` (there is one: its act answered None)."""
        return [lost for lost in self.failures if lost.datacenter == datacenter][-1]

    def end(self, failed: str = "could not be read") -> None:
        """Each failure in one line on stderr, `lockctl: error: dc2: could not be read: ...`,
        then DatacentersFailed if any (its exit code from `exit_code`)."""
        if not self.failures:
            return
        for lost in self.failures:
            typer.echo(f"lockctl: error: {lost.said(failed)}", err=True)
        failed_in = dict.fromkeys(lost.datacenter for lost in self.failures)  # in order
        names = ", ".join(failed_in)
        whole = len(self.done - set(failed_in))  # done in every job asked there
        asked = len(self.done | set(failed_in))
        raise DatacentersFailed(
            f"failed in {names} ({whole} of {asked} datacenters done)",
            exit_code(len(self.done), self.failures),
        )


def in_each(consul: Consul, datacenters: Datacenters, act: Callable[[Consul], list[str]]) -> None:
    """`act` in each datacenter, its lines printed as `dc2: ...`; in a spec that names no
    datacenter, once, its lines and errors as they are. A datacenter that fails (not reached,
    refused) is one line on stderr, `lockctl: error: dc2: failed: ...`, and the others are
    still asked; then DatacentersFailed names every one that failed."""
    each = Each(consul)
    for datacenter in datacenters:
        lines = each.ask(datacenter, act) or []
        for line in lines:
            typer.echo(line if datacenter is None else f"{datacenter}: {line}")
    each.end("failed")
