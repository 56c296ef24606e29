"""The ACL checks of `lockctl verify`: the agents' version and ACL settings, 403 without a token,
worker tokens confined to their jobs' prefixes and their own node, and the live policies."""

from __future__ import annotations

import uuid

from provision.acl.expectations import expectation_for
from provision.acl.lint import has_errors, lint_rules
from provision.acl.rules import rules_equivalent
from provision.consul import Consul
from provision.consul.errors import ConsulHTTPError
from provision.spec.names import parse_managed
from provision.spec.problems import shown
from provision.system.secrets import Secret
from provision.verify.context import VerifyContext, WorkerAccess
from provision.verify.evidence import CheckFailed, CheckSkipped, Evidence, status_of, verify_session

MIN_POLICY_BY_NAME = (1, 7, 3)


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
        status = _readstatus_of(ctx.client(worker.name, token=None), key)
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


def _readstatus_of(client: Consul, key: str) -> int:
    """The status of a read: 404 when the key is absent but the read was allowed."""
    status, body = status_of(client.kv.get, key)
    return 404 if status == 200 and body.startswith("(None") else status


def check_anonymous_denied(ctx: VerifyContext, ev: Evidence) -> str:
    problems = []
    bogus = Secret(str(uuid.uuid4()))
    for label, token in (("no token", None), ("an unknown token", bogus)):
        for worker in ctx.workers.values():
            client = ctx.client(worker.name, token=token)
            status, _ = status_of(verify_session, ctx, client, "anonymous")
            ev.add(f"{worker.name}: session create with {label} -> {status}")
            if status != 403:
                problems.append(
                    f"{worker.name}: session create with {label} got {status}, not 403: the "
                    "agent's default token or the anonymous token grants session write"
                )
        client = ctx.client(next(iter(ctx.workers)), token=token)
        for job in ctx.spec.jobs:
            fake_session = str(uuid.uuid4())
            status, _ = status_of(client.kv.put, job.lock_key, acquire=fake_session)
            ev.add(f"acquire {job.lock_key} with {label} -> {status}")
            if status != 403:
                allowed = " (the ACLs allowed the write)" if status in (200, 500) else ""
                problems.append(
                    f"acquire of {job.lock_key} with {label} got {status}, not 403{allowed}"
                )
    if problems:
        raise CheckFailed("; ".join(problems))
    return "403 for session create and acquire without a token and with an unknown one"


def workers_with_tokens(ctx: VerifyContext) -> list[WorkerAccess]:
    workers = ctx.with_token()
    if not workers:
        raise CheckSkipped("no worker token found (give --secrets-dir)")
    return workers


def check_worker_token_allowed(ctx: VerifyContext, ev: Evidence) -> str:
    workers = workers_with_tokens(ctx)
    problems = []
    for worker in workers:
        client = ctx.client(worker.name)
        try:
            session_id = verify_session(ctx, client, "allowed")
        except ConsulHTTPError as exc:
            problems.append(f"{worker.name}: session create on its own node got {exc.status}")
            continue
        for job in ctx.spec.jobs_for(worker.name):
            key = ctx.cleanup.key(client, ctx.verify_key(job, f"allowed-{worker.name}"))
            status, body = status_of(client.kv.put, key, acquire=session_id)
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
    workers = workers_with_tokens(ctx)
    problems = []
    for worker in workers:
        client = ctx.client(worker.name)
        session_id = verify_session(ctx, client, "confined")
        own = {job.name for job in ctx.spec.jobs_for(worker.name)}
        outside = [job.lock_key for job in ctx.spec.jobs if job.name not in own]
        outside += [job.prefix.rstrip("/") + "_" for job in ctx.spec.jobs if job.name in own]
        for key in outside:
            status, body = status_of(client.kv.put, key, acquire=session_id)
            ev.add(f"{worker.name}: acquire {key} -> {status}")
            if status != 403:
                problems.append(f"{worker.name}'s token got {status} {body}, not 403, on {key}")
        for other in ctx.workers.values():
            if other.name == worker.name:
                continue
            foreign = ctx.client(other.name, token=worker.token)
            status, _ = status_of(verify_session, ctx, foreign, "foreign")
            ev.add(f"{worker.name}'s token: session create on {other.name} -> {status}")
            if status != 403:
                problems.append(f"{worker.name}'s token created a session on node {other.name}")
    if problems:
        raise CheckFailed("; ".join(problems))
    return "worker tokens get 403 outside their prefixes and on other workers' nodes"


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
        marker = parse_managed(live[policy.name].description)
        if marker is not None and marker.owner != ctx.spec.owner:
            problems.append(
                f'policy {policy.name} in Consul is managed by owner "{shown(marker.owner)}", '
                f'not by this spec\'s owner "{ctx.spec.owner}"'
            )
            continue  # another spec's policy: its rules are that spec's, not compared here
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
