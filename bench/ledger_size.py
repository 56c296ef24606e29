"""The tick ledger's size: keys per job, bytes per record, and what a fleet's ledgers weigh.

Encodes real records (provision.ledger.records.TickRecord: running, succeeded, missed) and the
lock key's holder value the way the runner writes them, then works out, for 100, 1,000 and
10,000 jobs, the ledger's keys and bytes at a retention (`history_limit`, default today's
built-in one) against Consul's limits: ~1 GB of state in all (HashiCorp's guidance; the
servers keep every key in memory and write it all into each snapshot), 512 KB per value, 64
operations per transaction. No Consul needed.

    .venv/bin/python bench/ledger_size.py [--history-limit N] [--prefix-length 24]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from datetime import datetime, timedelta, timezone

from provision.ledger.records import TickRecord, tick_key
from provision.ledger.ticks import PRUNE_SLACK
from provision.outcomes import Outcome
from provision.spec.names import lock_key
from provision.timings import COUNT_BOUNDS, COUNT_DEFAULTS

GB = 1_000_000_000
CONSUL_GUIDANCE = 1 * GB  # total KV data one cluster should hold
VALUE_CAP = 512 * 1024  # Consul's limit per value
TXN_OPS = 64  # Consul's limit per transaction
# Consul's own cost per key beyond key and value (memdb entry, its index nodes, the raft log
# and snapshot framing): an estimate, not measured here; the table shows it separately.
PER_KEY_OVERHEAD = 200
FLEETS = (100, 1_000, 10_000)
WORKER = "worker-01"
HOST = "worker-01.prod.example.internal"  # a realistic FQDN: hosts are the longest field
SESSION = "2c1e5f44-3a1b-4c7e-9d9f-0b3b1f6e7a21"  # a Consul session ID is a UUID


def _record(**fields: object) -> TickRecord:
    """A TickRecord with the fields this version of it has (others are left out)."""
    known = {f.name for f in dataclasses.fields(TickRecord)}
    return TickRecord(**{k: v for k, v in fields.items() if k in known})  # type: ignore[arg-type]


def sample_records() -> dict[str, TickRecord]:
    tick = datetime(2026, 12, 1, 2, 0, tzinfo=timezone.utc)
    claimed = tick + timedelta(seconds=0.263)
    running = _record(
        tick=tick,
        outcome=Outcome.RUNNING,
        worker=WORKER,
        session=SESSION,
        host=HOST,
        pid=4_194_303,  # the largest PID Linux hands out
        claimed_at=claimed,
        start_lag=0.263,
        planned_start=17.25,
        lock_index=123_456,
    )
    succeeded = dataclasses.replace(
        running,
        outcome=Outcome.SUCCEEDED,
        finished_at=claimed + timedelta(seconds=2.01),
        exit_status=0,
        duration=2.011,
    )
    missed = _record(
        tick=tick, outcome=Outcome.MISSED, worker=WORKER, host=HOST, finished_at=claimed
    )
    # the most attempts a run may make (retries = 10), each a 3-digit status
    retried = dataclasses.replace(
        succeeded, outcome=Outcome.FAILED, exit_status=255, attempts=(255,) * 11
    )
    return {"running": running, "succeeded": succeeded, "missed": missed, "retried": retried}


def holder_value() -> bytes:
    """What the lock key holds while a tick runs (tick/plain.py / tick_lock's holder record)."""
    fields = {
        "acquired_at": "2026-12-01T02:00:00+00:00",
        "worker": WORKER,
        "job": "x" * 16,
        "host": HOST,
        "pid": 4_194_303,
        "tick": "2026-12-01T02:00:00Z",
    }
    return json.dumps(fields, separators=(",", ":")).encode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history-limit", type=int, default=COUNT_DEFAULTS["history_limit"])
    parser.add_argument(
        "--prefix-length", type=int, default=24, help="characters of a job's lock prefix"
    )
    args = parser.parse_args()
    prefix = ("locks/" + "j" * max(1, args.prefix_length - 7))[: args.prefix_length - 1] + "/"
    lock = lock_key(prefix)
    records = sample_records()
    key = tick_key(lock, records["running"].tick)
    print(f"a job's keys: {lock} (the lock) and {prefix}ticks/<tick> (one per recorded tick)")
    print(f"tick key: {len(key)} bytes ({key})")
    print(f"lock key: {len(lock)} bytes, its value while held: {len(holder_value())} bytes\n")
    print(f"{'record':12}{'value bytes':>12}{'key + value':>13}")
    for name, record in records.items():
        size = len(record.encode())
        print(f"{name:12}{size:>12}{size + len(key):>13}")
    largest = max(len(r.encode()) for r in records.values())
    common = len(records["succeeded"].encode())  # the fleet's ledgers: every record succeeded
    print(
        f"(a value's cap is {VALUE_CAP} bytes: the largest record uses {largest / VALUE_CAP:.3%})"
    )
    print()
    for limit in sorted({args.history_limit, 50, 100, 200, 1000, COUNT_BOUNDS["history_limit"][1]}):
        fleet_table(limit, len(key), len(lock), common)
    print(
        f"\nretention deletes in transactions of at most {TXN_OPS} operations (lockctl: 60), once "
        f"a job's records exceed history_limit by {PRUNE_SLACK:.0%}: no write per tick for it"
    )


def fleet_table(limit: int, key_bytes: int, lock_bytes: int, record_bytes: int) -> None:
    """Keys and bytes of N jobs' ledgers at history_limit `limit` (all records `succeeded`, the
    common kind; a retried run's is 56 bytes more), and the pruning slack full: the most a
    ledger holds between two prunes."""
    kept = limit + max(1, int(limit * PRUNE_SLACK))
    per_job_data = kept * (key_bytes + record_bytes) + lock_bytes + len(holder_value())
    per_job_total = per_job_data + (kept + 1) * PER_KEY_OVERHEAD
    print(f"history_limit = {limit}: at most {kept} records per job (+1 lock key)")
    print(f"  {'jobs':>7}{'keys':>13}{'key+value MB':>14}{'with overhead MB':>18}{'of 1 GB':>9}")
    for jobs in FLEETS:
        keys = jobs * (kept + 1)
        data, total = jobs * per_job_data, jobs * per_job_total
        print(
            f"  {jobs:>7}{keys:>13,}{data / 1e6:>14.1f}{total / 1e6:>18.1f}"
            f"{total / CONSUL_GUIDANCE:>9.1%}"
        )


if __name__ == "__main__":
    main()
