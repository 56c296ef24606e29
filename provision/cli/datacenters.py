"""An operator's command in each datacenter of a job's: its lines prefixed with the
datacenter's name, a datacenter that fails said on its own and the others still asked."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import typer

from provision.errors import LockctlError

if TYPE_CHECKING:
    from provision.consul import Consul

Datacenters = tuple[str | None, ...]  # (None,): the agent's own, in a spec that names none


class DatacentersFailed(LockctlError):
    """The command failed in some of the datacenters asked (each said on stderr); the exit
    code is the first failure's (3 not reached, 4 refused, 1 a trigger refused, ...)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def in_each(consul: Consul, datacenters: Datacenters, act: Callable[[Consul], list[str]]) -> None:
    """`act` in each datacenter, its lines printed as `dc2: ...`; in a spec that names no
    datacenter, once, its lines and errors as they are. A datacenter that fails (not reached,
    refused) is one line on stderr, `lockctl: error: dc2: ...`, and the others are still
    asked; then DatacentersFailed names every one that failed."""
    if datacenters == (None,):
        for line in act(consul):
            typer.echo(line)
        return
    failed: list[tuple[str, LockctlError]] = []
    for datacenter in datacenters:
        assert datacenter is not None
        try:
            lines = act(consul.in_datacenter(datacenter))
        except LockctlError as exc:
            typer.echo(f"lockctl: error: {datacenter}: {exc}", err=True)
            failed.append((datacenter, exc))
            continue
        for line in lines:
            typer.echo(f"{datacenter}: {line}")
    if failed:
        names = ", ".join(name for name, _ in failed)
        done = len(datacenters) - len(failed)
        raise DatacentersFailed(
            f"failed in {names} ({done} of {len(datacenters)} datacenters done)",
            failed[0][1].exit_code,
        )
