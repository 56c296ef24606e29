"""The ledger's readers on the real cluster: `lockctl history`, `status`'s tick columns and
`lockctl check`'s exit codes, over ledgers written with the Ledger API itself (claims and
completions with real sessions through a worker's own token and agent, missed records), and
hostile records printed safely.

The jobs are daily, their tick T 12 hours before the module starts (a cron `M H * * *`, UTC,
claim window 5 min): whenever it runs, T's window has long closed and the next tick is 12 hours
away (`@daily` was not: from 00:00 to 00:05 UTC today's tick was not missed yet, and a module
run across midnight met a new tick). Every record is for T or the days before it, but the
suspect ones (dated in the future) a test writes itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import tempfile
import time
import unicodedata
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from workers_lab import minted_workers

from provision.consul import Consul, ConsulError
from provision.ledger.records import TickOutcome, TickRecord, tick_key, tick_name
from provision.ledger.store import Ledger
from provision.ledger.ticks import to_prune
from provision.schedule import parse_schedule
from provision.system.secrets import Secret, write_secret_file
from provision.workers.config import load_worker_config
from tests.lockctl_process import LOCKCTL, run_lockctl

if TYPE_CHECKING:
    from conftest import LiveCluster


WORKERS = ("worker-1", "worker-2")
JOBS = (
    "ok",
    "failing",
    "stopped",
    "abandoned",
    "running",
    "hostile",
    "fresh",
    "readonly",
    "future",
    "big",
)
FUTURE_LIMIT = 10  # the `future` job's history_limit (the least the spec takes)
FUTURE_REAL = 11  # its real records: the limit plus its slack, so retention deletes none
FAR = datetime(2099, 1, 1, tzinfo=timezone.utc)
E2E = "e2e"  # run by real `lockctl run` ticks of an @every 3s schedule
EVERY = 3
OUTPUT_BOUND = 20_000
HUGE = "\x1b[2J" + "A" * 400_000  # under Consul's 512 KB value limit
BIG_RECORDS = 60  # the `big` job's records of BIG_VALUE bytes each
BIG_VALUE = 500_000
# Peak RSS a reader may add over that ledger to what it takes over one record (about 50 MB of
# Python, requests and rich); reading its 30 MB whole, as they did, added over 100 MB.
READER_MARGIN_MB = 40


@dataclass
class Lab:
    spec_path: Path
    jobs: dict[str, str]  # short -> job name
    keys: dict[str, str]  # short -> lock key
    worker_1: Consul  # worker-1's own token, through worker-1's agent
    worker_token: Path
    read_token: Path  # read on the whole test prefix, nothing else
    management_token: Path
    secrets: tuple[str, ...] = field(repr=False)  # pytest prints a failing test's arguments
    cluster: LiveCluster
    tick: datetime  # T: the jobs' latest tick, 12 h before the lab was made
    sessions: list[str]
    configs: dict[str, Path]  # worker -> its lockctl.json
    uid: str


def _spec_text(cluster: LiveCluster, uid: str, tick: datetime) -> str:
    lines = ["defaults {", '  ttl = "10s"', '  lock_delay = "4s"', '  renew_interval = "1s"']
    lines += ['  kill_grace = "1s"', "}"]
    daily = f"{tick.minute} {tick.hour} * * *"
    for worker in WORKERS:
        lines += [f'worker "{worker}" {{', f'  address = "{cluster.address(worker)}"', "}"]
    for short in JOBS:
        lines += [f'job "{short}-{uid}" {{', f'  prefix   = "test/ledger-{uid}/{short}/"']
        lines += ['  workers  = ["worker-1", "worker-2"]', f'  schedule = "{daily}"']
        if short == "future":
            lines.append(f"  history_limit = {FUTURE_LIMIT}")
        lines.append("}")
    lines += [f'job "{E2E}-{uid}" {{', f'  prefix   = "test/ledger-{uid}/{E2E}/"']
    lines += ['  workers  = ["worker-1", "worker-2"]', f'  schedule = "@every {EVERY}s"', "}"]
    lines += [f'job "plain-{uid}" {{', f'  prefix  = "test/ledger-{uid}/plain/"']
    lines += ['  workers = ["worker-1"]', "}"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("ledger")
    uid = uuid.uuid4().hex[:8]
    tick = twelve_hours_ago()
    spec_path = tmp / "locks.hcl"
    spec_path.write_text(_spec_text(live_cluster, uid, tick))
    kv = f"test/ledger-{uid}/"
    management = live_cluster.management()
    with minted_workers(live_cluster, spec_path, WORKERS, tmp, uid, kv) as made:
        policy = management.acl.create_policy(
            f"read-{uid}", f'key_prefix "{kv}" {{ policy = "read" }}'
        )
        token = management.acl.create_token(f"read {uid}", [policy.name])
        assert token.secret is not None
        made.secrets.append(token.secret.reveal())
        write_secret_file(tmp / "read.token", token.secret)
        worker_token = tmp / "secrets" / "worker-1.token"
        secret = Secret(worker_token.read_text().strip())
        lab = Lab(
            spec_path=spec_path,
            jobs={short: f"{short}-{uid}" for short in JOBS},
            keys={short: f"{kv}{short}/.lock" for short in JOBS},
            worker_1=live_cluster.client("worker-1", secret),
            worker_token=worker_token,
            read_token=tmp / "read.token",
            management_token=live_cluster.layout.management_token_file,
            secrets=tuple(made.secrets),
            cluster=live_cluster,
            tick=tick,
            sessions=[],
            configs=made.configs,
            uid=uid,
        )
        try:
            _write_ledgers(lab)
            yield lab
        finally:
            for session in lab.sessions:
                with contextlib.suppress(ConsulError):
                    lab.worker_1.session.destroy(session)
            with contextlib.suppress(ConsulError):
                management.acl.delete_token(token.accessor_id)
                management.acl.delete_policy(policy.id)


def twelve_hours_ago() -> datetime:
    """T: the whole minute 12 hours ago, the tick of the daily cron `_spec_text` writes."""
    now = datetime.now(timezone.utc).replace(second=0, microsecond=0)
    tick = now - timedelta(hours=12)
    daily = parse_schedule(f"{tick.minute} {tick.hour} * * *")
    assert daily.next_ticks(tick - timedelta(seconds=1), 2) == [tick, tick + timedelta(days=1)]
    return tick


# --- writing ledgers with the Ledger API ---------------------------------------------------------


def _run(
    lab: Lab, short: str, days_ago: int, outcome: TickOutcome | None, exit_status: int = 0
) -> str:
    """Claim the tick `days_ago` before T with a real session, as worker-1, and complete it
    with `outcome` (None: leave it running, the session holding the lock). The session."""
    ledger = Ledger(lab.worker_1, lab.keys[short])
    tick = lab.tick - timedelta(days=days_ago)
    session = lab.worker_1.session.create(name="ledger test", ttl=60, lock_delay=0)
    lab.sessions.append(session)
    record = TickRecord(
        tick,
        TickOutcome.RUNNING,
        worker="worker-1",
        session=session,
        host="host-1",
        pid=4242,
        claimed_at=tick + timedelta(seconds=0.25),
        start_lag=0.25,
    )
    holder = json.dumps({"worker": "worker-1", "tick": tick_name(tick)}).encode()
    claim = ledger.claim(record, holder, session)
    assert claim.won, claim
    if outcome is not None:
        done = replace(record, lock_index=claim.lock_index, modify_index=claim.record_index)
        done = done.completed(
            outcome,
            finished_at=tick + timedelta(seconds=2.5),
            exit_status=exit_status,
            duration=2.25,
        )
        assert ledger.complete(done, session, release=True).recorded
    return session


def _write_ledgers(lab: Lab) -> None:
    _run(lab, "ok", 1, TickOutcome.SUCCEEDED)
    _run(lab, "ok", 0, TickOutcome.SUCCEEDED)
    _run(lab, "failing", 1, TickOutcome.SUCCEEDED)
    _run(lab, "failing", 0, TickOutcome.FAILED, exit_status=3)
    _run(lab, "stopped", 3, TickOutcome.SUCCEEDED)  # then all runners stopped: 3 ticks missed
    _run(lab, "readonly", 3, TickOutcome.SUCCEEDED)
    _run(lab, "abandoned", 1, TickOutcome.SUCCEEDED)
    dead = _run(lab, "abandoned", 0, None)
    lab.worker_1.session.destroy(
        dead
    )  # the runner died: the lock is released, the record says running
    _run(lab, "running", 1, TickOutcome.SUCCEEDED)
    _run(lab, "running", 0, None)  # still held by its session
    for days in range(FUTURE_REAL):
        _run(lab, "future", days, TickOutcome.SUCCEEDED)
    _write_hostile(lab)


def _write_hostile(lab: Lab) -> None:
    key = lambda days: tick_key(lab.keys["hostile"], lab.tick - timedelta(days=days))  # noqa: E731
    forged = {
        "format": 1,
        "tick": "x",
        "outcome": "failed",
        "exit_status": 1,
        "worker": "w\x1b]0;pwned\x07[bold red]X[/]\r\u202e|evil"
        + "A" * 2000,  # under the 4 KB cap, over the field bound
        "host": "\x9b31m" * 100,
        "lock_index": "NaN",
        "duration": 1e300,
    }
    # times past the largest datetime once in UTC (astimezone raised OverflowError in every reader)
    poisoned = {"format": 1, "outcome": "succeeded", "worker": "w"}
    poisoned |= {"claimed_at": "9999-12-31T23:59:59-01:00", "finished_at": "9999-12-31T23:59:59Z"}
    lab.worker_1.kv.put(key(4), json.dumps(poisoned).encode())
    lab.worker_1.kv.put(key(3), b"\xff\xfe not json \x1b[2J")
    lab.worker_1.kv.put(key(2), HUGE.encode())
    lab.worker_1.kv.put(key(1), json.dumps({"format": 1, "outcome": "succeeded"}).encode())
    lab.worker_1.kv.put(key(0), json.dumps(forged).encode())


# --- running lockctl ---------------------------------------------------------------------------


LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")  # Debian's faketime
FOREIGN = ("CONSUL_", "FORCE_COLOR")  # the caller's: a test sets its own connection and colour


def _environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN)}


def _connection(lab: Lab, token: Path | None = None, address: str | None = None) -> list[str]:
    connection = ["--address", address or lab.cluster.address("server-1")]
    connection += ["--token-file", str(token or lab.management_token)]
    return connection + lab.cluster.tls_flags()


def lockctl(
    lab: Lab,
    *args: str,
    token: Path | None = None,
    address: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    connection = _connection(lab, token, address)
    spec = ("--spec", str(lab.spec_path))
    result = run_lockctl(*args, *spec, *connection, env=env, drop=FOREIGN)
    for secret in lab.secrets:
        assert secret not in result.stdout and secret not in result.stderr
    assert _raw_controls(result.stdout + result.stderr) == []
    assert len(result.stdout) < OUTPUT_BOUND and "Traceback" not in result.stderr, result.stderr
    return result


def _raw_controls(text: str) -> list[str]:
    unsafe = {"Cc", "Cf", "Cs", "Zl", "Zp"}
    return [c for c in text if c != "\n" and unicodedata.category(c) in unsafe]


def _history_json(lab: Lab, short: str, *flags: str) -> list[dict[str, Any]]:
    result = lockctl(lab, "history", "--job", lab.jobs[short], "--json", *flags)
    assert result.returncode == 0, result.stderr
    (job,) = json.loads(result.stdout)
    assert job["job"] == lab.jobs[short] and job["next_tick"] == tick_name(
        lab.tick + timedelta(days=1)
    )
    return list(job["ticks"])


def _days(lab: Lab, days: int) -> str:
    return tick_name(lab.tick - timedelta(days=days))


# --- history -----------------------------------------------------------------------------------


def test_history_json_shows_each_run_as_recorded(lab: Lab) -> None:
    ticks = _history_json(lab, "failing")
    assert [(t["tick"], t["outcome"]) for t in ticks] == [
        (_days(lab, 0), "failed"),
        (_days(lab, 1), "succeeded"),
    ]
    failed = ticks[0]
    assert failed["worker"] == "worker-1" and failed["exit_status"] == 3
    assert failed["lock_index"] >= 1 and failed["duration"] == 2.25 and failed["start_lag"] == 0.25
    assert failed["recorded"] is True


def test_history_shows_ticks_nobody_ran_as_missed_not_recorded_yet(lab: Lab) -> None:
    ticks = _history_json(lab, "readonly")
    assert [(t["tick"], t["outcome"], t["recorded"]) for t in ticks] == [
        (_days(lab, 0), "missed", False),
        (_days(lab, 1), "missed", False),
        (_days(lab, 2), "missed", False),
        (_days(lab, 3), "succeeded", True),
    ]
    table = lockctl(lab, "history", "--job", lab.jobs["readonly"]).stdout
    assert table.count("missed (not recorded yet)") == 3, table


def test_history_since_filters_and_refuses_garbage_at_the_flag(lab: Lab) -> None:
    assert [t["tick"] for t in _history_json(lab, "readonly", "--since", "48h")] == [
        _days(lab, 0),
        _days(lab, 1),
    ]
    # "48h" is back from Consul's clock, not this host's: one 13 h ahead (libfaketime) shows
    # the same two ticks (from its own clock the window would begin after the older one)
    ahead = {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": "+13h"}
    ahead["FAKETIME_DONT_FAKE_MONOTONIC"] = "1"
    skewed = lockctl(
        lab, "history", "--job", lab.jobs["readonly"], "--json", "--since", "48h", env=ahead
    )
    assert skewed.returncode == 0, skewed.stderr
    (job,) = json.loads(skewed.stdout)
    assert [t["tick"] for t in job["ticks"]] == [_days(lab, 0), _days(lab, 1)]
    since = _history_json(lab, "readonly", "--since", _days(lab, 2)[:10])
    assert len(since) == 3
    bad = lockctl(lab, "history", "--since", "last tuesday")
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1
    assert bad.stderr.startswith("lockctl: error: --since: 'last tuesday' is neither")


def test_a_running_record_whose_runner_died_is_abandoned(lab: Lab) -> None:
    assert _history_json(lab, "abandoned")[0]["outcome"] == "abandoned"
    assert _history_json(lab, "running")[0]["outcome"] == "running"
    table = lockctl(lab, "history", "--job", lab.jobs["abandoned"]).stdout
    assert "abandoned" in table


def test_hostile_records_print_escaped_and_bounded(lab: Lab) -> None:
    ticks = _history_json(lab, "hostile")
    outcomes = [t["outcome"] for t in ticks]
    assert outcomes == ["failed", "succeeded", "unreadable", "unreadable", "succeeded"]
    assert ticks[2]["note"] == "too large: not read" and ticks[3]["note"] is None
    shown = lockctl(lab, "history", "--job", lab.jobs["hostile"])
    key = tick_key(lab.keys["hostile"], lab.tick - timedelta(days=2))
    assert shown.stderr == (
        f"lockctl: warning: {key}: value: more than 4096 bytes, over the 4096-byte cap of a "
        "tick record: not read\n"
    )
    assert "9999" not in json.dumps(ticks[4])  # its times not believed: shown as unknown
    forged = ticks[0]
    assert forged["worker"].startswith("w\\x1b]0;pwned\\x07[bold red]X[/]\\r\\u202e|evil")
    assert (
        len(forged["worker"]) <= 64 and forged["lock_index"] is None and forged["duration"] is None
    )
    table = lockctl(lab, "history", "--job", lab.jobs["hostile"]).stdout
    assert "w\\x1b]0;pwned" in "".join(table.split()) and "unreadable" in table
    check = lockctl(lab, "check", "--job", lab.jobs["hostile"])
    assert check.returncode == 1, check.stdout  # the last run failed, by its (forged) word
    assert "|" not in check.stdout and len(check.stdout.splitlines()) == 1
    assert f", 1 record too large to read ({key}: value: more than 4096 bytes" in check.stdout


# --- bounded reads --------------------------------------------------------------------------------


def _write_big(lab: Lab) -> None:
    """T's run, then BIG_RECORDS records of BIG_VALUE bytes, as a worker's token may write
    them: half look like successes (a reader that decodes them takes them for runs)."""
    _run(lab, "big", 0, TickOutcome.SUCCEEDED)
    pad = "A" * BIG_VALUE
    for days in range(1, BIG_RECORDS + 1):
        key = tick_key(lab.keys["big"], lab.tick - timedelta(days=days))
        fields = {"format": 1, "outcome": "succeeded", "worker": "w", "pad": pad}
        value = json.dumps(fields).encode() if days % 2 else b"\x1b[2J" + pad.encode()
        lab.worker_1.kv.put(key, value[:BIG_VALUE])


def _peak_rss(lab: Lab, *args: str) -> tuple[int, subprocess.CompletedProcess[str]]:
    """`lockctl ARGS` as a child of its own, its peak RSS in MB (wait4: that child's alone,
    reaped by it, so its output goes to files rather than pipes a reaping wait drains)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(
            [*LOCKCTL, *args, "--spec", str(lab.spec_path), *_connection(lab)],
            stdout=out,
            stderr=err,
            env=_environ(),
        )
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        result = subprocess.CompletedProcess(args, child.returncode, out.read(), err.read())
    assert "Traceback" not in result.stderr, result.stderr
    return usage.ru_maxrss // 1024, result


def test_readers_read_a_bounded_number_of_records_and_bytes_whatever_is_stored(lab: Lab) -> None:
    """Before, history, status and check read every record whole (100 records of 500 KB: 260 MB
    and 4 s each), and a forged 500 KB `succeeded` was a run. Now each reads the records it needs,
    a batch at a time, up to a cap per record: one over it is a line `key: value: why`,
    counted, `unreadable`, never decoded."""
    _write_big(lab)
    job = lab.jobs["big"]
    # the same reader over one record first: what the process takes anyway (in a fresh clone,
    # its first run also compiles lockctl's modules), and READER_MARGIN_MB is all a read may add
    base, _ = _peak_rss(lab, "history", "--job", job, "--json", "--limit", "1")
    bound = base + READER_MARGIN_MB
    rss, history = _peak_rss(lab, "history", "--job", job, "--json")  # the newest 50: its limit
    assert history.returncode == 0 and rss < bound, (rss, base, history.stderr[-500:])
    (shown,) = json.loads(history.stdout)
    outcomes = [(t["outcome"], t["note"]) for t in shown["ticks"]]
    assert outcomes == [("succeeded", None)] + [("unreadable", "too large: not read")] * 49
    assert len(shown["problems"]) == 49
    warnings = history.stderr.splitlines()
    assert (
        len(warnings) == 11 and warnings[-1] == f"lockctl: warning: {job}: 39 more records not read"
    )
    first = tick_key(lab.keys["big"], lab.tick - timedelta(days=1))
    assert warnings[0] == (
        f"lockctl: warning: {first}: value: more than 4096 bytes, over the 4096-byte cap of a "
        "tick record: not read"
    )
    assert len(_history_json(lab, "big", "--limit", "3")) == 3
    rss, every = _peak_rss(lab, "history", "--job", job, "--json", "--limit", "100")
    assert len(json.loads(every.stdout)[0]["ticks"]) == BIG_RECORDS + 1 and rss < bound
    assert every.stderr.endswith(f"{job}: {BIG_RECORDS - 10} more records not read\n")

    rss, check = _peak_rss(lab, "check", "--job", job)
    assert check.returncode == 1 and rss < bound, (rss, check.stdout)
    assert re.search(r"WARNING \S+: \d+ records too large to read \(", check.stdout), check.stdout
    assert f"last success {_days(lab, 0)}" in check.stdout

    # a runner's read of one tick's record (before it claims) stops at the cap too
    record, _ = Ledger(lab.worker_1, lab.keys["big"]).read(lab.tick - timedelta(days=1))
    assert record is not None and record.outcome is TickOutcome.UNREADABLE

    rss, status = _peak_rss(lab, "status", "--json")
    assert status.returncode == 0 and rss < bound, (rss, status.stderr)
    (big,) = [s for s in json.loads(status.stdout) if s["job"] == job]
    assert big["last_tick"]["tick"] == _days(lab, 0)


# --- suspect records: dated in the future --------------------------------------------------------


def _write_suspect(lab: Lab) -> datetime:
    """Two records only a forger or a badly wrong clock writes, as a worker's token may: 2099,
    and a few minutes ahead (the jobs are daily: a name off the schedule, which no reader
    checks). Written here, not in the fixture, so `soon` is still ahead when the test reads."""
    soon = (datetime.now(timezone.utc) + timedelta(minutes=5)).replace(microsecond=0)
    forged = {"format": 1, "outcome": "succeeded", "worker": "w\x1b[2J", "exit_status": 0}
    for tick in (FAR, soon):
        lab.worker_1.kv.put(tick_key(lab.keys["future"], tick), json.dumps(forged).encode())
    return soon


def _retention(lab: Lab) -> int:
    """Retention as a housekeeping does it (tick/core.py: to_prune over the ledger's names, on
    Consul's clock), as worker-1 with its own config and token. How many records it deleted."""
    config = load_worker_config(lab.configs["worker-1"]).job(lab.jobs["future"])
    assert config.history_limit == FUTURE_LIMIT
    ledger = Ledger(lab.worker_1, config.lock_key)
    recorded, date = ledger.tick_names()
    assert date is not None  # Consul's clock, from the same answer
    return ledger.prune(to_prune(recorded, config.history_limit, now=date))


def _ledger_names(lab: Lab) -> set[str]:
    return {tick_name(tick) for tick in Ledger(lab.worker_1, lab.keys["future"]).ticks()}


def test_suspect_records_are_kept_by_retention_and_never_taken_for_a_run(lab: Lab) -> None:
    """Before, retention kept the newest history_limit names, so the two forged records pushed
    out the 3 oldest real ones, and `check` said OK, last success 2099, for ever."""
    soon = _write_suspect(lab)
    before = _ledger_names(lab)  # FUTURE_REAL real ones (10 after the next test) and 2 suspect
    assert {tick_name(FAR), tick_name(soon), _days(lab, 0)} <= before
    pruned = _retention(lab)
    assert _ledger_names(lab) == before  # the real ones are within the slack
    assert pruned == 0

    ticks = _history_json(lab, "future")
    shown = [(t["tick"], t["outcome"], t["recorded_outcome"]) for t in ticks[:3]]
    assert shown == [
        (tick_name(FAR), "suspect", "succeeded"),
        (tick_name(soon), "suspect", "succeeded"),
        (_days(lab, 0), "succeeded", "succeeded"),
    ]
    table = lockctl(lab, "history", "--job", lab.jobs["future"]).stdout
    assert "".join(table.split()).count("suspect:datedinthefuture(sayssucceeded)") == 2, table
    assert "w\\x1b[2J" in table, table  # the forger's worker, escaped

    check = _check(lab, "future")
    assert check.returncode == 1, check.stdout
    expected = (
        rf"WARNING {lab.jobs['future']}: 2 suspect records, dated in the future "
        rf"\({tick_name(FAR)}, {tick_name(soon)}\), last success {_days(lab, 0)} "
        rf"\((\d+h)?(\d+m)?(\d+s)? ago\), next {tick_name(lab.tick + timedelta(days=1))}\n"
    )
    assert re.fullmatch(expected, check.stdout), check.stdout

    states = {s["job"]: s for s in json.loads(lockctl(lab, "status", "--json").stdout)}
    future = states[lab.jobs["future"]]
    assert (future["last_tick"]["tick"], future["suspect_ticks"]) == (_days(lab, 0), 2)
    status = lockctl(lab, "status").stdout  # its narrow columns wrap the rest of the note
    assert "+2 suspect (dated" in status, status


def test_retention_still_prunes_real_records_beside_suspect_ones(lab: Lab) -> None:
    """One real record more than the limit and its slack: the oldest real ones go, oldest
    first, down to history_limit; the suspect ones stay."""
    _write_suspect(lab)
    _run(lab, "future", FUTURE_REAL, TickOutcome.SUCCEEDED)  # a 12th real record, the oldest
    suspect = {name for name in _ledger_names(lab) if name > _days(lab, 0)}
    assert len(suspect) >= 2  # 2099 and one a few minutes ahead (per test that wrote one)
    pruned = _retention(lab)
    kept = {_days(lab, days) for days in range(FUTURE_LIMIT)}
    assert _ledger_names(lab) == kept | suspect
    assert pruned == 2


# --- status --------------------------------------------------------------------------------------


def test_status_adds_the_last_tick_and_the_next_one(lab: Lab) -> None:
    result = lockctl(lab, "status", "--json")
    assert result.returncode == 0, result.stderr
    states = {s["job"]: s for s in json.loads(result.stdout)}
    following = tick_name(lab.tick + timedelta(days=1))
    failing = states[lab.jobs["failing"]]
    assert failing["last_tick"] == {
        "tick": _days(lab, 0),
        "outcome": "failed",
        "worker": "worker-1",
    }
    assert failing["next_tick"] == following
    assert states[lab.jobs["running"]]["held"] is True
    assert states[lab.jobs["running"]]["last_tick"]["outcome"] == "running"
    assert states[lab.jobs["fresh"]]["last_tick"] is None
    plain = next(s for name, s in states.items() if name.startswith("plain-"))
    assert plain["last_tick"] is None and plain["next_tick"] is None
    table = lockctl(lab, "status").stdout
    assert "failed" in table and "running" in table and "none yet" in table
    assert "next tick" in table


# --- check ---------------------------------------------------------------------------------------


def _check(lab: Lab, short: str, token: Path | None = None) -> subprocess.CompletedProcess[str]:
    return lockctl(lab, "check", "--job", lab.jobs[short], token=token)


def test_check_ok_warning_and_the_fresh_job(lab: Lab) -> None:
    ok = _check(lab, "ok")
    assert ok.returncode == 0, ok.stdout
    expected = (
        rf"OK {lab.jobs['ok']}: last success {_days(lab, 0)} \((\d+h)?(\d+m)?(\d+s)? ago\), "
        rf"next {tick_name(lab.tick + timedelta(days=1))}\n"
    )
    assert re.fullmatch(expected, ok.stdout), ok.stdout
    failing = _check(lab, "failing")
    assert failing.returncode == 1 and failing.stdout.startswith(f"WARNING {lab.jobs['failing']}: ")
    assert f"last run {_days(lab, 0)} failed (exit 3, on worker-1)" in failing.stdout
    abandoned = _check(lab, "abandoned")
    assert abandoned.returncode == 1 and "abandoned" in abandoned.stdout
    assert _check(lab, "running").returncode == 0
    fresh = _check(lab, "fresh")
    assert fresh.returncode == 0 and "no ticks recorded yet" in fresh.stdout


def test_check_with_a_read_only_token_reports_missed_ticks_without_recording(lab: Lab) -> None:
    result = _check(lab, "readonly", token=lab.read_token)
    assert result.returncode == 2, result.stdout
    assert f"missed {_days(lab, 0)} (not recorded yet)" in result.stdout
    assert "this token may not write the ledger" in result.stdout
    assert all(not t["recorded"] for t in _history_json(lab, "readonly")[:3])


def test_check_records_missed_ticks_once_and_exits_critical(lab: Lab) -> None:
    first = _check(lab, "stopped", token=lab.worker_token)
    assert first.returncode == 2, first.stdout
    assert first.stdout.startswith(f"CRITICAL {lab.jobs['stopped']}: missed {_days(lab, 0)}, ")
    assert "(3 missed tick(s) recorded now)" in first.stdout
    ticks = _history_json(lab, "stopped")
    assert [(t["outcome"], t["recorded"], t["worker"]) for t in ticks[:3]] == [
        ("missed", True, "lockctl check")
    ] * 3
    indexes = _modify_indexes(lab, "stopped")
    again = _check(lab, "stopped", token=lab.worker_token)
    assert again.returncode == 2 and "recorded now" not in again.stdout
    assert _modify_indexes(lab, "stopped") == indexes  # never twice


def _modify_indexes(lab: Lab, short: str) -> dict[str, int]:
    prefix = lab.keys[short].rsplit("/", 1)[0] + "/ticks/"
    return {e.key: e.modify_index for e in lab.cluster.management().kv.tree(prefix)}


def test_check_of_every_job_exits_with_the_worst_and_summarizes_first(lab: Lab) -> None:
    result = lockctl(lab, "check")
    assert result.returncode == 2, result.stdout
    summary, *lines = result.stdout.splitlines()
    assert summary.startswith(f"CRITICAL: {len(JOBS) + 1} jobs, ")
    assert lab.jobs["stopped"] in summary and lab.jobs["failing"] in summary
    assert len(lines) == len(JOBS) + 1  # and the e2e job
    assert not any(line.startswith(("plain-", "OK plain-")) for line in lines)


def test_check_is_unknown_when_consul_is_down_or_the_token_unknown(
    lab: Lab, tmp_path: Path
) -> None:
    down = lockctl(lab, "check", address="http://127.0.0.1:9", token=lab.read_token)
    assert down.returncode == 3 and down.stdout.startswith("UNKNOWN: consul: "), down.stdout
    unknown = tmp_path / "unknown.token"
    write_secret_file(unknown, Secret(str(uuid.uuid4())))
    refused = lockctl(lab, "check", token=unknown)
    assert refused.returncode == 3 and refused.stdout.startswith("UNKNOWN: consul: ")
    assert "403" in refused.stdout and len(refused.stdout.splitlines()) == 1


# --- end to end: real `lockctl run` ticks -------------------------------------------------------


def _run_at(lab: Lab, worker: str, moment: datetime, command: str) -> None:
    time.sleep(max(0.0, moment.timestamp() + 0.1 - time.time()))
    argv = ["run", "--config", str(lab.configs[worker]), "--job", f"{E2E}-{lab.uid}"]
    done = run_lockctl(*argv, "--", "sh", "-c", command, timeout=30)
    assert '"event":"acquired"' in done.stderr, done.stderr


def test_real_runs_then_stopped_runners_show_in_history_status_and_check(lab: Lab) -> None:
    """Tick 1 succeeds on worker-1, tick 2 fails on worker-2, then nobody runs tick 3: just
    after tick 5, tick 3's window (3 s + 2 s grace) has closed and check calls it missed."""
    every = parse_schedule(f"@every {EVERY}s")
    first, second, third, _, fifth = every.next_ticks(datetime.now(timezone.utc), 5)
    _run_at(lab, "worker-1", first, "true")
    _run_at(lab, "worker-2", second, "exit 3")
    time.sleep(max(0.0, fifth.timestamp() + 0.1 - time.time()))
    short = E2E
    lab.jobs[short] = f"{E2E}-{lab.uid}"  # for the helpers
    ticks = {t["tick"]: t for t in _history_json_any(lab, short)}
    run_1, run_2 = ticks[tick_name(first)], ticks[tick_name(second)]
    assert (run_1["outcome"], run_1["worker"], run_1["exit_status"]) == ("succeeded", "worker-1", 0)
    assert (run_2["outcome"], run_2["worker"], run_2["exit_status"]) == ("failed", "worker-2", 3)
    assert run_2["lock_index"] > run_1["lock_index"] >= 1
    # claimed within its window (the interval: no start_deadline set), however slow the start
    assert 0 <= run_1["start_lag"] <= EVERY and run_1["duration"] is not None
    assert (ticks[tick_name(third)]["outcome"], ticks[tick_name(third)]["recorded"]) == (
        "missed",
        False,
    )
    check = lockctl(lab, "check", "--job", lab.jobs[short], token=lab.worker_token)
    assert check.returncode == 2, check.stdout
    assert f"missed {tick_name(third)}" in check.stdout and "recorded now" in check.stdout
    assert f"last run {tick_name(second)} failed (exit 3, on worker-2)" in check.stdout
    after = {t["tick"]: t for t in _history_json_any(lab, short)}
    assert after[tick_name(third)]["recorded"] is True
    assert after[tick_name(third)]["worker"] == "lockctl check"
    status = json.loads(lockctl(lab, "status", "--json").stdout)
    (state,) = [s for s in status if s["job"] == lab.jobs[short]]
    assert state["last_tick"]["tick"] >= tick_name(third)
    assert state["next_tick"] > tick_name(fifth)


def _history_json_any(lab: Lab, short: str) -> list[dict[str, Any]]:
    result = lockctl(lab, "history", "--job", lab.jobs[short], "--json")
    assert result.returncode == 0, result.stderr
    (job,) = json.loads(result.stdout)
    return list(job["ticks"])
