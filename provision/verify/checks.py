"""The named checks of `lockctl verify`. Each proves one promise on the live cluster and returns
its evidence (status codes, bodies, measured times). A check raises `CheckFailed` with a message
that names the problem; anything it creates is registered for cleanup first."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from provision.acl.lint import expectation_for, has_errors, lint_rules
from provision.acl.plan import rules_equivalent
from provision.consul import Consul
from provision.consul.errors import ConsulHTTPError
from provision.system.secrets import Secret
from provision.verify.context import VerifyContext, WorkerAccess

LOCK_DELAY_TOLERANCE = 0.5  # seconds either side of the configured LockDelay
POLL = 0.05  # seconds between acquire attempts where a check measures a delay
MIN_POLICY_BY_NAME = (1, 7, 3)
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


@dataclass(frozen=True)
class Check:
    name: str
    run: CheckFunction
    slow: bool = False  # opt-in with --slow
    what: str = ""


def _status(call: Callable[..., object], *args: Any, **kwargs: Any) -> tuple[int, str]:
    """Make one Consul call; its HTTP status and a short body (200 and the answer on success)."""
    try:
        answer = call(*args, **kwargs)
    except ConsulHTTPError as exc:
        return exc.status, exc.body
    return 200, str(answer)


def _session(ctx: VerifyContext, client: Consul, check: str, lock_delay: float = 0.0) -> str:
    session_id = client.session.create(
        name=f"lockctl verify {check} {ctx.run_id}", ttl=VERIFY_TTL, lock_delay=lock_delay
    )
    return ctx.cleanup.session(client, session_id)


def check_version(ctx: VerifyContext, ev: Evidence) -> str:
    management = ctx.management
    if management is None:
        raise CheckSkipped("needs a management token (agent read) to read each agent's version")
    versions = set()
    for worker in ctx.workers.values():
        agent = management.with_settings(address=worker.address)
        version = str(agent.agent.self()["Config"]["Version"])
        versions.add(version)
        ev.add(f"{worker.name} ({worker.address}): Consul {version}")
        if _version_tuple(version) < MIN_POLICY_BY_NAME:
            ev.warnings.append(
                f"{worker.name}: Consul {version} lacks policy read by name (1.7.3+)"
            )
    return f"agents run Consul {', '.join(sorted(versions))}"


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for part in version.split("-")[0].split(".")[:3]:
        parts.append(int(part) if part.isdigit() else 0)
    return tuple(parts)


def check_acl_enabled(ctx: VerifyContext, ev: Evidence) -> str:
    allowed_read, configs = [], []
    key = f"lockctl-verify/anonymous-read-{ctx.run_id}"
    for worker in ctx.workers.values():
        status = _read_status(ctx.client(worker.name, token=None), key)
        ev.add(f"{worker.name}: GET /v1/kv/{key} without a token -> {status}")
        if status != 403:
            allowed_read.append(f"{worker.name} ({status})")
        if ctx.management is not None:
            config = ctx.management.with_settings(address=worker.address).agent.self()
            debug = config.get("DebugConfig", {})
            enabled, default = debug.get("ACLsEnabled"), debug.get("ACLDefaultPolicy")
            ev.add(f"{worker.name}: ACLsEnabled={enabled} ACLDefaultPolicy={default}")
            if enabled is False or (default is not None and default != "deny"):
                configs.append(f"{worker.name}: ACLsEnabled={enabled}, default policy {default}")
    problems = list(configs)
    if allowed_read:
        problems.append(
            f"an anonymous read was allowed, not 403, on {', '.join(allowed_read)}: ACLs are off "
            "or default_policy is allow, or the anonymous token grants key read"
        )
    if problems:
        raise CheckFailed("; ".join(problems))
    return "ACLs on with default deny on every agent"


def _read_status(client: Consul, key: str) -> int:
    """The status of a read: 404 when the key is absent but the read was allowed."""
    status, body = _status(client.kv.get, key)
    return 404 if status == 200 and body.startswith("(None") else status


def check_anonymous_denied(ctx: VerifyContext, ev: Evidence) -> str:
    problems = []
    bogus = Secret(str(uuid.uuid4()))
    for label, token in (("no token", None), ("an unknown token", bogus)):
        for worker in ctx.workers.values():
            client = ctx.client(worker.name, token=token)
            status, _ = _status(_session, ctx, client, "anonymous")
            ev.add(f"{worker.name}: session create with {label} -> {status}")
            if status != 403:
                problems.append(
                    f"{worker.name}: session create with {label} got {status}, not 403: the "
                    "agent's default token or the anonymous token grants session write"
                )
        client = ctx.client(next(iter(ctx.workers)), token=token)
        for job in ctx.spec.jobs:
            fake_session = str(uuid.uuid4())
            status, _ = _status(client.kv.put, job.lock_key, acquire=fake_session)
            ev.add(f"acquire {job.lock_key} with {label} -> {status}")
            if status != 403:
                allowed = " (the ACLs allowed the write)" if status in (200, 500) else ""
                problems.append(
                    f"acquire of {job.lock_key} with {label} got {status}, not 403{allowed}"
                )
    if problems:
        raise CheckFailed("; ".join(problems))
    return "403 for session create and acquire without a token and with an unknown one"


def _workers_with_tokens(ctx: VerifyContext) -> list[WorkerAccess]:
    workers = ctx.with_token()
    if not workers:
        raise CheckSkipped("no worker token found (give --secrets-dir)")
    return workers


def check_worker_token_allowed(ctx: VerifyContext, ev: Evidence) -> str:
    workers = _workers_with_tokens(ctx)
    problems = []
    for worker in workers:
        client = ctx.client(worker.name)
        try:
            session_id = _session(ctx, client, "allowed")
        except ConsulHTTPError as exc:
            problems.append(f"{worker.name}: session create on its own node got {exc.status}")
            continue
        for job in ctx.spec.jobs_for(worker.name):
            key = ctx.cleanup.key(client, ctx.verify_key(job, f"allowed-{worker.name}"))
            status, body = _status(client.kv.put, key, acquire=session_id)
            ev.add(f"{worker.name}: acquire {key} -> {status} {body}")
            if (status, body) != (200, "True"):
                problems.append(f"{worker.name}: acquire under {job.prefix} got {status} {body}")
                continue
            released = client.kv.put(key, release=session_id)
            ev.add(f"{worker.name}: release -> {released}")
    if problems:
        raise CheckFailed("; ".join(problems))
    return f"{len(workers)} worker tokens acquire and release under each of their jobs' prefixes"


def check_worker_token_confined(ctx: VerifyContext, ev: Evidence) -> str:
    workers = _workers_with_tokens(ctx)
    problems = []
    for worker in workers:
        client = ctx.client(worker.name)
        session_id = _session(ctx, client, "confined")
        own = {job.name for job in ctx.spec.jobs_for(worker.name)}
        outside = [job.lock_key for job in ctx.spec.jobs if job.name not in own]
        outside += [job.prefix.rstrip("/") + "_" for job in ctx.spec.jobs if job.name in own]
        for key in outside:
            status, body = _status(client.kv.put, key, acquire=session_id)
            ev.add(f"{worker.name}: acquire {key} -> {status}")
            if status != 403:
                problems.append(f"{worker.name}'s token got {status} {body}, not 403, on {key}")
        for other in ctx.workers.values():
            if other.name == worker.name:
                continue
            foreign = ctx.client(other.name, token=worker.token)
            status, _ = _status(_session, ctx, foreign, "foreign")
            ev.add(f"{worker.name}'s token: session create on {other.name} -> {status}")
            if status != 403:
                problems.append(f"{worker.name}'s token created a session on node {other.name}")
    if problems:
        raise CheckFailed("; ".join(problems))
    return "worker tokens get 403 outside their prefixes and on other workers' nodes"


def _pair(
    ctx: VerifyContext, check: str, lock_delay: float = 0.0
) -> tuple[Consul, str, Consul, str, str]:
    shared = ctx.shared_job()
    if shared is None:
        raise CheckSkipped("needs a job that two workers with tokens may run")
    job, first, second = shared
    a, b = ctx.client(first), ctx.client(second)
    key = ctx.cleanup.key(a, ctx.verify_key(job, check))
    return a, _session(ctx, a, check, lock_delay), b, _session(ctx, b, check, lock_delay), key


def check_single_holder(ctx: VerifyContext, ev: Evidence, rounds: int = 5) -> str:
    a, session_a, b, session_b, key = _pair(ctx, "single-holder")
    for round_number in range(1, rounds + 1):
        start = threading.Barrier(2)
        results: dict[str, bool] = {}
        racers = (("A", a, session_a), ("B", b, session_b))
        threads = [
            threading.Thread(target=_race, args=(start, results, name, client, session_id, key))
            for name, client, session_id in racers
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        ev.add(f"round {round_number}: A={results.get('A')} B={results.get('B')}")
        if sorted(results.values()) != [False, True]:
            raise CheckFailed(f"round {round_number}: acquire results {results}, not exactly one")
        winner = (a, session_a) if results["A"] else (b, session_b)
        winner[0].kv.put(key, release=winner[1])
    return f"exactly one of two racing sessions acquired, {rounds} of {rounds} rounds"


def _race(
    start: threading.Barrier,
    results: dict[str, bool],
    name: str,
    client: Consul,
    session_id: str,
    key: str,
) -> None:
    start.wait()  # both threads send their acquire at the same moment
    results[name] = client.kv.put(key, acquire=session_id)


def check_release_handover(ctx: VerifyContext, ev: Evidence) -> str:
    a, session_a, b, session_b, key = _pair(ctx, "handover", lock_delay=15.0)
    if not a.kv.put(key, acquire=session_a):
        raise CheckFailed("the first session could not acquire a free key")
    if b.kv.put(key, acquire=session_b):
        raise CheckFailed("the second session acquired a key the first one holds")
    released = time.monotonic()
    a.kv.put(key, release=session_a)
    acquired = b.kv.put(key, acquire=session_b)
    took = time.monotonic() - released
    ev.add(f"release, then acquire by the other session: {acquired} after {took * 1000:.1f} ms")
    if not acquired:
        raise CheckFailed("after a release the other session could not acquire at once")
    b.kv.put(key, release=session_b)
    return f"the other session acquired {took * 1000:.1f} ms after release (no lock-delay)"


def check_lock_delay(ctx: VerifyContext, ev: Evidence) -> str:
    shared = ctx.shared_job()
    if shared is None:
        raise CheckSkipped("needs a job that two workers with tokens may run")
    delay = shared[0].lock_delay.seconds
    a, session_a, b, session_b, key = _pair(ctx, "lock-delay", lock_delay=delay)
    if not a.kv.put(key, acquire=session_a):
        raise CheckFailed("the first session could not acquire a free key")
    destroyed = time.monotonic()
    a.session.destroy(session_a)
    attempts = 0
    while True:
        attempts += 1
        if b.kv.put(key, acquire=session_b):
            break
        if time.monotonic() - destroyed > delay + 10:
            raise CheckFailed(f"no acquire within LockDelay {delay:g}s + 10 s of destroy")
        time.sleep(POLL)
    measured = time.monotonic() - destroyed
    b.kv.put(key, release=session_b)
    ev.add(f"configured LockDelay {delay:g} s (job {shared[0].name}); measured {measured:.3f} s")
    ev.add(f"{attempts} acquire attempts, {POLL * 1000:.0f} ms apart")
    if measured < delay - LOCK_DELAY_TOLERANCE:
        raise CheckFailed(f"acquired after {measured:.3f} s, before LockDelay {delay:g} s")
    if measured > delay + LOCK_DELAY_TOLERANCE + 1.0:
        raise CheckFailed(f"acquired only after {measured:.3f} s, LockDelay is {delay:g} s")
    return f"destroy -> next acquire {measured:.3f} s (LockDelay {delay:g} s)"


def check_fencing_index(ctx: VerifyContext, ev: Evidence) -> str:
    a, session_a, b, session_b, key = _pair(ctx, "fencing-index")
    indexes = []
    for client, session_id in ((a, session_a), (b, session_b), (a, session_a)):
        if not client.kv.put(key, acquire=session_id):
            raise CheckFailed("a session could not acquire the free key")
        entry, _ = client.kv.get(key, consistency="consistent")
        indexes.append(entry.lock_index if entry else -1)
        client.kv.put(key, release=session_id)
    ev.add(f"LockIndex after three acquires: {indexes}")
    if not all(later > earlier for earlier, later in itertools.pairwise(indexes)):
        raise CheckFailed(f"LockIndex did not increase with every acquire: {indexes}")
    return f"LockIndex {' < '.join(map(str, indexes))}"


def check_consistency_headers(ctx: VerifyContext, ev: Evidence) -> str:
    a, _session_a, _b, _session_b, key = _pair(ctx, "headers")
    a.kv.put(key, b"x")
    missing = []
    for mode in ("default", "stale", "consistent"):
        _, meta = a.kv.get(key, consistency=mode)
        ev.add(
            f"{mode:>10}: X-Consul-Index={meta.index} X-Consul-Knownleader={meta.known_leader} "
            f"X-Consul-Lastcontact={meta.last_contact_ms}"
        )
        if None in (meta.index, meta.known_leader, meta.last_contact_ms):
            missing.append(mode)
    if missing:
        raise CheckFailed(f"consistency headers missing on {', '.join(missing)} reads")
    return "default, stale and consistent reads all carry index, leader and last-contact headers"


def check_ttl_expiry(ctx: VerifyContext, ev: Evidence) -> str:
    shared = ctx.shared_job()
    if shared is None:
        raise CheckSkipped("needs a job that two workers with tokens may run")
    job, first, second = shared
    delay = job.lock_delay.seconds
    a, b = ctx.client(first), ctx.client(second)
    key = ctx.cleanup.key(a, ctx.verify_key(job, "ttl-expiry"))
    session_a = _session(ctx, a, "ttl-expiry", delay)
    if not a.kv.put(key, acquire=session_a):
        raise CheckFailed("the first session could not acquire a free key")
    created = time.monotonic()
    while a.session.info(session_a) is not None:  # left unrenewed on purpose
        if time.monotonic() - created > 2 * VERIFY_TTL + 10:
            raise CheckFailed(f"session still valid {2 * VERIFY_TTL + 10:g} s after its last renew")
        time.sleep(0.2)
    expired = time.monotonic() - created
    session_b = _session(ctx, b, "ttl-expiry", delay)  # made now, so it cannot expire meanwhile
    while not b.kv.put(key, acquire=session_b):
        if time.monotonic() - created > 2 * VERIFY_TTL + delay + 15:
            raise CheckFailed("key not acquirable after expiry plus LockDelay")
        time.sleep(POLL)
    acquirable = time.monotonic() - created
    b.kv.put(key, release=session_b)
    ev.add(f"TTL {VERIFY_TTL:g} s, LockDelay {delay:g} s: invalidated after {expired:.1f} s")
    ev.add(f"acquirable by another session at {acquirable:.1f} s")
    if not VERIFY_TTL - 0.5 <= expired <= 2 * VERIFY_TTL + 2:
        raise CheckFailed(f"invalidated after {expired:.1f} s, not within TTL..2xTTL")
    return f"invalidated after {expired:.1f} s (TTL {VERIFY_TTL:g} s), free at {acquirable:.1f} s"


def check_live_policies_lint(ctx: VerifyContext, ev: Evidence) -> str:
    from provision.acl.render import render_policies
    from provision.system.templates import find_templates_dir

    management = ctx.management
    if management is None:
        raise CheckSkipped("needs a management token (acl read) to read the live policies")
    rendered = render_policies(ctx.spec, find_templates_dir(ctx.templates_dir))
    live = {policy.name: policy for policy in management.acl.list_policies()}
    nodes = [w.name for w in ctx.spec.workers]
    problems = []
    for policy in rendered.policies:
        if policy.name not in live:
            problems.append(f"policy {policy.name} is not in Consul (run lockctl apply)")
            continue
        rules = management.acl.read_policy(live[policy.name].id).rules or ""
        if not rules_equivalent(rules, policy.rules):
            problems.append(f"policy {policy.name} in Consul differs from the rendered one")
        findings = lint_rules(
            rules,
            name=policy.name,
            declared_nodes=nodes,
            expected=expectation_for(ctx.spec, policy.name),
        )
        for finding in findings:
            ev.add(finding.describe(f"consul:{policy.name}"))
        if has_errors(findings):
            problems.append(f"policy {policy.name} in Consul has lint errors")
    ev.add(f"{len(rendered.policies)} managed policies compared and linted")
    if problems:
        raise CheckFailed("; ".join(problems))
    return f"{len(rendered.policies)} live policies match the rendered ones and lint clean"


CHECKS = (
    Check("version", check_version, what="the Consul version of every agent"),
    Check("acl-enabled", check_acl_enabled, what="ACLs on, default policy deny"),
    Check("anonymous-denied", check_anonymous_denied, what="403 without a token"),
    Check("worker-token-allowed", check_worker_token_allowed, what="worker tokens acquire"),
    Check("worker-token-confined", check_worker_token_confined, what="and nothing else"),
    Check("single-holder", check_single_holder, what="one of two racing sessions wins"),
    Check("release-handover", check_release_handover, what="release hands over at once"),
    Check("lock-delay", check_lock_delay, what="destroy hands over after LockDelay"),
    Check("fencing-index", check_fencing_index, what="LockIndex grows with every acquire"),
    Check("consistency-headers", check_consistency_headers, what="read headers"),
    Check("ttl-expiry", check_ttl_expiry, slow=True, what="an unrenewed session expires"),
    Check("live-policies-lint", check_live_policies_lint, what="live policies match and lint"),
)
