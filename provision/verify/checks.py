"""The named checks of `lockctl verify`, in the order of the report. Each proves one promise on
the live cluster and returns its evidence (status codes, bodies, measured times). A check raises
`CheckFailed` with a message that names the problem; anything it creates is registered for
cleanup first. The checks themselves live in acl_checks.py, control_checks.py, tls_checks.py,
lock_checks.py and tick_checks.py."""

from __future__ import annotations

from dataclasses import dataclass

from provision.verify.acl_checks import (
    check_acl_enabled,
    check_anonymous_denied,
    check_live_policies_lint,
    check_version,
    check_worker_token_allowed,
    check_worker_token_confined,
)
from provision.verify.control_checks import (
    check_operator_token_break,
    check_worker_token_abort,
    check_worker_token_break,
    check_worker_token_control,
)
from provision.verify.evidence import CheckFunction
from provision.verify.lock_checks import (
    check_consistency_headers,
    check_fencing_index,
    check_lock_delay,
    check_release_handover,
    check_single_holder,
    check_ttl_expiry,
)
from provision.verify.login_checks import (
    check_login_confined,
    check_login_expiry,
    check_login_refused,
)
from provision.verify.tick_checks import check_tick_once
from provision.verify.tls_checks import check_gossip_encrypted, check_tls_http


@dataclass(frozen=True)
class Check:
    name: str
    run: CheckFunction
    slow: bool = False  # opt-in with --slow
    what: str = ""


CHECKS = (
    Check("version", check_version, what="the Consul version of every agent"),
    Check("tls-http", check_tls_http, what="HTTPS only, certificates checked both ways"),
    Check("gossip-encrypted", check_gossip_encrypted, what="every agent's gossip encrypted"),
    Check("acl-enabled", check_acl_enabled, what="ACLs on, default policy deny"),
    Check("anonymous-denied", check_anonymous_denied, what="403 without a token"),
    Check("worker-token-allowed", check_worker_token_allowed, what="worker tokens acquire"),
    Check("worker-token-confined", check_worker_token_confined, what="and nothing else"),
    Check("login-confined", check_login_confined, what="a login gets its worker's rights only"),
    Check("login-refused", check_login_refused, what="a JWT of an unknown identity is refused"),
    Check("login-expiry", check_login_expiry, what="login tokens expire by max_token_ttl"),
    Check(
        "worker-token-control",
        check_worker_token_control,
        what="worker tokens cannot pause, resume or trigger",
    ),
    Check(
        "worker-token-abort",
        check_worker_token_abort,
        what="worker tokens cannot abort a run",
    ),
    Check(
        "worker-token-break",
        check_worker_token_break,
        what="worker tokens cannot destroy another worker's session",
    ),
    Check(
        "operator-token-break",
        check_operator_token_break,
        what="the operators' token may break a lock on every worker's node",
    ),
    Check("single-holder", check_single_holder, what="one of two racing sessions wins"),
    Check("release-handover", check_release_handover, what="release hands over at once"),
    Check("lock-delay", check_lock_delay, what="destroy hands over after LockDelay"),
    Check("fencing-index", check_fencing_index, what="LockIndex grows with every acquire"),
    Check("consistency-headers", check_consistency_headers, what="read headers"),
    Check("tick-once", check_tick_once, what="one claim per tick, ever"),
    Check("ttl-expiry", check_ttl_expiry, slow=True, what="an unrenewed session expires"),
    Check("live-policies-lint", check_live_policies_lint, what="live policies match and lint"),
)
