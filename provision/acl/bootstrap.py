"""`lockctl bootstrap`: bootstrap a cluster's ACL system once, keep the management token in a
0600 file, and optionally give named agents their tokens. Safe to re-run: an already
bootstrapped cluster is reported and left unchanged.

Consul answers a fresh cluster's bootstrap with transient errors (CONSUL_FACTS.md): a non-leader
says 500 "legacy mode" for up to ~6.4 s after the election, and right after bootstrap a follower
can say 403 "ACL not found" for ~0.2 s. These are retried within a deadline; decisions branch on
status codes, never on error text.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provision.acl.agent_tokens import AgentTokenResult, ensure_agent_token
from provision.consul import (
    NO_RETRY,
    Consul,
    ConsulNotReached,
    ConsulServerError,
    ConsulUnavailable,
    NotFound,
    PermissionDenied,
    RetryPolicy,
    normalize_address,
)
from provision.consul.models import Token
from provision.errors import InputError, LocalEnvironmentError
from provision.system.deadline import Deadline, retry_until
from provision.system.secrets import Secret, check_writable, read_secret_file, write_secret_file

BOOTSTRAP_DEADLINE = 30.0
RETRY_PAUSE = 0.1
PROBE_DEADLINE = 2.0  # seconds to retry 5xx while checking an existing token file


@dataclass(frozen=True)
class AgentTarget:
    """A node to give an agent token to, and the HTTP address of its agent."""

    node: str
    address: str


@dataclass(frozen=True)
class BootstrapResult:
    bootstrapped: bool  # False: it had been bootstrapped before, nothing changed
    token_file: Path | None  # where the new management token was written
    accessor_id: str | None
    agents: tuple[AgentTokenResult, ...]
    secret: Secret | None = None  # the new management token, only for --show-secret

    def to_record(self) -> dict[str, Any]:
        """The JSON record of `lockctl bootstrap --json`, without the secret."""
        return {
            "bootstrapped": self.bootstrapped,
            "management_token_file": str(self.token_file) if self.token_file else None,
            "accessor_id": self.accessor_id,
            "agents": [
                {"node": a.node, "accessor_id": a.accessor_id, "created": a.created}
                for a in self.agents
            ],
        }


def parse_agent_target(text: str) -> AgentTarget:
    """`NODE=ADDRESS` (as given to --agent)."""
    node, sep, address = text.partition("=")
    if not sep or not node or not address:
        raise InputError(f"--agent {text!r}: expected NODE=ADDRESS, e.g. worker-1=127.0.0.21:8500")
    return AgentTarget(node, address)


def check_token_file(path: Path, *, overwrite: bool) -> None:
    """Refuse before bootstrapping if the management token could not be saved: bootstrap
    succeeds once per cluster, and its token cannot be fetched again."""
    if path.exists() and not overwrite:
        raise InputError(
            f"--management-token-file {path}: exists; refusing to replace a management token "
            "(give --overwrite, or another path)"
        )
    if path.is_dir():
        raise InputError(f"--management-token-file {path}: is a folder")
    check_writable(path.parent, f"--management-token-file {path}")


def bootstrap_cluster(
    consul: Consul,
    token_file: Path,
    *,
    agents: Sequence[AgentTarget] = (),
    templates_dir: Path | None = None,
    overwrite: bool = False,
) -> BootstrapResult:
    """Bootstrap ACLs if nobody has; then give each named agent its token.

    An existing token file that this cluster accepts means "bootstrapped before": nothing is
    changed (agent tokens, if asked for, are made with that token). An existing file it does not
    accept is never replaced without `overwrite`.
    """
    if agents and templates_dir is None:
        raise InputError("agent tokens need the templates folder")
    if token_file.exists() and not overwrite:
        held = read_secret_file(token_file)
        if not _accepted(consul, held):
            raise InputError(
                f"--management-token-file {token_file}: exists and this cluster does not accept "
                "the token in it; refusing to replace it (give --overwrite, or another path)"
            )
        management = consul.with_settings(token=held)
        return BootstrapResult(False, None, None, _agent_tokens(management, agents, templates_dir))
    check_token_file(token_file, overwrite=True)
    minted = bootstrap_acl(consul)
    if minted is None:
        if agents and not consul.settings.token:
            raise InputError(
                "ACLs were bootstrapped before: give a management token (--token-file) to "
                "create agent tokens"
            )
        return BootstrapResult(False, None, None, _agent_tokens(consul, agents, templates_dir))
    if minted.secret is None:
        raise LocalEnvironmentError("Consul's bootstrap answer held no token secret")
    write_secret_file(token_file, minted.secret)
    management = consul.with_settings(token=minted.secret)
    wait_until_management_works(management)
    results = _agent_tokens(management, agents, templates_dir)
    return BootstrapResult(True, token_file, minted.accessor_id, results, minted.secret)


def _accepted(consul: Consul, token: Secret) -> bool:
    """Whether the cluster knows `token` (so it was bootstrapped, and the file is current)."""
    probe = consul.with_retry(RetryPolicy(deadline=PROBE_DEADLINE))
    try:
        probe.acl.read_self_token(token=token)
    except (PermissionDenied, NotFound, ConsulServerError):
        return False
    return True


def _agent_tokens(
    management: Consul, agents: Sequence[AgentTarget], templates_dir: Path | None
) -> tuple[AgentTokenResult, ...]:
    results = []
    for target in agents:
        assert templates_dir is not None
        agent = management.with_settings(address=normalize_address(target.address))
        results.append(ensure_agent_token(management, agent, target.node, templates_dir))
    return tuple(results)


def bootstrap_acl(
    consul: Consul,
    *,
    deadline: float = BOOTSTRAP_DEADLINE,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Token | None:
    """Bootstrap the ACL system; the management token, or None if it was bootstrapped before."""

    def attempt() -> Token | None:
        try:
            return consul.acl.bootstrap(retry=NO_RETRY)
        except PermissionDenied:
            return None  # "ACL bootstrap no longer allowed": someone already did it

    # Retried: a 5xx (a non-leader's "legacy mode", no leader yet) and a connection never opened.
    # Not a call sent and unanswered: it may have bootstrapped, and a retry would then be told
    # "already bootstrapped" while the one management token it minted is lost with the answer.
    transient = (ConsulServerError, ConsulNotReached)
    return retry_until(
        Deadline(deadline, clock), attempt, retry_on=transient, pause=RETRY_PAUSE, sleep=sleep
    )


def wait_until_management_works(
    consul: Consul,
    *,
    deadline: float = BOOTSTRAP_DEADLINE,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Retry until the agent resolves the management token and lets it read ACLs.

    Measured on 1.8.7: a follower answers 500 "legacy mode" for ~1.5 s after bootstrap, then
    may answer 403 "ACL not found" even after /v1/acl/token/self succeeded there. Listing
    policies needs the agent's own ACL resolver, so it is the probe that matches later use.
    """
    retry_until(
        Deadline(deadline, clock),
        consul.acl.list_policies,
        retry_on=(PermissionDenied, ConsulServerError, ConsulUnavailable),
        pause=RETRY_PAUSE,
        sleep=sleep,
    )
