"""The control-key check of `lockctl verify`: a worker's token reads its jobs' control keys
(every claim does: a paused job's tick is recorded paused) and cannot write them, so a worker
cannot pause, resume or trigger a job (issue 21); nor read another job's. The break check: a
worker's token cannot destroy a session on another worker's node (`lockctl break` is the
operators')."""

from __future__ import annotations

from dataclasses import replace

from provision.consul import Consul
from provision.consul.errors import ConsulHTTPError, NotFound
from provision.system.control_keys import abort_key, paused_key, pauses_key, trigger_key
from provision.verify.acl_checks import workers_with_tokens
from provision.verify.context import VerifyContext
from provision.verify.evidence import CheckFailed, CheckSkipped, Evidence, status_of, verify_session

# The writes are sent with a cas index no key ever has: denied, they prove the token may not
# write; allowed (a policy too broad), they still change nothing, so verify never pauses a job.
NEVER_INDEX = 2**62


def check_worker_token_control(ctx: VerifyContext, ev: Evidence) -> str:
    workers = workers_with_tokens(ctx)
    problems = []
    for worker in workers:
        client = ctx.client(worker.name)
        own = ctx.spec.jobs_for(worker.name)
        for job in own:
            status, _ = status_of(client.kv.get, paused_key(job.name))
            ev.add(f"{worker.name}: GET {paused_key(job.name)} -> {status}")
            if status != 200:
                problems.append(f"{worker.name}'s token cannot read {paused_key(job.name)}")
            writes = (
                ("pause", client.kv.put, paused_key(job.name)),
                ("trigger", client.kv.put, trigger_key(job.name)),
                ("resume", client.kv.delete, paused_key(job.name)),
                ("forge a past pause", client.kv.put, pauses_key(job.name)),  # hides misses
            )
            for action, call, key in writes:
                method = "PUT" if action != "resume" else "DELETE"
                status, body = status_of(call, key, cas=NEVER_INDEX)
                ev.add(f"{worker.name}: {method} {key} ({action}) -> {status}")
                if status != 403:
                    problems.append(f"{worker.name}'s token got {status} {body}, not 403: {action}")
        names = {job.name for job in own}
        for job in (job for job in ctx.spec.jobs if job.name not in names):
            status, _ = status_of(client.kv.get, paused_key(job.name))
            ev.add(f"{worker.name}: GET {paused_key(job.name)} (not its job) -> {status}")
            if status != 403:
                problems.append(f"{worker.name}'s token read another job's control key")
    if problems:
        raise CheckFailed("; ".join(problems))
    return "worker tokens read their jobs' control keys and get 403 on pause, resume, trigger"


def check_worker_token_abort(ctx: VerifyContext, ev: Evidence) -> str:
    """`lockctl abort` is the operators': a worker's token gets 403 writing its jobs' abort
    key (with a cas index no key has: a token that may write it still stops nothing), so a
    worker cannot stop another replica's run."""
    problems = []
    for worker in workers_with_tokens(ctx):
        client = ctx.client(worker.name)
        for job in ctx.spec.jobs_for(worker.name):
            key = abort_key(job.name)
            status, body = status_of(client.kv.put, key, cas=NEVER_INDEX)
            ev.add(f"{worker.name}: PUT {key} (abort) -> {status}")
            if status != 403:
                problems.append(f"{worker.name}'s token got {status} {body}, not 403: abort")
    if problems:
        raise CheckFailed("; ".join(problems))
    return "worker tokens get 403 writing their jobs' abort key"


def check_worker_token_break(ctx: VerifyContext, ev: Evidence) -> str:
    """`lockctl break` is the operators': a worker's token gets 403 destroying a session on
    another worker's node (Consul authorizes a destroy by the session's node), and destroys a
    session on its own node (its right: its replica ends its own sessions). Each worker's
    session is made through its own agent and holds nothing; the probes run while every one of
    them exists (a destroy of an unknown session succeeds whoever asks: it would prove
    nothing)."""
    workers = workers_with_tokens(ctx)
    if len(workers) < 2:
        raise CheckSkipped("needs two workers with tokens")
    sessions = {w.name: verify_session(ctx, ctx.client(w.name), "break") for w in workers}
    problems = []
    for worker in workers:
        client = ctx.client(worker.name)
        for other in (o for o in workers if o.name != worker.name):
            sessions[other.name] = alive_session(ctx, other.name, sessions[other.name], ev)
            status, body = status_of(client.session.destroy, sessions[other.name])
            ev.add(f"{worker.name}: destroy {other.name}'s session -> {status}")
            if status != 403:
                problems.append(
                    f"{worker.name}'s token got {status} {body}, not 403, destroying a session "
                    f"on {other.name}: a worker could break another's lock"
                )
    for worker in workers:
        sessions[worker.name] = alive_session(ctx, worker.name, sessions[worker.name], ev)
        status, body = status_of(ctx.client(worker.name).session.destroy, sessions[worker.name])
        ev.add(f"{worker.name}: destroy its own session -> {status}")
        if status != 200:
            problems.append(f"{worker.name}'s token got {status} {body} destroying its own session")
    if problems:
        raise CheckFailed("; ".join(problems))
    return "worker tokens get 403 destroying another worker's session, and destroy their own"


def alive_session(ctx: VerifyContext, worker: str, session_id: str, ev: Evidence) -> str:
    """`session_id`, renewed by its worker just before a probe destroys it, or a new session of
    that worker's if it has expired meanwhile (a slow cluster: the TTL is Consul's minimum). A
    destroy of an expired session answers 200 whoever asks, so without this a worker's token
    denied the destroy could look as if it had broken another's session."""
    client = ctx.client(worker)
    try:
        client.session.renew(session_id)
        return session_id
    except NotFound:
        ev.add(f"{worker}: its session had expired before the probe; made another")
        return verify_session(ctx, client, "break")


def check_operator_token_break(ctx: VerifyContext, ev: Evidence) -> str:
    """The operators' token (--operator-token-file) may do what `lockctl break` does on every
    worker's node: read a session there, read the node's serfHealth, destroy the session. The
    session is made through the worker's own agent with its own token and holds nothing; the
    operator's calls go to --address."""
    if ctx.operator_token is None:
        raise CheckSkipped("not applicable: no operator token (give --operator-token-file)")
    operator = Consul(replace(ctx.settings, token=ctx.operator_token))
    problems = []
    agentless = {worker.name for worker in ctx.spec.workers if worker.agentless}
    for worker in workers_with_tokens(ctx):
        session_id = verify_session(ctx, ctx.client(worker.name), "operator-break")
        # an agentless worker's catalog node has no serfHealth: break needs --force there
        serf = worker.name not in agentless
        problems += _operator_breaks(operator, worker.name, session_id, ev, expect_serf=serf)
    if problems:
        raise CheckFailed("; ".join(problems))
    return "the operators' token reads, judges and destroys a session on every worker's node"


def _operator_breaks(
    operator: Consul, node: str, session_id: str, ev: Evidence, *, expect_serf: bool
) -> list[str]:
    """What `lockctl break` needs on `node`, each call's result in the evidence. Consul answers a
    session or a node the token may not read as it answers an unknown one: empty, with 200."""
    try:
        seen = operator.session.info(session_id, consistency="consistent") is not None
        ev.add(f"operator: GET /v1/session/info of {node}'s session -> 200, seen: {seen}")
        checks = operator.health.node_checks(node, consistency="consistent")
    except ConsulHTTPError as exc:
        ev.add(f"operator: reading {node}'s session and health -> {exc.status}")
        return [f"the operators' token got {exc.status} reading a session on {node}"]
    serf = any(check.check_id == "serfHealth" for check in checks)
    ev.add(f"operator: GET /v1/health/node/{node} -> 200, serfHealth seen: {serf}")
    problems = (
        []
        if seen
        else [f'the operators\' token cannot read sessions on {node} (session "{node}" write)']
    )
    if expect_serf and not serf:
        problems.append(f"the operators' token cannot read {node}'s health (node read)")
    status, body = status_of(operator.session.destroy, session_id)
    ev.add(f"operator: destroy {node}'s session -> {status}")
    if status != 200:
        problems.append(f"the operators' token got {status} destroying a session on {node}: {body}")
    return problems
