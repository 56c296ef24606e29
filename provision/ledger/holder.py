"""Who holds a lock key, as its value and Consul's session info tell, made safe to print: the
`skipped` event's fields, and what `lockctl break` and `status` show of the holder's record.
Light on imports (no HTTP client): `lockctl run`'s cheap skip of a held lock
(runner/precheck.py) says it before the client is loaded."""

from __future__ import annotations

import json
from dataclasses import dataclass

from provision.system.text import printable

CLAIM_LIMIT = 64  # characters of one field of a holder's record: a name, a host, a time
# what a plain lock writes (tick/plain.py); a tick's claim adds its tick (tick/core.py)
RECORD_FIELDS = ("worker", "job", "host", "pid", "acquired_at", "tick")


@dataclass(frozen=True)
class Holder:
    """Who holds a lock key: `session` and `node` are Consul's word (None: unknown), `claimed`
    is the worker the holder's record names (anyone with write on the key writes that)."""

    session: str | None
    node: str | None
    claimed: str | None
    in_lock_delay: bool = False

    @property
    def forged(self) -> bool:
        """The record names another worker than the node Consul says the session is on."""
        return self.node is not None and self.claimed is not None and self.claimed != self.node

    @property
    def reason(self) -> str:
        if self.in_lock_delay:
            return "in lock-delay: the previous holder's session ended without a release"
        claimed = None if self.claimed is None else printable(self.claimed, CLAIM_LIMIT)
        if self.node is not None:
            node = printable(self.node, CLAIM_LIMIT)
            forged = f"; its record claims worker {claimed}: forged?" if self.forged else ""
            return f"held by node {node} (Consul's session info){forged}"
        if claimed is not None:
            return f"held by another session; its record claims worker {claimed} (unverified)"
        return "held by another session"

    def event_fields(self) -> dict[str, str | bool | None]:
        """The skipped event's fields: every string bounded and free of control characters."""
        return {
            "reason": self.reason,
            "holder": None if self.session is None else printable(self.session, CLAIM_LIMIT),
            "holder_node": None if self.node is None else printable(self.node, CLAIM_LIMIT),
            "holder_claims": None if self.claimed is None else printable(self.claimed, CLAIM_LIMIT),
            "forged": True if self.forged else None,
        }


def holder_record(value: bytes | None) -> dict[str, str]:
    """The record a holder wrote into the key (worker, job, host, pid, acquired_at, tick), or {}.

    Only those fields, each a string or a number as lockctl writes them, printable and at most
    CLAIM_LIMIT characters: the value is anyone's to write (up to Consul's 512 KB, nested as
    deep as they like).
    """
    record = _decoded(value)
    return {
        name: printable(str(record[name]), CLAIM_LIMIT)
        for name in RECORD_FIELDS
        if isinstance(record.get(name), str | int)
    }


def _decoded(value: bytes | None) -> dict[str, object]:
    try:
        record = json.loads(value or b"{}")
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested too deep
        return {}
    return record if isinstance(record, dict) else {}


def claimed_worker(value: bytes | None) -> str | None:
    """The worker a holder's record names, raw (compared with the node before it is shown)."""
    worker = _decoded(value).get("worker")
    return worker if isinstance(worker, str) else None
