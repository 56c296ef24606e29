"""Consul's catalog, for a worker without a local agent: lockctl registers the worker as a
node (no agent, no serfHealth check) so its sessions have a node to live on, and deregisters it
on a clean stop. One small method per endpoint, as consul/api.py.

Measured on 1.8.7: both calls need `node "<name>" { policy = "write" }` and nothing more (a
registration with a service needs service write too: lockctl registers none); deregistering a
node invalidates every session on it.
"""

from __future__ import annotations

from typing import Any

from provision.consul.transport import IDEMPOTENT, Call, Transport, quote_path


class CatalogAPI:
    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    def register_node(self, node: str, address: str) -> None:
        """Register (or re-register) `node` at `address`, without services or checks.
        PUT /v1/catalog/register"""
        body = {"Node": node, "Address": address}
        # Idempotent: the same node at the same address again changes nothing.
        self._transport.request(Call("PUT", "/v1/catalog/register", json_body=body), IDEMPOTENT)

    def deregister_node(self, node: str) -> None:
        """Remove `node` from the catalog (and so end every session on it).
        PUT /v1/catalog/deregister"""
        body = {"Node": node}
        self._transport.request(Call("PUT", "/v1/catalog/deregister", json_body=body), IDEMPOTENT)

    def node(self, node: str) -> dict[str, Any] | None:
        """The node's catalog entry (Node, Address, ...), or None when it is not registered.
        GET /v1/catalog/node/:node"""
        path = "/v1/catalog/node/" + quote_path(node)
        answer = self._transport.request(Call("GET", path), IDEMPOTENT)
        return dict(answer.body["Node"]) if answer.body else None

    def datacenters(self) -> list[str]:
        """The datacenters this agent's servers know over the WAN, its own among them.
        GET /v1/catalog/datacenters"""
        answer = self._transport.request(Call("GET", "/v1/catalog/datacenters"), IDEMPOTENT)
        return [str(name) for name in answer.body or ()]
