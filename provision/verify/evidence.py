"""What every check of `lockctl verify` shares: the exceptions that end one (failed, skipped),
the evidence it gathers, and two probes (a call's HTTP status, a session that expires soonest)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from provision.consul import Consul
from provision.consul.errors import ConsulHTTPError
from provision.verify.context import VerifyContext

VERIFY_TTL = 10.0  # Consul's minimum: sessions a failed check leaves behind expire soonest


class CheckFailed(Exception):
    """The promise does not hold; the message says what was seen."""


class CheckSkipped(Exception):
    """The check cannot run here (no management token, a single worker, ...)."""


@dataclass
class Evidence:
    lines: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def add(self, line: str) -> None:
        self.lines.append(line)


CheckFunction = Callable[[VerifyContext, Evidence], str]


def status_of(call: Callable[..., object], *args: Any, **kwargs: Any) -> tuple[int, str]:
    """Make one Consul call; its HTTP status and a short body (200 and the answer on success)."""
    try:
        answer = call(*args, **kwargs)
    except ConsulHTTPError as exc:
        return exc.status, exc.body
    return 200, str(answer)


def verify_session(ctx: VerifyContext, client: Consul, check: str, lock_delay: float = 0.0) -> str:
    session_id = client.session.create(
        name=f"lockctl verify {check} {ctx.run_id}", ttl=VERIFY_TTL, lock_delay=lock_delay
    )
    return ctx.cleanup.session(client, session_id)
