"""The client's pool and request count, options of `Consul` itself (apply sizes the pool for its
concurrency and reports "N requests" without reaching into the transport)."""

from __future__ import annotations

import threading

import pytest
import responses

from provision.consul import (
    NO_RETRY,
    AgentClock,
    Consul,
    ConsulServerError,
    ConsulSettings,
    RetryPolicy,
)
from provision.system.secrets import Secret

ADDRESS = "http://consul.test:8500"
LEADER = f"{ADDRESS}/v1/status/leader"


def _adapter_maxsize(consul: Consul) -> int:
    adapter = consul.transport.session.get_adapter(ADDRESS)
    return int(adapter._pool_maxsize)  # type: ignore[attr-defined]


def test_pool_size_sizes_the_connection_pool() -> None:
    assert _adapter_maxsize(Consul(ConsulSettings(address=ADDRESS), pool_size=48)) == 48
    assert _adapter_maxsize(Consul(ConsulSettings(address=ADDRESS))) == 10  # requests' default


@responses.activate
def test_requests_sent_counts_every_request_retries_included() -> None:
    responses.get(LEADER, status=500, body="No cluster leader")
    responses.get(LEADER, json="127.0.0.1:8300")
    consul = Consul(ConsulSettings(address=ADDRESS), retry=RetryPolicy(first_backoff=0.0))
    assert consul.requests_sent == 0
    assert consul.status.leader() == "127.0.0.1:8300"
    assert consul.requests_sent == 2


@responses.activate
def test_clients_sharing_a_pool_share_its_count() -> None:
    responses.get(LEADER, json="127.0.0.1:8300")
    consul = Consul(ConsulSettings(address=ADDRESS))
    other_token = consul.with_settings(token=Secret("22222222-3333-4444-5555-666666666666"))
    no_retry = consul.with_retry(NO_RETRY)
    for client in (consul, other_token, no_retry):
        client.status.leader()
    assert consul.requests_sent == other_token.requests_sent == 3
    assert other_token.transport.session is consul.transport.session
    assert (no_retry.retry, consul.retry) == (NO_RETRY, RetryPolicy())


def test_derived_clients_share_one_pool_its_gate_and_agent_clock() -> None:
    consul = Consul(ConsulSettings(address=ADDRESS), max_in_flight=2, agent_clock=AgentClock())
    pool = consul.transport.pool
    assert pool.gate is not None and pool.agent_clock is not None
    other_token = consul.with_settings(token=Secret("22222222-3333-4444-5555-666666666666"))
    for derived in (other_token, consul.with_retry(NO_RETRY)):
        assert derived.transport.pool is pool
    resized = consul.with_pool(4).transport.pool
    assert resized.session is not pool.session and resized.count is not pool.count
    assert resized.agent_clock is pool.agent_clock


@responses.activate
def test_with_pool_is_a_new_pool_with_its_own_count() -> None:
    responses.get(LEADER, json="127.0.0.1:8300")
    consul = Consul(ConsulSettings(address=ADDRESS), retry=NO_RETRY)
    consul.status.leader()
    pooled = consul.with_pool(32)
    assert (pooled.settings, pooled.retry, pooled.requests_sent) == (consul.settings, NO_RETRY, 0)
    assert _adapter_maxsize(pooled) == 32
    pooled.status.leader()
    assert (consul.requests_sent, pooled.requests_sent) == (1, 1)


@responses.activate
def test_the_count_is_exact_across_threads() -> None:
    responses.get(LEADER, json="127.0.0.1:8300")
    consul = Consul(ConsulSettings(address=ADDRESS), pool_size=8)

    def calls() -> None:
        for _ in range(25):
            consul.status.leader()

    threads = [threading.Thread(target=calls) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert consul.requests_sent == 200


@responses.activate
def test_a_failed_request_is_counted() -> None:
    responses.get(LEADER, status=500, body="No cluster leader")
    consul = Consul(ConsulSettings(address=ADDRESS), retry=NO_RETRY)
    with pytest.raises(ConsulServerError):
        consul.status.leader()
    assert consul.requests_sent == 1
