"""What reading a job's ledger costs, the old code beside the new, measured in the same run.

1. `lockctl history`, `check` and `status` over a ledger of N records of S bytes each (default 100
   of 500 KB: what anyone who may write the job's prefix can store) on a local TLS cluster of
   its own: each command's peak RSS (wait4 of its own child) and wall seconds.
2. The missed-tick walk (ledger/ticks.py `missed_ticks`) for a per-minute job in Europe/Berlin
   with history_limit 10,000 and every other minute recorded: CPU seconds (no Consul).

The old code is the baseline revision's `provision/` (default: where this branch left main),
extracted with `git archive` into a temporary folder and run from there; the new one is this
checkout's.

    .venv/bin/python bench/ledger_reads.py [--records 100] [--value-bytes 500000]
        [--baseline REV] [--subnet 127.0.9]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from provision.cluster import tls
from provision.cluster.layout import ClusterLayout
from provision.cluster.local import ClusterShape, cluster_down, cluster_up
from provision.consul import Consul
from provision.ledger.records import tick_key
from provision.system.secrets import read_secret_file

ROOT = Path(__file__).resolve().parent.parent
JOB = "bench-reads"
PREFIX = "bench/reads/"
WALK = """
import sys, time
from datetime import datetime, timedelta, timezone
from provision.ledger.ticks import missed_ticks
from provision.schedule import parse_schedule
schedule = parse_schedule("* * * * *", "Europe/Berlin")
now = datetime(2026, 12, 2, 12, 0, 30, tzinfo=timezone.utc)
latest = schedule.latest_tick_at_or_before(now)
recorded = {latest - timedelta(minutes=2 * i) for i in range(5000)}
began = time.process_time()
found = missed_ticks(schedule, recorded, now, 300, limit=10000)
print(f"{time.process_time() - began:.4f} {len(found)}")
"""


@dataclass(frozen=True)
class Measured:
    seconds: float
    rss_mb: float
    code: int
    out: str


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100)
    parser.add_argument("--value-bytes", type=int, default=500_000)
    parser.add_argument("--baseline", default=None, help="the old code's revision")
    parser.add_argument("--subnet", default="127.0.9")
    args = parser.parse_args()
    baseline = args.baseline or _git("merge-base", "HEAD", "main")
    with tempfile.TemporaryDirectory(prefix="lockctl-bench-reads-") as tmp:
        old = Path(tmp) / "old"
        old.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", baseline, "provision"],
            capture_output=True,
            check=True,
        )
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
        head = _git("rev-parse", "HEAD")[:12]
        print(f"old: {baseline[:12]} (git archive)   new: this checkout ({head})")
        walk_table(old)
        state = Path(tmp) / "cluster"
        try:
            up = cluster_up(state, ClusterShape(subnet=args.subnet, workers=1))
            readers_table(up.status.layout, Path(tmp), old, args.records, args.value_bytes)
        finally:
            cluster_down(state)


def walk_table(old: Path) -> None:
    print("\nmissed-tick walk: '* * * * *' in Europe/Berlin, 5,000 of the last 10,000 minutes")
    print("recorded, limit 10,000 (history's history_limit)")
    print(f"  {'':6}{'CPU s':>10}{'ticks named':>13}")
    for name, where in (("old", old), ("new", ROOT)):
        done = subprocess.run(
            [sys.executable, "-c", WALK], cwd=where, capture_output=True, text=True, check=True
        )
        seconds, named = done.stdout.split()
        print(f"  {name:6}{float(seconds):>10.3f}{int(named):>13}")


def readers_table(layout: ClusterLayout, tmp: Path, old: Path, records: int, size: int) -> None:
    spec = tmp / "locks.hcl"
    worker = next(agent.http_address for agent in layout.agents if agent.name == "worker-1")
    spec.write_text(
        f'worker "worker-1" {{\n  address = "{worker}"\n}}\n'
        f'job "{JOB}" {{\n  prefix   = "{PREFIX}"\n  workers  = ["worker-1"]\n'
        '  schedule = "@daily"\n}\n'
    )
    token = read_secret_file(layout.management_token_file)
    address = next(agent.http_address for agent in layout.agents if agent.name == "server-1")
    management = Consul(tls.consul_settings(layout, address=address, token=token))
    _write_ledger(management, records, size)
    flags = ["--spec", str(spec), "--address", management.address]
    flags += ["--token-file", str(layout.management_token_file)]
    named = {"CONSUL_CACERT": "--ca-cert", "CONSUL_CLIENT_CERT": "--client-cert"}
    for name, value in tls.tls_exports(layout):
        flags += [named.get(name, "--client-key"), value]
    print(f"\nreaders over a ledger of {records} records of {size:,} bytes (median of 3 runs)")
    print(f"  {'command':28}{'old s':>8}{'new s':>8}{'old RSS MB':>12}{'new RSS MB':>12}")
    for command in (["history", "--job", JOB], ["check", "--job", JOB], ["status"]):
        before, after = _medians(old, ROOT, command + flags)
        for measured in (before, after):
            if measured.code not in (0, 1):  # check says WARNING (1) of the large records
                print(f"  ({command[0]} exited {measured.code}: {measured.out[-300:]})")
        shown = " ".join(command[:1] + (["--job J"] if len(command) > 1 else []))
        print(
            f"  {shown:28}{before.seconds:>8.2f}{after.seconds:>8.2f}"
            f"{before.rss_mb:>12.0f}{after.rss_mb:>12.0f}"
            f"   (exit {before.code} / {after.code})"
        )


def _write_ledger(consul: Consul, records: int, size: int) -> None:
    """One real-looking record today, then `records` of `size` bytes a worker's token could
    write: half JSON that says succeeded, half not JSON."""
    today = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    lock = f"{PREFIX}.lock"
    good = {"format": 1, "outcome": "succeeded", "worker": "worker-1", "exit_status": 0}
    consul.kv.put(tick_key(lock, today), json.dumps(good).encode())
    pad = "A" * size
    for days in range(1, records + 1):
        fields = {**good, "pad": pad}
        value = json.dumps(fields).encode() if days % 2 else pad.encode()
        consul.kv.put(tick_key(lock, today - timedelta(days=days)), value[:size])


def _medians(old: Path, new: Path, args: list[str], runs: int = 3) -> tuple[Measured, Measured]:
    """Each code's median of `runs` runs by seconds, old and new taking turns (Consul's own
    garbage collection after a large answer slows whichever reader comes next)."""
    both: tuple[list[Measured], list[Measured]] = ([], [])
    for _ in range(runs):
        both[0].append(_measure(old, args))
        both[1].append(_measure(new, args))
    medians = [sorted(runs_of, key=lambda m: m.seconds)[runs // 2] for runs_of in both]
    return medians[0], medians[1]


def _measure(where: Path, args: list[str]) -> Measured:
    """`python -m provision ARGS` from `where` (its provision/ first on the path)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CONSUL_")}
    with tempfile.TemporaryFile("w+") as out:
        began = time.monotonic()
        child = subprocess.Popen(
            [sys.executable, "-m", "provision", *args],
            cwd=where,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=environ,
        )
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.monotonic() - began
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read()
    return Measured(seconds, usage.ru_maxrss / 1024, child.returncode, text)


def _git(*args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


if __name__ == "__main__":
    main()
