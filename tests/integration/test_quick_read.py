"""provision/consul/quick.py against the real cluster: the standard-library read of one key
agrees with the full client, and whatever it cannot read plainly is None (take the full path)."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import TYPE_CHECKING

from provision.consul.quick import quick_get

if TYPE_CHECKING:
    from conftest import LiveCluster


def test_a_key_reads_as_the_full_client_reads_it(live_cluster: LiveCluster) -> None:
    consul = live_cluster.management("worker-1")
    key = f"test/quick-{uuid.uuid4().hex[:8]}/ticks/2026-12-01T02:00:00Z"
    value = b'{"format":1,"outcome":"succeeded"}\x00\xff'
    try:
        assert consul.kv.put(key, value)
        full, _ = consul.kv.get(key)
        quick = quick_get(consul.settings, key)
        assert full is not None and quick is not None
        assert (quick.exists, quick.value, quick.modify_index) == (True, value, full.modify_index)
        assert quick.date is not None and quick.date.tzinfo is not None  # the agent's clock
        absent = quick_get(consul.settings, key + "-absent")
        assert absent is not None and (absent.exists, absent.value) == (False, None)
    finally:
        consul.kv.delete(key)


def test_what_it_cannot_read_plainly_is_none(live_cluster: LiveCluster) -> None:
    settings = live_cluster.client("worker-1").settings  # the cluster's TLS files, if any
    address = settings.address
    key = "test/quick/anything"
    anonymous = replace(settings, token=None)  # default deny: 403
    assert quick_get(anonymous, key) is None
    host = address.rsplit(":", 1)[0]
    refused = replace(settings, address=f"{host}:1")  # nothing listens there
    assert quick_get(refused, key) is None
    scheme, rest = address.split("://", 1)
    other = "http" if scheme == "https" else "https"  # HTTP to the TLS port, or TLS to HTTP
    assert quick_get(replace(settings, address=f"{other}://{rest}"), key) is None
