"""What the pieces of a scheduled run cost lockctl itself, the old code beside the new.

Each piece the scheduler runs for a tick of a job (no Consul, no job: the adapter is stubbed),
timed in microseconds (the best of 5 repeats): the command's check, the TLS key's lines, an
event, a tick's name and record, the claim order, an answer's Date, a call's preparation by the
HTTP session, one run's notes told to the scheduler's report (its events and metrics), a
batch's choice of queued claims. The old code is the baseline revision's `provision/` (default:
where this branch left main), extracted with `git archive` into a temporary folder; the two are
run alternately, --rounds times each, in child processes.

    .venv/bin/python bench/run_costs.py [--baseline REV] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PIECES = r"""
import json, os, tempfile, timeit
from datetime import datetime, timezone
from pathlib import Path
import requests
from provision.outcomes import Outcome
from provision.consul.answers import answer_date
from provision.consul.batch import TxnBatcher, _Call
from provision.consul.transport import _session_for
from provision.consul.txn import KVOp
from provision.ledger.records import TickRecord, tick_name
from provision.ledger.turns import claim_order
from provision.runner.child import check_program
from provision.runner.events import EventLog
from provision.runner.output import runner_secrets
from provision.scheduler.report import CoreReport
from provision.tick.edge import Note

key = Path(tempfile.mkdtemp()) / "client.key"
key.write_text("-----BEGIN EC PRIVATE KEY-----\n" + "A" * 64 + "\n-----END EC PRIVATE KEY-----\n")
tick = datetime(2026, 12, 5, 1, 0, tzinfo=timezone.utc)
log = EventLog("job-001", "worker-1", open(os.devnull, "w"))
record = TickRecord(tick, Outcome.SUCCEEDED, worker="worker-1", session="s" * 36, host="h",
                    pid=1, claimed_at=tick, start_lag=0.1, lock_index=4, finished_at=tick,
                    exit_status=0, duration=0.01, stdout="x" * 40)

class Stub(requests.adapters.HTTPAdapter):
    def send(self, request, **kwargs):
        answer = requests.Response()
        answer.status_code, answer._content, answer.request = 200, b"{}", request
        return answer

session = _session_for("https://127.0.0.1:8501")
session.mount("https://", Stub())

def call():
    session.request("PUT", "https://127.0.0.1:8501/v1/txn", json=[{"KV": {"Verb": "get"}}],
                    headers={"X-Consul-Token": "t" * 36}, timeout=10, verify="/ca.pem",
                    cert=("/c", "/k"), allow_redirects=False, stream=False)

def take():  # 100 claims queued at once, taken in batches
    batcher = TxnBatcher(lambda ops, urgent: None)
    for i in range(100):
        ops = [KVOp("check-not-exists", f"j{i}/ticks/t"), KVOp("set", f"j{i}/ticks/t", b"v"),
               KVOp("lock", f"j{i}/.lock", b"", "s")]
        batcher._others.append(_Call(ops, False))
    while batcher._others:
        batcher._take()

report = CoreReport("worker-1", open(os.devnull, "w"))
claimed = TickRecord(tick, Outcome.RUNNING, worker="worker-1", session="s" * 36,
                     claimed_at=tick, start_lag=0.1, lock_index=4)

def count():  # the core's notes of one run: due, claimed, completed
    report(Note("due", "job-001", tick)); report(Note("claimed", "job-001", tick, record=claimed))
    report(Note("completed", "job-001", tick, record=record))

pieces = {
    "the command's check (twice a run before)": lambda: check_program(["/bin/sh"], os.environ),
    "the TLS key's lines": lambda: runner_secrets("t" * 36, {}, key),
    "an event": lambda: log.emit("acquired", session="s", lock_index=4, tick="T", waited_ms=1.2),
    "a tick's name": lambda: tick_name(tick),
    "a tick's record encoded": record.encode,
    "the claim order of 3 workers": lambda: claim_order("job-001", tick, ["w1", "w2", "w3"]),
    "an answer's Date": lambda: answer_date({"Date": "Sat, 05 Dec 2026 01:28:01 GMT"}),
    "a call through the HTTP session, to the adapter": call,
    "one run's notes to the report": count,
    "a batch's choice, per queued claim": take,
}
found = {}
for name, piece in pieces.items():
    n, per = (20, 100) if piece is take else (2000, 1)
    found[name] = min(timeit.repeat(piece, number=n, repeat=5)) / n / per * 1e6
print(json.dumps(found))
"""


def timed(tree: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", PIECES], cwd=tree, env=env, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise SystemExit(f"the pieces failed in {tree}: {out.stderr.strip().splitlines()[-1]}")
    result: dict[str, float] = json.loads(out.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="main", help="the old code's revision")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    base = (
        subprocess.run(
            ["git", "merge-base", "HEAD", args.baseline], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        or args.baseline
    )
    with tempfile.TemporaryDirectory(prefix="lockctl-bench-run-costs-") as tmp:
        old = Path(tmp)
        archive = subprocess.run(["git", "archive", base], cwd=ROOT, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
        rounds = [(timed(old), timed(ROOT)) for _ in range(args.rounds)]
    print(f"{'piece (us; best of 5 repeats, of --rounds)':52} {base[:7]:>8} {'now':>8}")
    for name in rounds[0][0]:
        before = min(r[0].get(name, float("nan")) for r in rounds)
        after = min(r[1].get(name, float("nan")) for r in rounds)
        print(f"{name:52} {before:8.1f} {after:8.1f}")


if __name__ == "__main__":
    main()
