"""`apply` in a federation: a worker in a secondary datacenter is given its token only once
that datacenter's servers know it. Policies and tokens are made in the primary and reach a
secondary by ACL replication, seconds later (about 20 s just after a federation starts, while
replication is still `legacy`: docs/notes/consul-facts.md); a worker started with its file
before then is refused, 403. So the token, with the policies it names, is awaited there, by
asking that datacenter as the worker will: with the worker's own token."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from provision.acl.serialize import StopFlag, check_stop
from provision.consul import Consul, ConsulError, ConsulHTTPError
from provision.errors import EXIT_UNAVAILABLE, LockctlError
from provision.system.deadline import Deadline
from provision.system.secrets import Secret

REPLICATION_WAIT = 60.0  # seconds: three times what a federation's first switch to `tokens` took
POLL = 0.5


@dataclass(frozen=True)
class TokenThere:
    """A worker's token as its datacenter must know it: its secret and its policies' names."""

    worker: str
    datacenter: str
    secret: Secret = field(repr=False)
    policies: tuple[str, ...]


class NotReplicated(LockctlError):
    """A worker's token, or a policy it names, did not reach its datacenter in time (exit 3):
    its file is not written, and the next `apply` writes it."""

    exit_code = EXIT_UNAVAILABLE


def missing_there(consul: Consul, wanted: TokenThere) -> str:
    """What `wanted.datacenter` does not know yet of the token and its policies, in a few
    words; "" when it knows them all. A 403 or 404 there is "not yet"; Consul not answering is
    the caller's error."""
    there = wanted.datacenter
    try:
        seen = consul.acl.read_self_token(token=wanted.secret, datacenter=there)
    except ConsulHTTPError as refused:
        if refused.status in (403, 404):
            return "the token"
        raise
    if set(seen.policy_names) != set(wanted.policies):
        return "the token's policies as applied"
    known = {p.name for p in consul.acl.list_policies(datacenter=there)}
    absent = sorted(set(wanted.policies) - known)
    return f"policies {', '.join(absent)}" if absent else ""


def await_replicated(
    consul: Consul,
    wanted: TokenThere,
    stop: StopFlag | None,
    wait: float = REPLICATION_WAIT,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Return once the worker's datacenter knows its token and the token's policies;
    NotReplicated after `wait` seconds, Interrupted at a stop (asked between looks)."""
    where = f"worker {wanted.worker}'s token in {wanted.datacenter}"
    deadline = Deadline(wait)
    while True:
        check_stop(stop, f"before {where} was known there")
        try:
            missing = missing_there(consul, wanted)
        except ConsulError as exc:
            raise NotReplicated(f"{where}: {exc}") from None
        if not missing:
            return
        if deadline.expired():
            raise NotReplicated(
                f"{wanted.datacenter} does not know {missing} of worker {wanted.worker} after "
                f"{wait:.0f} s (ACL replication: see `lockctl cluster status`); its "
                "token file is not written, `lockctl apply` again writes it"
            )
        sleep(POLL)
