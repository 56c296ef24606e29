"""The transport and API layer without a cluster: timeouts, retries, error mapping, no leaks.

`responses` fakes answers a real Consul cannot be made to give (a 502, a token echoed back, a
reset at will); a tiny real HTTP server in a thread provides true read timeouts and resets.
Time is a fake clock whose `sleep` advances it, so retry tests are instant and exact.
"""

from __future__ import annotations

import base64
import logging
import random
import re
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests
import responses

from provision.consul import Consul, ConsulSettings, RetryPolicy, answers
from provision.consul.errors import (
    AnswerTooLarge,
    ConsulError,
    ConsulHTTPError,
    ConsulServerError,
    ConsulUnavailable,
    NotFound,
    PermissionDenied,
)
from provision.consul.gate import CallGate
from provision.consul.models import Session
from provision.consul.transport import NO_RETRY, Call, HTTPPool, Sending, Transport
from provision.consul.txn import KVOp, TxnAPI
from provision.errors import EXIT_CONSUL_API, EXIT_DENIED, EXIT_UNAVAILABLE
from provision.system.secrets import MASK, Secret

ADDRESS = "http://127.0.0.1:8500"
TOKEN = "0f9e7a52-1111-4222-8333-44445555aaaa"
OTHER = "c0ffee00-dead-4bee-8f00-000000000042"
TIMEOUT = 3.0
SESSION_ID = "8b2d0a4e-6c1f-4a57-9b1e-2f5c3d7e9a01"

POLICY = {"ID": "p-1", "Name": "web", "Description": "", "Rules": "", "ModifyIndex": 7}
TOKEN_BODY = {"AccessorID": "a-1", "SecretID": OTHER, "Description": "d", "Policies": []}
SESSION = {"ID": SESSION_ID, "Name": "n", "Node": "worker-1", "TTL": "15s", "LockDelay": 0}
ENTRY = {"Key": "k", "Value": base64.b64encode(b"v").decode(), "LockIndex": 0, "ModifyIndex": 3}


# --- helpers --------------------------------------------------------------------------------


@dataclass
class FakeClock:
    """A monotonic clock that only moves when the code under test sleeps."""

    now: float = 1000.0
    sleeps: list[float] = field(default_factory=list)

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class RecordingSession(requests.Session):
    """A real requests.Session that remembers the keyword arguments of every request."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[dict[str, Any]] = []

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> Any:
        self.sent.append({"method": method, "url": url, **kwargs})
        return super().request(method, url, *args, **kwargs)


@pytest.fixture
def http() -> Iterator[RecordingSession]:
    with RecordingSession() as session:
        yield session


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(autouse=True)
def no_jitter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Backoff jitter always takes its upper bound, so pauses are exact."""
    monkeypatch.setattr(random, "uniform", lambda low, high: high)


@pytest.fixture
def mocked() -> Iterator[responses.RequestsMock]:
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield mock


def make_transport(
    http: requests.Session,
    clock: FakeClock,
    *,
    retry: RetryPolicy = NO_RETRY,
    token: str | None = TOKEN,
    address: str = ADDRESS,
    timeout: float = TIMEOUT,
) -> Transport:
    settings = ConsulSettings(
        address=address, token=Secret(token) if token else None, timeout=timeout
    )
    return Transport(settings, HTTPPool(http, clock=clock, sleep=clock.sleep), retry=retry)


def make_consul(transport: Transport) -> Consul:
    consul = Consul(transport.settings, session=transport.session, retry=transport.retry)
    consul.transport = transport
    for area in (consul.status, consul.agent, consul.health, consul.acl, consul.session, consul.kv):
        area._transport = transport
    return consul


@pytest.fixture(scope="module")
def refused() -> requests.exceptions.ConnectionError:
    """A genuine connection-refused error, from a port nobody listens on (made before
    `responses` is active, which would answer instead)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    try:
        with requests.Session() as session:
            session.get(f"http://127.0.0.1:{port}/", timeout=2)
    except requests.exceptions.ConnectionError as exc:
        return exc
    raise AssertionError("a closed port answered")


ANY_URL = re.compile(r"http://127\.0\.0\.1:8500/.*")


def echo_token_everywhere(mock: responses.RequestsMock, status: int) -> None:
    """Answer every call with an error body quoting the token it was sent, twice."""

    def echo(request: requests.PreparedRequest) -> tuple[int, dict[str, str], str]:
        sent = request.headers.get("X-Consul-Token", "")
        return status, {}, f'ACL not found: token "{sent}" is unknown\n{sent}'

    for method in ("GET", "PUT", "DELETE"):
        mock.add_callback(method, ANY_URL, callback=echo)


# Every endpoint of api.py: (id, call, HTTP method, path, canned answer, idempotent).
EndpointCall = Callable[[Consul], object]
ENDPOINTS: list[tuple[str, EndpointCall, str, str, Any, bool]] = [
    ("status.leader", lambda c: c.status.leader(), "GET", "/v1/status/leader", "a:8300", True),
    ("status.peers", lambda c: c.status.peers(), "GET", "/v1/status/peers", ["a:8300"], True),
    ("agent.self", lambda c: c.agent.self(), "GET", "/v1/agent/self", {"Config": {}}, True),
    ("agent.members", lambda c: c.agent.members(), "GET", "/v1/agent/members", [], True),
    (
        "agent.set_agent_token",
        lambda c: c.agent.set_agent_token(Secret(OTHER)),
        "PUT",
        "/v1/agent/token/agent",
        None,
        True,
    ),
    (
        "health.checks_in_state",
        lambda c: c.health.checks_in_state("passing"),
        "GET",
        "/v1/health/state/passing",
        [],
        True,
    ),
    ("acl.bootstrap", lambda c: c.acl.bootstrap(), "PUT", "/v1/acl/bootstrap", TOKEN_BODY, False),
    (
        "acl.create_policy",
        lambda c: c.acl.create_policy("web", ""),
        "PUT",
        "/v1/acl/policy",
        POLICY,
        False,
    ),
    (
        "acl.read_policy",
        lambda c: c.acl.read_policy("p-1"),
        "GET",
        "/v1/acl/policy/p-1",
        POLICY,
        True,
    ),
    (
        "acl.read_policy_by_name",
        lambda c: c.acl.read_policy_by_name("web"),
        "GET",
        "/v1/acl/policy/name/web",
        POLICY,
        True,
    ),
    (
        "acl.update_policy",
        lambda c: c.acl.update_policy("p-1", "web", ""),
        "PUT",
        "/v1/acl/policy/p-1",
        POLICY,
        True,
    ),
    (
        "acl.delete_policy",
        lambda c: c.acl.delete_policy("p-1"),
        "DELETE",
        "/v1/acl/policy/p-1",
        True,
        True,
    ),
    (
        "acl.list_policies",
        lambda c: c.acl.list_policies(),
        "GET",
        "/v1/acl/policies",
        [POLICY],
        True,
    ),
    (
        "acl.create_token",
        lambda c: c.acl.create_token("d", ["web"]),
        "PUT",
        "/v1/acl/token",
        TOKEN_BODY,
        False,
    ),
    (
        "acl.read_token",
        lambda c: c.acl.read_token("a-1"),
        "GET",
        "/v1/acl/token/a-1",
        TOKEN_BODY,
        True,
    ),
    (
        "acl.read_self_token",
        lambda c: c.acl.read_self_token(),
        "GET",
        "/v1/acl/token/self",
        TOKEN_BODY,
        True,
    ),
    (
        "acl.update_token",
        lambda c: c.acl.update_token("a-1", "d", ["web"]),
        "PUT",
        "/v1/acl/token/a-1",
        TOKEN_BODY,
        True,
    ),
    (
        "acl.delete_token",
        lambda c: c.acl.delete_token("a-1"),
        "DELETE",
        "/v1/acl/token/a-1",
        True,
        True,
    ),
    ("acl.list_tokens", lambda c: c.acl.list_tokens(), "GET", "/v1/acl/tokens", [TOKEN_BODY], True),
    (
        "session.create",
        lambda c: c.session.create(name="n", ttl=15, lock_delay=1),
        "PUT",
        "/v1/session/create",
        {"ID": SESSION_ID},
        True,  # a repeat at worst leaves an unused session that its TTL ends
    ),
    (
        "session.renew",
        lambda c: c.session.renew(SESSION_ID),
        "PUT",
        f"/v1/session/renew/{SESSION_ID}",
        [SESSION],
        True,
    ),
    (
        "session.destroy",
        lambda c: c.session.destroy(SESSION_ID),
        "PUT",
        f"/v1/session/destroy/{SESSION_ID}",
        True,
        True,
    ),
    (
        "session.info",
        lambda c: c.session.info(SESSION_ID),
        "GET",
        f"/v1/session/info/{SESSION_ID}",
        [SESSION],
        True,
    ),
    ("session.list", lambda c: c.session.list(), "GET", "/v1/session/list", [SESSION], True),
    (
        "session.list_node",
        lambda c: c.session.list(node="worker-1"),
        "GET",
        "/v1/session/node/worker-1",
        [SESSION],
        True,
    ),
    ("kv.get", lambda c: c.kv.get("a/b"), "GET", "/v1/kv/a/b", [ENTRY], True),
    ("kv.put", lambda c: c.kv.put("a/b", b"v"), "PUT", "/v1/kv/a/b", True, False),
    (
        "kv.put_acquire",
        lambda c: c.kv.put("a/b", b"v", acquire=SESSION_ID),
        "PUT",
        "/v1/kv/a/b",
        True,
        False,
    ),
    (
        "kv.put_release",
        lambda c: c.kv.put("a/b", release=SESSION_ID),
        "PUT",
        "/v1/kv/a/b",
        True,
        False,
    ),
    ("kv.put_cas", lambda c: c.kv.put("a/b", b"v", cas=3), "PUT", "/v1/kv/a/b", True, False),
    ("kv.delete", lambda c: c.kv.delete("a/b"), "DELETE", "/v1/kv/a/b", True, True),
    ("kv.delete_cas", lambda c: c.kv.delete("a/b", cas=3), "DELETE", "/v1/kv/a/b", True, False),
]
ENDPOINT_IDS = [row[0] for row in ENDPOINTS]


# --- every call: timeout, token header, path ------------------------------------------------


@pytest.mark.parametrize(
    ("name", "call", "method", "path", "body", "idem"), ENDPOINTS, ids=ENDPOINT_IDS
)
def test_every_call_sends_a_timeout_the_token_and_the_right_route(
    http: RecordingSession,
    clock: FakeClock,
    mocked: responses.RequestsMock,
    name: str,
    call: EndpointCall,
    method: str,
    path: str,
    body: Any,
    idem: bool,
) -> None:
    mocked.add(method, ADDRESS + path, json=body)
    call(make_consul(make_transport(http, clock)))
    assert len(http.sent) == 1
    sent = http.sent[0]
    assert sent["timeout"].total == TIMEOUT  # connect and reads share it
    assert sent["allow_redirects"] is False
    assert sent["headers"] == {"X-Consul-Token": TOKEN}
    assert len(mocked.calls) == 1
    assert mocked.calls[0].request.method == method
    assert str(mocked.calls[0].request.url).split("?")[0] == ADDRESS + path
    assert getattr(mocked.calls[0].request, "req_kwargs", {})["timeout"].total == TIMEOUT


def test_no_token_sends_no_token_header(
    http: RecordingSession, clock: FakeClock, mocked: responses.RequestsMock
) -> None:
    mocked.add("GET", ADDRESS + "/v1/status/leader", json="a")
    make_consul(make_transport(http, clock, token=None)).status.leader()
    assert "X-Consul-Token" not in mocked.calls[0].request.headers
    assert http.sent[0]["headers"] == {}


def test_a_per_call_token_replaces_the_settings_token(
    http: RecordingSession, clock: FakeClock, mocked: responses.RequestsMock
) -> None:
    mocked.add("GET", ADDRESS + "/v1/agent/self", json={})
    mocked.add("GET", ADDRESS + "/v1/agent/self", json={})
    consul = make_consul(make_transport(http, clock))
    consul.agent.self(token=Secret(OTHER))
    consul.agent.self(token=None)
    assert mocked.calls[0].request.headers["X-Consul-Token"] == OTHER
    assert "X-Consul-Token" not in mocked.calls[1].request.headers


def test_blocking_get_timeout_outlasts_wait_and_jitter(
    http: RecordingSession, clock: FakeClock, mocked: responses.RequestsMock
) -> None:
    mocked.add("GET", ADDRESS + "/v1/kv/a", json=[ENTRY], headers={"X-Consul-Index": "12"})
    make_consul(make_transport(http, clock)).kv.get("a", index=11, wait=32)
    assert http.sent[0]["timeout"].total == TIMEOUT + 32 * 17 / 16
    assert http.sent[0]["params"] == {"index": 11, "wait": "32s"}


def test_blocking_get_without_wait_still_outlasts_consuls_default_wait(
    http: RecordingSession, clock: FakeClock, mocked: responses.RequestsMock
) -> None:
    """Consul holds a query with `index` and no `wait` for 5 minutes; a 10 s client timeout
    would turn every quiet blocking read into a ConsulUnavailable."""
    mocked.add("GET", ADDRESS + "/v1/kv/a", json=[ENTRY], headers={"X-Consul-Index": "12"})
    make_consul(make_transport(http, clock)).kv.get("a", index=11)
    sent = http.sent[0]
    wait = float(str(sent["params"]["wait"]).removesuffix("s"))
    assert sent["timeout"].total > wait * 17 / 16


@pytest.mark.parametrize(
    ("consistency", "params"),
    [("default", {}), ("consistent", {"consistent": ""}), ("stale", {"stale": ""})],
)
def test_consistency_modes_become_query_flags(
    http: RecordingSession,
    clock: FakeClock,
    mocked: responses.RequestsMock,
    consistency: str,
    params: dict[str, str],
) -> None:
    mocked.add("GET", ADDRESS + "/v1/kv/a", json=[ENTRY])
    make_consul(make_transport(http, clock)).kv.get("a", consistency=consistency)
    assert http.sent[0]["params"] == params


def test_unknown_consistency_mode_is_refused_before_any_request(
    http: RecordingSession, clock: FakeClock
) -> None:
    with pytest.raises(ValueError, match="consistency"):
        make_consul(make_transport(http, clock)).kv.get("a", consistency="linearizable")
    assert http.sent == []


def test_read_meta_headers_are_parsed_whatever_their_case(
    http: RecordingSession, clock: FakeClock, mocked: responses.RequestsMock
) -> None:
    """HTTP header names are case-insensitive; a proxy (or HTTP/2) may lower-case them."""
    headers = {"x-consul-index": "42", "x-consul-knownleader": "true", "x-consul-lastcontact": "7"}
    mocked.add("GET", ADDRESS + "/v1/kv/a", json=[ENTRY], headers=headers)
    _, meta = make_consul(make_transport(http, clock)).kv.get("a")
    assert (meta.index, meta.known_leader, meta.last_contact_ms) == (42, True, 7)


def test_missing_key_is_none_with_the_index_of_the_404(
    http: RecordingSession, clock: FakeClock, mocked: responses.RequestsMock
) -> None:
    headers = {"X-Consul-Index": "99", "X-Consul-Knownleader": "false", "X-Consul-Lastcontact": "0"}
    mocked.add("GET", ADDRESS + "/v1/kv/missing", status=404, body="", headers=headers)
    entry, meta = make_consul(make_transport(http, clock)).kv.get("missing")
    assert entry is None
    assert (meta.index, meta.known_leader, meta.last_contact_ms) == (99, False, 0)


def test_an_answer_read_with_a_byte_cap_ends_past_it_and_says_where(
    http: RecordingSession, clock: FakeClock, mocked: responses.RequestsMock
) -> None:
    """Consul has no size filter: a value anyone may write (512 KB) is read whole unless the
    reader stops. Under the cap the answer is the usual one; past it AnswerTooLarge (exit 5,
    not retried, naming the call), never the body."""
    big = {**ENTRY, "Value": base64.b64encode(b"\x1b" * 200_000).decode()}
    mocked.add("GET", ADDRESS + "/v1/kv/big", json=[big])
    mocked.add("GET", ADDRESS + "/v1/kv/small", json=[ENTRY])
    consul = make_consul(make_transport(http, clock, retry=RetryPolicy()))
    with pytest.raises(AnswerTooLarge) as raised:
        consul.kv.get("big", max_bytes=4096)
    assert str(raised.value) == (
        f"consul: GET /v1/kv/big on {ADDRESS}: answer over 4096 bytes: not read further"
    )
    assert raised.value.exit_code == EXIT_CONSUL_API and len(http.sent) == 1
    assert http.sent[0]["stream"] is True
    entry, _ = consul.kv.get("small", max_bytes=4096)
    assert entry is not None and entry.value == b"v"
    entry, _ = consul.kv.get("big", max_bytes=400_000)
    assert entry is not None and len(entry.value or b"") == 200_000


def test_a_denied_transaction_names_the_keys_it_may_not_read(
    http: RecordingSession, clock: FakeClock, mocked: responses.RequestsMock
) -> None:
    """Consul says `Permission denied` per operation (409): the message names each one's verb
    and key, not its number alone."""
    errors = [{"OpIndex": 1, "What": "Permission denied"}]
    mocked.add("PUT", ADDRESS + "/v1/txn", status=409, json={"Errors": errors})
    consul = make_consul(make_transport(http, clock))
    consul.txn = TxnAPI(consul.transport)
    ops = [KVOp("get", "locks/a/.lock"), KVOp("get", "locks/a/ticks/2026-12-01T02:00:00Z")]
    with pytest.raises(PermissionDenied) as raised:
        consul.txn.kv(ops)
    assert str(raised.value).endswith(
        "409 Permission denied (operation 1 (get locks/a/ticks/2026-12-01T02:00:00Z))"
    )


def test_kv_key_and_ids_are_url_quoted_but_slashes_kept(
    http: RecordingSession, clock: FakeClock, mocked: responses.RequestsMock
) -> None:
    mocked.add("PUT", ADDRESS + "/v1/kv/jobs/a%20b%3Fc%23d/.lock", json=True)
    assert make_consul(make_transport(http, clock)).kv.put("jobs/a b?c#d/.lock", b"x") is True
    assert mocked.calls[0].request.body == b"x"


# --- retries --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "call", "method", "path", "body", "idem"), ENDPOINTS, ids=ENDPOINT_IDS
)
def test_every_call_is_retried_when_the_connection_is_refused(
    refused: requests.exceptions.ConnectionError,
    http: RecordingSession,
    clock: FakeClock,
    mocked: responses.RequestsMock,
    name: str,
    call: EndpointCall,
    method: str,
    path: str,
    body: Any,
    idem: bool,
) -> None:
    """Refused means nothing was sent: safe to retry even a session create or an acquire."""
    mocked.add(method, ADDRESS + path, body=refused)
    mocked.add(method, ADDRESS + path, body=refused)
    mocked.add(method, ADDRESS + path, json=body)
    retry = RetryPolicy(deadline=10.0, first_backoff=0.05, max_backoff=1.0)
    call(make_consul(make_transport(http, clock, retry=retry)))
    assert len(mocked.calls) == 3
    assert clock.sleeps == [0.05, 0.1]


@pytest.mark.parametrize(
    ("name", "call", "method", "path", "body", "idem"), ENDPOINTS, ids=ENDPOINT_IDS
)
def test_5xx_is_retried_only_for_idempotent_calls(
    http: RecordingSession,
    clock: FakeClock,
    mocked: responses.RequestsMock,
    name: str,
    call: EndpointCall,
    method: str,
    path: str,
    body: Any,
    idem: bool,
) -> None:
    mocked.add(method, ADDRESS + path, status=500, body="No cluster leader")
    mocked.add(method, ADDRESS + path, json=body)
    retry = RetryPolicy(deadline=10.0, first_backoff=0.05, max_backoff=1.0)
    consul = make_consul(make_transport(http, clock, retry=retry))
    if idem:
        call(consul)
        assert len(mocked.calls) == 2
        assert clock.sleeps == [0.05]
    else:
        with pytest.raises(ConsulServerError) as caught:
            call(consul)
        assert caught.value.status == 500
        assert len(mocked.calls) == 1
        assert clock.sleeps == []


@pytest.mark.parametrize(
    ("name", "call", "method", "path", "body", "idem"), ENDPOINTS, ids=ENDPOINT_IDS
)
def test_read_timeout_is_retried_only_for_idempotent_calls(
    http: RecordingSession,
    clock: FakeClock,
    mocked: responses.RequestsMock,
    name: str,
    call: EndpointCall,
    method: str,
    path: str,
    body: Any,
    idem: bool,
) -> None:
    mocked.add(method, ADDRESS + path, body=requests.exceptions.ReadTimeout("read timed out"))
    mocked.add(method, ADDRESS + path, json=body)
    consul = make_consul(make_transport(http, clock, retry=RetryPolicy(deadline=10.0)))
    if idem:
        call(consul)
        assert len(mocked.calls) == 2
    else:
        with pytest.raises(ConsulUnavailable, match="no answer within the client timeout"):
            call(consul)
        assert len(mocked.calls) == 1


def test_persistent_5xx_gives_up_at_the_deadline_with_capped_exponential_backoff(
    http: RecordingSession, clock: FakeClock, mocked: responses.RequestsMock
) -> None:
    mocked.add("GET", ADDRESS + "/v1/status/leader", status=503, body="busy")
    retry = RetryPolicy(deadline=2.0, first_backoff=0.1, max_backoff=0.4)
    transport = make_transport(http, clock, retry=retry)
    started = clock()
    with pytest.raises(ConsulServerError) as caught:
        make_consul(transport).status.leader()
    assert caught.value.status == 503
    # 0.1, 0.2, 0.4 (cap), 0.4, 0.4, 0.4 = 1.9 s; one more 0.4 would pass the 2.0 s deadline.
    assert clock.sleeps == pytest.approx([0.1, 0.2, 0.4, 0.4, 0.4, 0.4])
    assert len(mocked.calls) == 7
    assert clock() - started <= retry.deadline


def test_jitter_only_shortens_pauses(
    http: RecordingSession,
    clock: FakeClock,
    mocked: responses.RequestsMock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[float, float]] = []

    def lowest(low: float, high: float) -> float:
        seen.append((low, high))
        return low

    monkeypatch.setattr(random, "uniform", lowest)
    mocked.add("GET", ADDRESS + "/v1/status/leader", status=500, body="x")
    mocked.add("GET", ADDRESS + "/v1/status/leader", json="a")
    transport = make_transport(http, clock, retry=RetryPolicy(deadline=5.0, first_backoff=0.2))
    make_consul(transport).status.leader()
    assert seen == [(0.5, 1.0)]
    assert clock.sleeps == [0.1]


def test_refused_connection_gives_up_after_the_deadline(
    http: RecordingSession, clock: FakeClock
) -> None:
    """Against a really closed port: each attempt fails fast, the fake clock bounds the total."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    retry = RetryPolicy(deadline=1.0, first_backoff=0.05, max_backoff=1.0)
    transport = make_transport(http, clock, retry=retry, address=f"http://127.0.0.1:{port}")
    with pytest.raises(ConsulUnavailable, match="cannot connect") as caught:
        make_consul(transport).session.create(name="n", ttl=15, lock_delay=1)
    assert caught.value.exit_code == EXIT_UNAVAILABLE
    assert clock.sleeps == pytest.approx([0.05, 0.1, 0.2, 0.4])
    assert len(http.sent) == 5


def test_no_retry_policy_means_one_attempt(http: RecordingSession, clock: FakeClock) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    transport = make_transport(http, clock, retry=NO_RETRY, address=f"http://127.0.0.1:{port}")
    with pytest.raises(ConsulUnavailable):
        make_consul(transport).status.leader()
    assert len(http.sent) == 1
    assert clock.sleeps == []


def test_a_per_call_retry_policy_overrides_the_transports(
    http: RecordingSession, clock: FakeClock, mocked: responses.RequestsMock
) -> None:
    mocked.add("GET", ADDRESS + "/v1/status/leader", status=500, body="x")
    transport = make_transport(http, clock, retry=RetryPolicy(deadline=60.0))
    with pytest.raises(ConsulServerError):
        make_consul(transport).status.leader(retry=NO_RETRY)
    assert len(mocked.calls) == 1


def test_4xx_is_never_retried(
    http: RecordingSession, clock: FakeClock, mocked: responses.RequestsMock
) -> None:
    mocked.add("GET", ADDRESS + "/v1/agent/self", status=403, body="Permission denied")
    transport = make_transport(http, clock, retry=RetryPolicy(deadline=60.0))
    with pytest.raises(PermissionDenied):
        make_consul(transport).agent.self()
    assert len(mocked.calls) == 1
    assert clock.sleeps == []


# --- status and low-level error mapping -----------------------------------------------------


@pytest.mark.parametrize(
    ("status", "error_class", "exit_code"),
    [
        (301, ConsulHTTPError, EXIT_CONSUL_API),
        (400, ConsulHTTPError, EXIT_CONSUL_API),
        (401, ConsulHTTPError, EXIT_CONSUL_API),
        (403, PermissionDenied, EXIT_DENIED),
        (404, NotFound, EXIT_CONSUL_API),
        (409, ConsulHTTPError, EXIT_CONSUL_API),
        (429, ConsulHTTPError, EXIT_CONSUL_API),
        (500, ConsulServerError, EXIT_CONSUL_API),
        (502, ConsulServerError, EXIT_CONSUL_API),
        (503, ConsulServerError, EXIT_CONSUL_API),
        (504, ConsulServerError, EXIT_CONSUL_API),
    ],
)
def test_status_maps_to_one_exception_class_and_exit_code(
    http: RecordingSession,
    clock: FakeClock,
    mocked: responses.RequestsMock,
    status: int,
    error_class: type[ConsulHTTPError],
    exit_code: int,
) -> None:
    mocked.add(
        "GET",
        ADDRESS + "/v1/acl/token/self",
        status=status,
        body="nope",
        headers={"Location": "http://elsewhere:8500/"},
    )
    with pytest.raises(ConsulHTTPError) as caught:
        make_consul(make_transport(http, clock)).acl.read_self_token()
    error = caught.value
    assert type(error) is error_class
    assert isinstance(error, ConsulError)
    assert error.status == status
    assert error.exit_code == exit_code
    assert error.body == "nope"
    assert str(error) == f"consul: GET /v1/acl/token/self on {ADDRESS}: {status} nope"
    assert len(mocked.calls) == 1  # a redirect is not followed


def test_unavailable_exit_code_and_hierarchy() -> None:
    assert ConsulUnavailable.exit_code == EXIT_UNAVAILABLE == 3
    assert PermissionDenied.exit_code == EXIT_DENIED == 4
    assert ConsulError.exit_code == EXIT_CONSUL_API == 5
    assert issubclass(ConsulServerError, ConsulHTTPError)
    assert not issubclass(ConsulUnavailable, ConsulHTTPError)


LOW_LEVEL_ERRORS: list[requests.exceptions.RequestException] = [
    requests.exceptions.ConnectionError("reset"),
    requests.exceptions.ConnectTimeout("connect timed out"),
    requests.exceptions.ReadTimeout("read timed out"),
    requests.exceptions.Timeout("timed out"),
    requests.exceptions.SSLError("bad certificate"),
    requests.exceptions.ProxyError("proxy"),
    requests.exceptions.ChunkedEncodingError("chunked"),
    requests.exceptions.ContentDecodingError("gzip"),
    requests.exceptions.TooManyRedirects("loop"),
    requests.exceptions.InvalidHeader("bad header"),
    requests.exceptions.RetryError("retries"),
    requests.exceptions.RequestException("anything"),
]


@pytest.mark.parametrize("low", LOW_LEVEL_ERRORS, ids=lambda e: type(e).__name__)
def test_every_low_level_error_becomes_consul_unavailable_without_its_text(
    http: RecordingSession,
    clock: FakeClock,
    mocked: responses.RequestsMock,
    low: requests.exceptions.RequestException,
) -> None:
    mocked.add("PUT", ADDRESS + "/v1/session/create", body=low)
    with pytest.raises(ConsulUnavailable) as caught:
        make_consul(make_transport(http, clock)).session.create(name="n", ttl=15, lock_delay=1)
    message = str(caught.value)
    assert message.startswith(f"consul: PUT /v1/session/create on {ADDRESS}: ")
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__
    assert caught.value.exit_code == EXIT_UNAVAILABLE


# --- error bodies ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"rpc error making call: Permission denied", "rpc error making call: Permission denied"),
        (
            b"<html>\n  <body>Bad\tGateway</body>\n</html>\n",
            "<html> <body>Bad Gateway</body> </html>",
        ),
        (b'{"error": "invalid session"}', '{"error": "invalid session"}'),
        (b"", ""),
        (b"\xff\xfe broken \x80 bytes", None),
    ],
)
def test_non_json_error_bodies_become_one_line_excerpts(
    http: RecordingSession,
    clock: FakeClock,
    mocked: responses.RequestsMock,
    body: bytes,
    expected: str | None,
) -> None:
    mocked.add("PUT", ADDRESS + "/v1/kv/k", status=500, body=body, content_type="text/plain")
    with pytest.raises(ConsulServerError) as caught:
        make_consul(make_transport(http, clock)).kv.put("k", b"v", acquire=SESSION_ID)
    message = str(caught.value)
    assert "\n" not in message
    if expected is not None:
        assert caught.value.body == expected
        assert message == f"consul: PUT /v1/kv/k on {ADDRESS}: 500 {expected}".rstrip()
    else:
        assert "broken" in caught.value.body


def test_long_error_body_is_truncated(
    http: RecordingSession, clock: FakeClock, mocked: responses.RequestsMock
) -> None:
    mocked.add("GET", ADDRESS + "/v1/status/leader", status=500, body="x" * 5000)
    with pytest.raises(ConsulServerError) as caught:
        make_consul(make_transport(http, clock)).status.leader()
    body = caught.value.body
    assert len(body) <= answers.BODY_EXCERPT_CHARS and body.startswith("x" * 150)
    assert body.endswith(f"...(+{5000 - body.index('.')} chars)")
    assert len(str(caught.value)) < 300


def test_non_json_success_body_is_returned_as_text(
    http: RecordingSession, clock: FakeClock, mocked: responses.RequestsMock
) -> None:
    mocked.add("GET", ADDRESS + "/v1/status/leader", body="127.0.0.1:8300 (not json)")
    assert make_consul(make_transport(http, clock)).status.leader() == "127.0.0.1:8300 (not json)"


# --- the token never leaks ------------------------------------------------------------------


def all_text(error: BaseException, records: list[logging.LogRecord]) -> str:
    parts = [str(error), repr(error), repr(error.args), format(error)]
    if isinstance(error, ConsulHTTPError):
        parts += [error.body, repr(dict(error.headers))]
    for record in records:
        parts += [record.getMessage(), repr(record.args), str(record.exc_info)]
    return "\n".join(parts)


@pytest.mark.parametrize("status", [400, 403, 404, 500, 503])
def test_token_echoed_in_an_error_body_is_masked_everywhere(
    http: RecordingSession,
    clock: FakeClock,
    mocked: responses.RequestsMock,
    caplog: pytest.LogCaptureFixture,
    status: int,
) -> None:
    echo_token_everywhere(mocked, status)
    consul = make_consul(make_transport(http, clock, retry=RetryPolicy(deadline=1.0)))
    caplog.set_level(logging.DEBUG)
    for call in (
        lambda: consul.status.leader(),  # idempotent: retried, so retry log lines are made
        lambda: consul.kv.put("k", b"v"),
        lambda: consul.agent.self(token=Secret(OTHER)),
        lambda: consul.session.create(name="n", ttl=15, lock_delay=1, token=Secret(OTHER)),
    ):
        with pytest.raises(ConsulHTTPError) as caught:
            call()
        text = all_text(caught.value, caplog.records)
        assert TOKEN not in text
        assert OTHER not in text
        assert MASK in caught.value.body
    assert any("retrying" in r.getMessage() for r in caplog.records) == (status >= 500)


def test_secret_in_a_request_body_is_masked_when_echoed(
    http: RecordingSession,
    clock: FakeClock,
    mocked: responses.RequestsMock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """set_agent_token sends a secret in its body; an error quoting it must not leak it."""
    caplog.set_level(logging.DEBUG)
    mocked.add(
        "PUT",
        ADDRESS + "/v1/agent/token/agent",
        status=400,
        body=f'Request decode failed: bad token "{OTHER}"',
    )
    consul = make_consul(make_transport(http, clock))
    with pytest.raises(ConsulHTTPError) as caught:
        consul.agent.set_agent_token(Secret(OTHER))
    assert OTHER not in all_text(caught.value, caplog.records)
    assert json_token(mocked) == OTHER  # it was sent, though


def json_token(mocked: responses.RequestsMock) -> str:
    import json

    body = mocked.calls[0].request.body
    assert body is not None
    return str(json.loads(body)["Token"])


@pytest.mark.parametrize("low", LOW_LEVEL_ERRORS, ids=lambda e: type(e).__name__)
def test_token_never_appears_in_connection_errors_or_logs(
    http: RecordingSession,
    clock: FakeClock,
    mocked: responses.RequestsMock,
    caplog: pytest.LogCaptureFixture,
    low: requests.exceptions.RequestException,
) -> None:
    caplog.set_level(logging.DEBUG)
    leaky = type(low)(f"failed with header X-Consul-Token: {TOKEN}")
    mocked.add("GET", ADDRESS + "/v1/status/leader", body=leaky)
    mocked.add("GET", ADDRESS + "/v1/status/leader", body=leaky)
    transport = make_transport(http, clock, retry=RetryPolicy(deadline=0.06, first_backoff=0.05))
    with pytest.raises(ConsulUnavailable) as caught:
        make_consul(transport).status.leader()
    assert TOKEN not in all_text(caught.value, caplog.records)


def test_token_with_a_newline_does_not_leak_through_requests_header_check(
    http: RecordingSession, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    transport = make_transport(http, clock, token=f"{TOKEN}\nX-Evil: 1")
    with pytest.raises(ConsulUnavailable) as caught:
        make_consul(transport).status.leader()
    assert TOKEN not in all_text(caught.value, caplog.records)


def test_a_token_read_answer_keeps_its_secret_masked(
    http: RecordingSession, clock: FakeClock, mocked: responses.RequestsMock
) -> None:
    mocked.add("GET", ADDRESS + "/v1/acl/token/a-1", json=TOKEN_BODY)
    token = make_consul(make_transport(http, clock)).acl.read_token("a-1")
    assert token.secret is not None
    assert token.secret.reveal() == OTHER
    assert OTHER not in repr(token)
    assert OTHER not in str(token)


# --- a real HTTP server: true timeouts and resets -------------------------------------------


class Misbehaving(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.hits = 0
        self.release = threading.Event()
        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: Misbehaving

    def handle(self) -> None:
        self.raw_requestline = self.rfile.readline(65537)
        if not self.parse_request():
            return
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.server.hits += 1
        if self.server.mode == "reset":
            # SO_LINGER 0: close() sends RST, as a crashed or cut-off agent would.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            return
        self.server.release.wait(10)
        try:
            self.send_response(200)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"true")
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def misbehaving(request: pytest.FixtureRequest) -> Iterator[Misbehaving]:
    server = Misbehaving(request.param)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


def real_transport(server: Misbehaving, retry: RetryPolicy, timeout: float = 0.3) -> Transport:
    settings = ConsulSettings(address=server.address, token=Secret(TOKEN), timeout=timeout)
    return Transport(settings, HTTPPool(requests.Session()), retry=retry)


@pytest.mark.parametrize("misbehaving", ["slow"], indirect=True)
def test_a_hung_agent_is_given_up_on_at_the_client_timeout(misbehaving: Misbehaving) -> None:
    transport = real_transport(misbehaving, NO_RETRY, timeout=0.3)
    started = time.monotonic()
    with transport.session, pytest.raises(ConsulUnavailable, match="client timeout") as caught:
        make_consul(transport).session.renew(SESSION_ID)
    elapsed = time.monotonic() - started
    assert 0.25 <= elapsed < 2.0
    assert TOKEN not in str(caught.value)
    assert misbehaving.hits == 1


@pytest.mark.parametrize("misbehaving", ["slow"], indirect=True)
def test_read_timeout_not_retried_for_acquire_and_a_hung_renew_ends_within_its_timeout(
    misbehaving: Misbehaving,
) -> None:
    retry = RetryPolicy(deadline=0.5, first_backoff=0.01, max_backoff=0.01)
    transport = real_transport(misbehaving, retry, timeout=0.15)
    with transport.session:
        with pytest.raises(ConsulUnavailable):
            make_consul(transport).kv.put("k", b"v", acquire=SESSION_ID)
        assert misbehaving.hits == 1
        started = time.monotonic()
        with pytest.raises(ConsulUnavailable):
            make_consul(transport).session.renew(SESSION_ID)
        elapsed = time.monotonic() - started
    # The timeout bounds the call, retries included: the retry deadline (0.5 s) does not add
    # to it. The slack (0.3 s) is for a loaded machine; a retry would take the call past 0.5 s.
    assert elapsed < 0.15 + 0.3


@pytest.mark.parametrize("misbehaving", ["reset"], indirect=True)
def test_connection_reset_retried_only_for_idempotent_calls(misbehaving: Misbehaving) -> None:
    retry = RetryPolicy(deadline=0.3, first_backoff=0.02, max_backoff=0.05)
    transport = real_transport(misbehaving, retry)
    with transport.session:
        with pytest.raises(ConsulUnavailable, match="connection failed") as caught:
            make_consul(transport).acl.create_policy("p", 'key "k" { policy = "read" }')
        assert misbehaving.hits == 1  # the request was sent: a retry could fail as a duplicate
        assert caught.value.exit_code == EXIT_UNAVAILABLE
        with pytest.raises(ConsulUnavailable):
            make_consul(transport).session.info(SESSION_ID)
    assert misbehaving.hits >= 3


# --- models ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"Checks": ["serfHealth", "svc"]}, ("serfHealth", "svc")),  # before Consul 1.7
        ({"NodeChecks": ["serfHealth"], "ServiceChecks": None}, ("serfHealth",)),  # 1.7+
        ({"NodeChecks": [], "ServiceChecks": [{"ID": "web", "Namespace": ""}]}, ("web",)),
        ({"NodeChecks": None, "ServiceChecks": None}, ()),
        ({}, ()),
    ],
)
def test_session_checks_from_old_and_new_answers(
    raw: dict[str, Any], expected: tuple[str, ...]
) -> None:
    assert Session.from_api({"ID": SESSION_ID, **raw}).checks == expected


def test_a_call_whose_time_ran_out_before_it_was_sent_is_unavailable_not_a_crash(
    http: RecordingSession, clock: FakeClock
) -> None:
    """A deadline passed between two calls (a loaded machine): urllib3 refuses a total timeout
    of 0 with a ValueError, which once killed a scheduler's job loop; now it is Consul's silence."""
    transport = make_transport(http, clock)
    with pytest.raises(ConsulUnavailable, match="no answer within the client timeout"):
        make_consul(transport).session.renew("5e43f102", timeout=0.0, retry=NO_RETRY)
    assert http.sent == []


def test_max_in_flight_makes_calls_wait_their_turn_but_never_a_watch(
    mocked: responses.RequestsMock,
) -> None:
    """At most N calls at once; a blocking query holds its connection for minutes, so it does
    not take a turn (renewals would queue behind the watches of long runs)."""
    inside, peak, guard = [0], [0], threading.Lock()

    def slow(request: Any) -> tuple[int, dict[str, str], str]:
        with guard:
            inside[0] += 1
            peak[0] = max(peak[0], inside[0])
        time.sleep(0.05)
        with guard:
            inside[0] -= 1
        return 200, {}, '"127.0.0.1:8300"'

    mocked.add_callback("GET", ADDRESS + "/v1/status/leader", callback=slow)
    settings = ConsulSettings(address=ADDRESS, token=None, timeout=TIMEOUT)
    consul = Consul(settings, retry=NO_RETRY, max_in_flight=3)
    threads = [threading.Thread(target=consul.status.leader) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert peak[0] == 3
    gate = consul.transport.pool.gate
    assert gate is not None
    for _ in range(3):
        assert gate.enter(1.0)  # every turn taken: a watch still goes out at once
    try:
        mocked.add("GET", ADDRESS + "/v1/kv/k", json=[], headers={"X-Consul-Index": "7"})
        consul.transport.request(
            Call("GET", "/v1/kv/k", params={"index": 5, "wait": "1s"}), Sending(timeout=2)
        )
        with pytest.raises(ConsulUnavailable, match="no answer within the client timeout"):
            consul.transport.request(Call("GET", "/v1/status/leader"), Sending(timeout=0.2))
    finally:
        for _ in range(3):
            gate.leave()


def test_an_urgent_call_takes_the_next_turn_before_the_calls_that_waited_longer() -> None:
    """A claim (or a renewal) that arrives behind a queue of completions and reads goes first:
    with 300 jobs at one tick, the claims start their jobs while the rest waits."""
    gate = CallGate(1)
    assert gate.enter(1.0)  # the one turn, held
    order: list[str] = []

    def wait_turn(name: str, urgent: bool) -> None:
        assert gate.enter(10.0, urgent=urgent)
        order.append(name)
        gate.leave()

    others = [threading.Thread(target=wait_turn, args=(f"other-{n}", False)) for n in range(3)]
    for thread in others:
        thread.start()
    time.sleep(0.1)  # they wait
    urgent = threading.Thread(target=wait_turn, args=("claim", True))
    urgent.start()
    time.sleep(0.1)
    gate.leave()
    for thread in [*others, urgent]:
        thread.join(10)
    assert order[0] == "claim", order
    assert sorted(order[1:]) == ["other-0", "other-1", "other-2"]


def test_no_turn_within_the_timeout_is_a_refusal_and_frees_nothing() -> None:
    gate = CallGate(1)
    assert gate.enter(1.0)
    assert not gate.enter(0.05) and not gate.enter(0.05, urgent=True)
    gate.leave()
    assert gate.enter(0.05)  # the turn came back, once
