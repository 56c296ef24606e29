"""The login checks of `lockctl verify` (docs/identity.md): with a JWT a worker's identity
carries (`--bearer-token-file WORKER=FILE`), a login gets exactly the worker's privileges, its
token expires within the auth method's max_token_ttl, and a JWT of an unknown identity (a
stranger's file, `--bearer-token-file NAME=FILE` with NAME no worker of the spec, and always
the worker's own JWT with its claims rewritten to another identity's) is refused. Without a
JWT they are skipped, saying so: verify cannot sign one (the platform's issuer does)."""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
from typing import Any

from provision.consul import Consul
from provision.consul.errors import ConsulError, ConsulHTTPError
from provision.consul.identity import LoginToken
from provision.consul.login import refusal_reason
from provision.spec.models import AuthMethod, Worker
from provision.system.secrets import Secret
from provision.verify.context import VerifyContext
from provision.verify.evidence import (
    VERIFY_TTL,
    CheckFailed,
    CheckSkipped,
    Evidence,
    status_of,
    verify_session,
)

STRANGER = "lockctl-verify-stranger"  # the claim value a rewritten JWT carries when no other
# worker's identity is there to take


def _logins(ctx: VerifyContext) -> list[tuple[Worker, AuthMethod, Secret]]:
    """Each worker with an identity in the spec and a JWT given for it."""
    if not any(worker.identity is not None for worker in ctx.spec.workers):
        raise CheckSkipped("not applicable: no worker of the spec logs in (no `identity` block)")
    found = []
    methods = {method.name: method for method in ctx.spec.auth_methods}
    for worker in ctx.spec.workers:
        jwt = ctx.bearer_tokens.get(worker.name)
        if worker.identity is not None and jwt is not None:
            found.append((worker, methods[worker.identity.auth_method], jwt))
    if not found:
        raise CheckSkipped(
            "no JWT to log in with: give --bearer-token-file WORKER=FILE (a token the "
            "worker's identity carries; verify cannot sign one)"
        )
    return found


def _login(ctx: VerifyContext, worker: Worker, method: AuthMethod, jwt: Secret) -> LoginToken:
    anonymous = ctx.client(worker.name, token=None)
    try:
        return anonymous.identity.login(method.name, jwt)
    except ConsulHTTPError as exc:
        reason = refusal_reason(exc.status, exc.body) or exc.body
        raise CheckFailed(
            f"{worker.name}: its JWT was refused ({exc.status}): {reason}; is it current, and "
            "does it carry the worker's claims?"
        ) from None


def _logout(ctx: VerifyContext, worker: str, token: LoginToken) -> None:
    ctx.client(worker, token=None).identity.logout(token.secret)


def check_login_confined(ctx: VerifyContext, ev: Evidence) -> str:
    problems = []
    logins = _logins(ctx)
    for worker, method, jwt in logins:
        token = _login(ctx, worker, method, jwt)
        ev.add(f"{worker.name}: login through {method.name} -> token {token.accessor_id}")
        try:
            problems += _confined(ctx, ev, worker.name, ctx.client(worker.name, token=token.secret))
        finally:
            _logout(ctx, worker.name, token)
            ev.add(f"{worker.name}: logout {token.accessor_id}")
    if problems:
        raise CheckFailed("; ".join(problems))
    return f"{len(logins)} logins acquire under their worker's prefixes and get 403 elsewhere"


def _confined(ctx: VerifyContext, ev: Evidence, name: str, client: Consul) -> list[str]:
    """What a login as `name` may do: exactly what its token file's token may. What it makes
    goes before its logout (the cleanup at the end would come with a token that is gone)."""
    session_id = client.session.create(
        name=f"lockctl verify login {ctx.run_id}", ttl=VERIFY_TTL, lock_delay=0
    )
    made: list[str] = []
    try:
        return _try_confined(ctx, ev, name, client, session_id, made)
    finally:
        for key in made:
            with contextlib.suppress(ConsulError):
                client.kv.delete(key)
        with contextlib.suppress(ConsulError):  # else it expires within 2 x VERIFY_TTL
            client.session.destroy(session_id)


def _try_confined(
    ctx: VerifyContext, ev: Evidence, name: str, client: Consul, session_id: str, made: list[str]
) -> list[str]:
    problems = []
    own = [job for job in ctx.spec.jobs if name in job.workers]
    for job in own:
        key = ctx.verify_key(job, f"login-{name}")
        made.append(key)
        status, body = status_of(client.kv.put, key, acquire=session_id)
        ev.add(f"{name} (login): acquire {key} -> {status} {body}")
        if (status, body) != (200, "True"):
            problems.append(f"{name}'s login got {status} {body} under its job {job.name}")
    outside = [job.lock_key for job in ctx.spec.jobs if job not in own]
    outside += [job.prefix.rstrip("/") + "_" for job in own]
    for key in outside:
        status, _ = status_of(client.kv.put, key, acquire=session_id)
        ev.add(f"{name} (login): acquire {key} -> {status}")
        if status != 403:
            problems.append(f"{name}'s login got {status}, not 403, on {key}")
    for other in ctx.workers.values():
        if other.name != name:
            foreign = ctx.client(other.name, token=client.transport.tokens.current)
            status, _ = status_of(verify_session, ctx, foreign, "login-foreign")
            ev.add(f"{name} (login): session create on {other.name} -> {status}")
            if status != 403:
                problems.append(f"{name}'s login created a session on node {other.name}")
    return problems


def check_login_expiry(ctx: VerifyContext, ev: Evidence) -> str:
    problems = []
    logins = _logins(ctx)
    for worker, method, jwt in logins:
        token = _login(ctx, worker, method, jwt)
        _logout(ctx, worker.name, token)
        bound = method.max_token_ttl.seconds
        ev.add(
            f"{worker.name}: login token lives {token.lifetime} s (CreateTime to "
            f"ExpirationTime); max_token_ttl {method.max_token_ttl.text}"
        )
        if token.lifetime is None or token.lifetime > bound:
            problems.append(
                f"{worker.name}: a login token lives {token.lifetime} s, over the auth method "
                f"{method.name}'s max_token_ttl {method.max_token_ttl.text} (or never expires)"
            )
    if problems:
        raise CheckFailed("; ".join(problems))
    return f"{len(logins)} login tokens expire within their auth method's max_token_ttl"


def check_login_refused(ctx: VerifyContext, ev: Evidence) -> str:
    problems = []
    logins = _logins(ctx)
    tries: list[tuple[str, str, Secret]] = []  # (what, through which method, the JWT)
    for worker, method, jwt in logins:
        forged = rewrite_claims(jwt.reveal(), _other_claims(ctx, worker, method))
        tries.append((f"{worker.name}'s JWT with another identity's claims", method.name, forged))
    workers = {worker.name for worker in ctx.spec.workers}
    for name, jwt in sorted(ctx.bearer_tokens.items()):
        if name not in workers:  # a stranger's: no binding rule may select it
            tries += [(f"{name}'s JWT", method.name, jwt) for method in ctx.spec.auth_methods]
    anonymous = ctx.client(logins[0][0].name, token=None)
    for what, method_name, jwt in tries:
        try:
            made = anonymous.identity.login(method_name, jwt)
        except ConsulHTTPError as exc:
            reason = refusal_reason(exc.status, exc.body)
            ev.add(f"login through {method_name} with {what} -> {exc.status} {reason}")
            if reason is None:
                problems.append(f"login through {method_name} with {what}: {exc.status}")
            continue
        anonymous.identity.logout(made.secret)  # it should not exist: it goes at once
        ev.add(f"login through {method_name} with {what} -> 200, token {made.accessor_id}")
        problems.append(f"login through {method_name} with {what} was accepted, not refused")
    if problems:
        raise CheckFailed("; ".join(problems))
    return f"{len(tries)} logins with a JWT of an unknown identity refused"


def _other_claims(ctx: VerifyContext, worker: Worker, method: AuthMethod) -> dict[str, str]:
    """The claims (by JSON pointer or name) of another worker of `method`, else a stranger's."""
    mapping = dict(method.claim_mappings)
    for other in ctx.spec.workers:
        theirs = other.identity
        if theirs and other.name != worker.name and theirs.auth_method == method.name:
            return {mapping[name]: value for name, value in theirs.claims}
    assert worker.identity is not None
    return {mapping[name]: STRANGER for name, _ in worker.identity.claims}


def rewrite_claims(jwt: str, claims: dict[str, str]) -> Secret:
    """`jwt` with each claim (a top-level name, or a JSON pointer such as
    /kubernetes.io/serviceaccount/name) set to its value, and the signature left as it was: a
    token no issuer signed, which Consul must refuse."""
    parts = jwt.split(".")
    if len(parts) != 3:
        raise CheckFailed("the JWT given is not header.payload.signature")
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (binascii.Error, ValueError):
        raise CheckFailed("the JWT given has no JSON payload") from None
    for claim, value in claims.items():
        _set_pointer(payload, claim, value)
    encoded = base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=").decode()
    return Secret(f"{parts[0]}.{encoded}.{parts[2]}")


def _set_pointer(document: dict[str, Any], claim: str, value: str) -> None:
    steps = claim[1:].split("/") if claim.startswith("/") else [claim]
    steps = [step.replace("~1", "/").replace("~0", "~") for step in steps]
    target = document
    for step in steps[:-1]:
        nested = target.get(step)
        if not isinstance(nested, dict):
            nested = target[step] = {}
        target = nested
    target[steps[-1]] = value
