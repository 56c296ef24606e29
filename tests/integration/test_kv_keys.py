"""KV keys that the way to Consul would change, against the real cluster.

urllib3 drops a '.' segment from the URL path (after decoding '%2e' to '.'), and Consul answers
'//' (and a decoded '%2F') with a redirect to the merged path. A lock acquired in a transaction
(the key in the JSON body, exact) would then be released by URL path on another key, and stay
held. The client refuses such a key before it sends anything, for every KV call.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from provision.errors import EXIT_INPUT, InputError

if TYPE_CHECKING:
    from conftest import LiveCluster


def _calls(session_id: str) -> dict[str, Callable[[Any, str], object]]:
    return {
        "get": lambda c, k: c.kv.get(k),
        "put": lambda c, k: c.kv.put(k, b"v"),
        "acquire": lambda c, k: c.kv.put(k, b"v", acquire=session_id),
        "release": lambda c, k: c.kv.put(k, release=session_id),
        "acquire_and_read": lambda c, k: c.txn.acquire_and_read(k, b"v", session_id),
        "delete": lambda c, k: c.kv.delete(k, recurse=True),
    }


@pytest.mark.parametrize("shape", ["{}/./a/.lock", "{}//a/.lock", "{}/../a", "{}/a/./"])
def test_a_key_that_http_would_change_is_refused_before_any_request(
    live_cluster: LiveCluster, shape: str
) -> None:
    client = live_cluster.management("worker-1")
    base = f"locks/kv-keys-{uuid.uuid4().hex[:8]}"
    session_id = client.session.create(name="kv-keys", ttl=15, lock_delay=0)
    try:
        key = shape.format(base)
        for name, call in _calls(session_id).items():
            before = client.requests_sent
            with pytest.raises(InputError, match=r"segment would change on the way") as caught:
                call(client, key)
            assert caught.value.exit_code == EXIT_INPUT, name
            assert client.requests_sent == before, f"{name} sent a request for {key}"
        assert client.kv.get(base + "/a/.lock")[0] is None  # nothing was written anywhere
    finally:
        client.session.destroy(session_id)
        client.kv.delete(base + "/", recurse=True)


@pytest.mark.parametrize("segment", ["a.b", "%2e", "%2F"])  # '%' is quoted: Consul sees it
def test_other_keys_are_the_same_key_both_ways(live_cluster: LiveCluster, segment: str) -> None:
    client = live_cluster.management("worker-1")
    base = f"locks/kv-keys-{uuid.uuid4().hex[:8]}"
    key = f"{base}/{segment}/.lock"
    session_id = client.session.create(name="kv-keys", ttl=15, lock_delay=0)
    try:
        entry = client.txn.acquire_and_read(key, b"holder", session_id)
        assert entry is not None and entry.session == session_id
        assert client.kv.put(key, release=session_id) is True
        after, _ = client.kv.get(key, consistency="consistent")
        assert after is not None and after.session is None  # released on the very key taken
        assert after.key == key
    finally:
        client.session.destroy(session_id)
        client.kv.delete(base + "/", recurse=True)
