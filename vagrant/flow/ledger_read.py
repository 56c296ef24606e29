"""Read a job's tick ledger from the VMs' cluster, for the flow's tick check.

    python vagrant/flow/ledger_read.py ADDRESS TOKEN_FILE LOCK_KEY OUT.json
    python vagrant/flow/ledger_read.py --sessions ADDRESS TOKEN_FILE OUT.json [SESSION_ID...]

Runs as its own process inside the run's network namespace (`ip netns exec`), like
vagrant/cluster-ready: one read of the ledger (`Ledger.records`, through lockctl's own Consul
client, the token read from its 0600 file, the CA and lockctl's client certificate from
CONSUL_CACERT, CONSUL_CLIENT_CERT and CONSUL_CLIENT_KEY), every record written to OUT.json as the
tick check reads it. With --sessions: which of the sessions named Consul still knows, as a JSON
list (the scheduler check: every session a stopped scheduler made is gone). Exit 0 written, 1
Consul did not answer or refused, or a TLS file the environment names is missing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from provision.consul import Consul, GivenSettings, resolve_settings
from provision.errors import LockctlError
from provision.ledger.records import TickRecord, tick_name, timestamp
from provision.ledger.store import Ledger

CALL_TIMEOUT = 10.0


def record_fields(record: TickRecord) -> dict[str, Any]:
    """One record as the tick check reads it (times as text; the fields every record has)."""
    return {
        "tick": tick_name(record.tick),
        "outcome": record.outcome.value,
        "worker": record.worker,
        "lock_index": record.lock_index,
        "start_lag": record.start_lag,
        "claimed_at": None if record.claimed_at is None else timestamp(record.claimed_at),
        "finished_at": None if record.finished_at is None else timestamp(record.finished_at),
        "exit_status": record.exit_status,
        "duration": record.duration,
    }


def consul_at(address: str, token_file: str) -> Consul:
    given = GivenSettings(address=address, token_file=Path(token_file), timeout=CALL_TIMEOUT)
    settings = resolve_settings(given)
    return Consul(settings)


def sessions_left(argv: list[str]) -> int:
    address, token_file, out, *ids = argv
    try:  # consistent: a destroy the scheduler saw answered is seen here too
        left = [
            i
            for i in ids
            if consul_at(address, token_file).session.info(i, consistency="consistent")
        ]
    except LockctlError as exc:  # Consul's answer, or a TLS file missing
        print(f"ledger-read: {exc}", file=sys.stderr)
        return 1
    Path(out).write_text(json.dumps(left) + "\n", "utf-8")
    print(f"ledger-read: {len(left)} of {len(ids)} sessions still in Consul")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--sessions"] and len(argv) >= 4:
        return sessions_left(argv[1:])
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    address, token_file, lock_key, out = argv
    try:
        records = Ledger(consul_at(address, token_file), lock_key).records()
    except LockctlError as exc:  # Consul's answer, or a TLS file missing
        print(f"ledger-read: {exc}", file=sys.stderr)
        return 1
    Path(out).write_text(json.dumps([record_fields(r) for r in records], indent=2) + "\n", "utf-8")
    print(f"ledger-read: {len(records)} records of {lock_key}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
