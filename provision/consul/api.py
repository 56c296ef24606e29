"""Consul's HTTP API, one small method per endpoint, grouped by area (hvac's shape).

Each method builds the path and parameters and calls the transport; the docstring's second line
names the endpoint. Methods that change nothing, or whose repetition is harmless, are marked
idempotent so the transport may retry them.
"""

from __future__ import annotations

from typing import Any

from provision.consul.answers import ConsulResponse
from provision.consul.errors import NotFound, PermissionDenied
from provision.consul.keys import checked_key
from provision.consul.models import (
    AclReplication,
    KVEntry,
    NodeCheck,
    Policy,
    ReadMeta,
    Session,
    Token,
)
from provision.consul.transport import (
    DEFAULT_TOKEN,
    IDEMPOTENT,
    Call,
    RetryPolicy,
    Sending,
    TokenChoice,
    Transport,
    quote_path,
)
from provision.system.secrets import Secret

CONSISTENCY_MODES = ("default", "consistent", "stale")
DEFAULT_BLOCKING_WAIT = 300.0  # Consul's own default for a blocking query without `wait`


def _seconds(value: float) -> str:
    """Consul duration syntax for a number of seconds."""
    return f"{value:g}s"


class _Area:
    def __init__(self, transport: Transport) -> None:
        self._transport = transport


class StatusAPI(_Area):
    def leader(self, *, retry: RetryPolicy | None = None, timeout: float | None = None) -> str:
        """The raft leader's address, or "" while there is none.
        GET /v1/status/leader"""
        answer = self._transport.request(
            Call("GET", "/v1/status/leader"), Sending(idempotent=True, retry=retry, timeout=timeout)
        )
        return str(answer.body or "")

    def peers(self) -> list[str]:
        """The raft peers' addresses.
        GET /v1/status/peers"""
        return list(self._transport.request(Call("GET", "/v1/status/peers"), IDEMPOTENT).body)


class AgentAPI(_Area):
    def self(self, *, token: TokenChoice = DEFAULT_TOKEN) -> dict[str, Any]:
        """The agent's configuration and member record (needs agent read).
        GET /v1/agent/self"""
        answer = self._transport.request(Call("GET", "/v1/agent/self", token=token), IDEMPOTENT)
        return dict(answer.body)

    def members(self) -> list[dict[str, Any]]:
        """The LAN members this agent sees.
        GET /v1/agent/members"""
        return list(self._transport.request(Call("GET", "/v1/agent/members"), IDEMPOTENT).body)

    def set_agent_token(self, secret: Secret) -> None:
        """Give the agent the token it uses for its own operations (node registration).
        PUT /v1/agent/token/agent"""
        self._transport.request(
            Call(
                "PUT",
                "/v1/agent/token/agent",
                json_body={"Token": secret.reveal()},
                redact=(secret,),
            ),
            IDEMPOTENT,
        )


class HealthAPI(_Area):
    def checks_in_state(self, state: str = "any") -> list[dict[str, Any]]:
        """Every health check in `state` (any, passing, warning, critical), on every node.
        GET /v1/health/state/:state"""
        path = "/v1/health/state/" + quote_path(state)
        return list(self._transport.request(Call("GET", path), IDEMPOTENT).body or ())

    def node_checks(self, node: str, *, consistency: str = "default") -> list[NodeCheck]:
        """The health checks of one node (serfHealth among them for a node with an agent);
        empty for an unknown node, and for a token without node read on it (Consul filters).
        GET /v1/health/node/:node"""
        path = "/v1/health/node/" + quote_path(node)
        call = Call("GET", path, params=_consistency(consistency))
        body = self._transport.request(call, IDEMPOTENT).body or ()
        return [NodeCheck.from_api(raw) for raw in body]


class ACLAPI(_Area):
    def bootstrap(self, *, retry: RetryPolicy | None = None) -> Token:
        """Create the initial management token (only once per cluster).
        PUT /v1/acl/bootstrap"""
        return Token.from_api(
            self._transport.request(Call("PUT", "/v1/acl/bootstrap"), Sending(retry=retry)).body
        )

    def create_policy(self, name: str, rules: str, description: str = "") -> Policy:
        """Create a policy.
        PUT /v1/acl/policy"""
        body = {"Name": name, "Rules": rules, "Description": description}
        return Policy.from_api(
            self._transport.request(Call("PUT", "/v1/acl/policy", json_body=body)).body
        )

    def read_policy(self, policy_id: str) -> Policy:
        """Read a policy by ID.
        GET /v1/acl/policy/:id"""
        path = "/v1/acl/policy/" + quote_path(policy_id)
        return Policy.from_api(self._transport.request(Call("GET", path), IDEMPOTENT).body)

    def read_policy_by_name(self, name: str) -> Policy | None:
        """Read a policy by name, or None if there is none (Consul 1.7.3+).
        GET /v1/acl/policy/name/:name

        Consul 1.8 answers a missing name with 403 "ACL not found", the same status as a denied
        call; newer versions answer 404. On 403 the policy list (which a denied caller cannot
        read either) tells the two apart, without branching on error text.
        """
        path = "/v1/acl/policy/name/" + quote_path(name)
        try:
            return Policy.from_api(self._transport.request(Call("GET", path), IDEMPOTENT).body)
        except NotFound:
            return None
        except PermissionDenied:
            listed = next((p for p in self.list_policies() if p.name == name), None)
            return self.read_policy(listed.id) if listed else None

    def update_policy(self, policy_id: str, name: str, rules: str, description: str = "") -> Policy:
        """Replace a policy's name, rules and description.
        PUT /v1/acl/policy/:id"""
        body = {"ID": policy_id, "Name": name, "Rules": rules, "Description": description}
        path = "/v1/acl/policy/" + quote_path(policy_id)
        answer = self._transport.request(Call("PUT", path, json_body=body), IDEMPOTENT)
        return Policy.from_api(answer.body)

    def delete_policy(self, policy_id: str) -> None:
        """Delete a policy.
        DELETE /v1/acl/policy/:id"""
        self._transport.request(
            Call("DELETE", "/v1/acl/policy/" + quote_path(policy_id)), IDEMPOTENT
        )

    def list_policies(self, *, datacenter: str | None = None) -> list[Policy]:
        """Every policy, without rules (one request whatever the count); `datacenter`: as
        that datacenter's servers know them (a secondary's replica of the primary's).
        GET /v1/acl/policies"""
        call = Call("GET", "/v1/acl/policies", params=_in_datacenter(datacenter))
        answer = self._transport.request(call, IDEMPOTENT)
        return [Policy.from_api(raw) for raw in answer.body or ()]

    def create_token(
        self, description: str, policy_names: list[str], *, local: bool = False
    ) -> Token:
        """Mint a token carrying the named policies; the answer holds its secret.
        PUT /v1/acl/token"""
        body = {
            "Description": description,
            "Policies": [{"Name": name} for name in policy_names],
            "Local": local,
        }
        return Token.from_api(
            self._transport.request(Call("PUT", "/v1/acl/token", json_body=body)).body
        )

    def read_token(self, accessor_id: str) -> Token:
        """Read a token by accessor ID (the answer holds the secret for a management caller).
        GET /v1/acl/token/:accessor_id"""
        path = "/v1/acl/token/" + quote_path(accessor_id)
        return Token.from_api(self._transport.request(Call("GET", path), IDEMPOTENT).body)

    def read_self_token(
        self, *, token: TokenChoice = DEFAULT_TOKEN, datacenter: str | None = None
    ) -> Token:
        """Read the token the call is made with; `datacenter`: as that datacenter's servers
        resolve it (a secondary answers 403 "ACL not found" until it is replicated there).
        GET /v1/acl/token/self"""
        call = Call("GET", "/v1/acl/token/self", params=_in_datacenter(datacenter), token=token)
        return Token.from_api(self._transport.request(call, IDEMPOTENT).body)

    def update_token(self, accessor_id: str, description: str, policy_names: list[str]) -> Token:
        """Replace a token's description and policies (its secret stays).
        PUT /v1/acl/token/:accessor_id"""
        body = {
            "AccessorID": accessor_id,
            "Description": description,
            "Policies": [{"Name": name} for name in policy_names],
        }
        path = "/v1/acl/token/" + quote_path(accessor_id)
        return Token.from_api(
            self._transport.request(Call("PUT", path, json_body=body), IDEMPOTENT).body
        )

    def delete_token(self, accessor_id: str) -> None:
        """Revoke a token.
        DELETE /v1/acl/token/:accessor_id"""
        path = "/v1/acl/token/" + quote_path(accessor_id)
        self._transport.request(Call("DELETE", path), IDEMPOTENT)

    def replication(self) -> AclReplication:
        """This server's ACL replication from the primary datacenter (a secondary's view).
        GET /v1/acl/replication"""
        answer = self._transport.request(Call("GET", "/v1/acl/replication"), IDEMPOTENT)
        return AclReplication.from_api(answer.body or {})

    def list_tokens(self) -> list[Token]:
        """Every token, without secrets (one request whatever the count).
        GET /v1/acl/tokens"""
        answer = self._transport.request(Call("GET", "/v1/acl/tokens"), IDEMPOTENT)
        return [Token.from_api(raw) for raw in answer.body or ()]


class SessionAPI(_Area):
    def create(
        self,
        *,
        name: str,
        ttl: float,
        lock_delay: float,
        node: str | None = None,
        behavior: str = "release",
        checks: tuple[str, ...] = ("serfHealth",),
        token: TokenChoice = DEFAULT_TOKEN,
    ) -> str:
        """Create a session on the serving agent's node (or `node`); returns its ID.
        PUT /v1/session/create"""
        body: dict[str, Any] = {
            "Name": name,
            "TTL": _seconds(ttl),
            "LockDelay": _seconds(lock_delay),
            "Behavior": behavior,
            "Checks": list(checks),
        }
        if not checks:  # a TTL-only session: 1.8.7 honours either field; newer ones NodeChecks
            body["NodeChecks"] = []
        if node is not None:
            body["Node"] = node
        # Retried like an idempotent call: a repeat at worst leaves one unused session behind,
        # which holds nothing and ends with its TTL. Clients see 500 "stream closed" for a while
        # after a server restarts, and a runner must not skip its tick for that.
        answer = self._transport.request(
            Call("PUT", "/v1/session/create", json_body=body, token=token), IDEMPOTENT
        )
        return str(answer.body["ID"])

    def renew(
        self, session_id: str, *, timeout: float | None = None, retry: RetryPolicy | None = None
    ) -> Session:
        """Reset the session's TTL; raises NotFound once the session is gone. Urgent: the
        fencing clock of every lock under the session waits for it.
        PUT /v1/session/renew/:id"""
        path = "/v1/session/renew/" + quote_path(session_id)
        answer = self._transport.request(
            Call("PUT", path), Sending(idempotent=True, timeout=timeout, retry=retry, urgent=True)
        )
        return Session.from_api(answer.body[0])

    def destroy(self, session_id: str, *, token: TokenChoice = DEFAULT_TOKEN) -> bool:
        """Invalidate the session; its locks are released after LockDelay.
        PUT /v1/session/destroy/:id"""
        path = "/v1/session/destroy/" + quote_path(session_id)
        return bool(self._transport.request(Call("PUT", path, token=token), IDEMPOTENT).body)

    def info(self, session_id: str, *, consistency: str = "default") -> Session | None:
        """The session, or None if it does not exist (any more).
        GET /v1/session/info/:id"""
        path = "/v1/session/info/" + quote_path(session_id)
        answer = self._transport.request(
            Call("GET", path, params=_consistency(consistency)), IDEMPOTENT
        )
        return Session.from_api(answer.body[0]) if answer.body else None

    def list(self, *, node: str | None = None) -> list[Session]:
        """All sessions, or those of one node.
        GET /v1/session/list, GET /v1/session/node/:node"""
        path = "/v1/session/list" if node is None else "/v1/session/node/" + quote_path(node)
        answer = self._transport.request(Call("GET", path), IDEMPOTENT)
        return [Session.from_api(raw) for raw in answer.body or ()]


class KVAPI(_Area):
    def get(
        self,
        key: str,
        *,
        consistency: str = "default",
        index: int | None = None,
        wait: float | None = None,
        token: TokenChoice = DEFAULT_TOKEN,
        max_bytes: int | None = None,
    ) -> tuple[KVEntry | None, ReadMeta]:
        """Read one key (None if absent) with its consistency headers; with `index`, block until
        the key changes past that index or `wait` runs out; `max_bytes`: AnswerTooLarge past
        that many bytes of answer (a value is base64 in it: 4/3 of its size, plus ~200).
        GET /v1/kv/:key"""
        params = _consistency(consistency)
        timeout = None
        if index is not None:
            params["index"] = index
            # Sent explicitly so the client timeout below always matches the server's hold.
            wait = DEFAULT_BLOCKING_WAIT if wait is None else wait
            params["wait"] = _seconds(wait)
            # Consul adds up to wait/16 of jitter; the client timeout must outlast both.
            timeout = self._transport.settings.timeout + wait * 17 / 16
        try:
            call = Call("GET", _key_path(key), params=params, token=token, max_bytes=max_bytes)
            answer = self._transport.request(call, Sending(idempotent=True, timeout=timeout))
        except NotFound as missing:
            absent = ConsulResponse(404, None, missing.headers)
            return None, _meta(absent)
        return KVEntry.from_api(answer.body[0]), _meta(answer)

    def tree(self, prefix: str, *, token: TokenChoice = DEFAULT_TOKEN) -> list[KVEntry]:
        """Every key under `prefix` with its value ([] when there is none).
        GET /v1/kv/:prefix?recurse"""
        try:
            call = Call("GET", _key_path(prefix), params={"recurse": ""}, token=token)
            answer = self._transport.request(call, IDEMPOTENT)
        except NotFound:
            return []
        return [KVEntry.from_api(raw) for raw in answer.body or ()]

    def keys(self, prefix: str, *, token: TokenChoice = DEFAULT_TOKEN) -> list[str]:
        """The names of the keys under `prefix`, without their values ([] when there is none).
        GET /v1/kv/:prefix?keys"""
        return self.key_names(prefix, token=token)[0]

    def key_names(
        self,
        prefix: str,
        *,
        separator: str | None = None,
        max_bytes: int | None = None,
        token: TokenChoice = DEFAULT_TOKEN,
    ) -> tuple[list[str], ReadMeta]:
        """The names under `prefix` ([] when there is none) and the read's headers; with
        `separator`, a name ends at the first one after the prefix (a folder's keys are one
        name); `max_bytes`: AnswerTooLarge past that many bytes of answer.
        GET /v1/kv/:prefix?keys&separator="""
        params: dict[str, str | int] = {"keys": ""}
        if separator is not None:
            params["separator"] = separator
        try:
            call = Call("GET", _key_path(prefix), params, token=token, max_bytes=max_bytes)
            answer = self._transport.request(call, IDEMPOTENT)
        except NotFound as missing:
            return [], _meta(ConsulResponse(404, None, missing.headers))
        names = answer.body if isinstance(answer.body, list) else []
        return [str(key) for key in names], _meta(answer)

    def put(
        self,
        key: str,
        value: bytes = b"",
        *,
        acquire: str | None = None,
        release: str | None = None,
        cas: int | None = None,
        token: TokenChoice = DEFAULT_TOKEN,
        retry: RetryPolicy | None = None,
    ) -> bool:
        """Write a key; with `acquire`/`release`/`cas` the answer says whether it took effect.
        PUT /v1/kv/:key"""
        params: dict[str, str | int] = {}
        if acquire is not None:
            params["acquire"] = acquire
        if release is not None:
            params["release"] = release
        if cas is not None:
            params["cas"] = cas
        call = Call("PUT", _key_path(key), params, data=value, token=token)
        answer = self._transport.request(call, Sending(retry=retry))
        return answer.body is True

    def delete(
        self,
        key: str,
        *,
        cas: int | None = None,
        recurse: bool = False,
        token: TokenChoice = DEFAULT_TOKEN,
    ) -> bool:
        """Delete a key (or a prefix with `recurse`); with `cas`, only at that ModifyIndex.
        DELETE /v1/kv/:key"""
        params: dict[str, str | int] = {}
        if cas is not None:
            params["cas"] = cas
        if recurse:
            params["recurse"] = "true"
        call = Call("DELETE", _key_path(key), params, token=token)
        answer = self._transport.request(call, Sending(idempotent=cas is None))
        return answer.body is True


def _key_path(key: str) -> str:
    """/v1/kv/:key, the key checked and quoted."""
    return "/v1/kv/" + quote_path(checked_key(key))


def _consistency(mode: str) -> dict[str, str | int]:
    if mode not in CONSISTENCY_MODES:
        raise ValueError(f"consistency must be one of {CONSISTENCY_MODES}, not {mode!r}")
    return {} if mode == "default" else {mode: ""}


def _meta(answer: ConsulResponse) -> ReadMeta:
    return ReadMeta(answer.index, answer.known_leader, answer.last_contact_ms, answer.date)


def _in_datacenter(datacenter: str | None) -> dict[str, str | int] | None:
    """An ACL call's `?dc=` (ACLs are global: the transport adds it to no ACL path itself)."""
    return None if datacenter is None else {"dc": datacenter}
