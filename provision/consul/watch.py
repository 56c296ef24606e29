"""A blocking read of every key under a prefix: how one `lockctl schedule` hears of the
operators' triggers for all of its jobs with one query, whatever the number of jobs.

Consul filters a recursive read by the token's ACLs (key read), so a worker sees only its own
jobs' keys, and the answer's index is the prefix's as a whole: a change under another job's
folder wakes the query too, with nothing new to see (rare: an operator's action).
"""

from __future__ import annotations

from provision.consul.answers import ConsulResponse
from provision.consul.errors import NotFound
from provision.consul.keys import checked_key
from provision.consul.models import KVEntry
from provision.consul.transport import Call, Sending, Transport, quote_path


def watch_tree(
    transport: Transport, prefix: str, index: int, wait: float, *, max_bytes: int
) -> tuple[list[KVEntry], int]:
    """The keys under `prefix` (this token may read), once the prefix's index passes `index`
    (index 0: at once), or as they are when `wait` seconds pass; and the index to wait on next.
    An answer over `max_bytes` raises AnswerTooLarge. GET /v1/kv/:prefix?recurse&index=&wait="""
    params: dict[str, str | int] = {"recurse": ""}
    timeout = None
    if index > 0:
        params.update(index=index, wait=f"{wait:.0f}s")
        # Consul adds up to wait/16 of jitter; the client timeout must outlast both
        timeout = transport.settings.timeout + wait * 17 / 16
    path = "/v1/kv/" + quote_path(checked_key(prefix))
    try:
        answer: ConsulResponse = transport.request(
            Call("GET", path, params=params, max_bytes=max_bytes),
            Sending(idempotent=True, timeout=timeout),
        )
    except NotFound as missing:  # nothing under it (that this token may see)
        return [], _next_index(ConsulResponse(404, None, missing.headers).index, index)
    entries = [KVEntry.from_api(raw) for raw in answer.body or ()]
    return entries, _next_index(answer.index, index)


def _next_index(seen: int | None, before: int) -> int:
    """Consul's advice: an index that went backwards (a snapshot restore) starts over at 1, and
    one that is missing or 0 must not make the next query return at once forever."""
    if seen is None or seen <= 0:
        return max(before, 1)
    return 1 if seen < before else seen
