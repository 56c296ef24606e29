"""The end of a run's output in its tick record, on the real cluster: `lockctl run` and
`lockctl schedule` tee the job's stdout and stderr (all of it still reaches the runner's own),
keep their ends bounded, printable and with the worker's token masked, and `history --tick`
shows them; `history --timeline` shows a tick nobody ran as a gap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import unicodedata
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from scheduler_lab import SchedulerProcess
from workers_lab import minted_workers, spec_text

from provision.ledger.records import OUTPUT_BUDGET, RECORD_MAX_BYTES, tick_key, tick_name
from provision.schedule import parse_schedule
from provision.system.tails import MASKED, encoded_size
from tests.lockctl_process import eventually

if TYPE_CHECKING:
    from conftest import LiveCluster

LOCKCTL = [sys.executable, "-m", "provision"]
WORKERS = ("worker-1", "worker-2")
EVERY = 3
LINES = 150  # per stream: ~9 KB each, twice what a runner keeps
# Two children and a grandchild write; the planted secret (the worker's own token, which the
# job has from the test's environment) is in the middle and near the end of both streams; then
# a terminal escape, a CR and bytes that are not UTF-8.
NOISY = r"""
( i=0; while [ $i -lt 150 ]; do
    printf 'out-%03d padding padding padding padding padding padding\n' $i
    [ $i = 75 ] || [ $i = 148 ] && echo "token=$PLANTED"
    i=$((i+1)); done ) &
( i=0; while [ $i -lt 150 ]; do
    printf 'err-%03d padding padding padding padding padding padding\n' $i >&2
    [ $i = 75 ] || [ $i = 148 ] && echo "stderr token=$PLANTED" >&2
    i=$((i+1)); done ) &
wait
sh -c 'printf "\033[2Jclear\rover \377\376 done\n"; echo last-err >&2'
"""


@dataclass
class Lab:
    tmp: Path
    spec_path: Path
    configs: dict[str, Path]
    uid: str
    cluster: LiveCluster
    token: Path  # worker-1's token file
    secrets: tuple[str, ...] = field(repr=False)


@pytest.fixture(scope="module")
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("output")
    uid = uuid.uuid4().hex[:8]
    spec_path = tmp / "locks.hcl"
    jobs = {
        f"{short}-{uid}": {"prefix": f'"test/output-{uid}/{short}/"', "schedule": schedule}
        for short, schedule in (
            ("noisy", f'"@every {EVERY}s"'),
            ("gaps", f'"@every {EVERY}s"'),
            ("sched", '"@every 2s"'),
        )
    }
    jobs[f"sched-{uid}"]["command"] = json.dumps(
        ["/bin/sh", "-c", 'echo "sched-out $LOCKCTL_TICK"; echo "sched-err token=$PLANTED" >&2']
    )
    spec_path.write_text(spec_text(live_cluster, WORKERS, jobs))
    with minted_workers(live_cluster, spec_path, WORKERS, tmp, uid, f"test/output-{uid}/") as made:
        yield Lab(
            tmp,
            spec_path,
            made.configs,
            uid,
            live_cluster,
            tmp / "secrets" / "worker-1.token",
            tuple(made.secrets),
        )


def _environ(lab: Lab) -> dict[str, str]:
    """The test's environment, with worker-1's token planted for the job to print."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONSUL_", "FORCE_COLOR"))}
    env["PLANTED"] = lab.token.read_text().strip()
    return env


def _run_at(lab: Lab, worker: str, job: str, moment: datetime, script: str) -> Any:
    time.sleep(max(0.0, moment.timestamp() + 0.1 - time.time()))  # the tick must have come
    argv = [*LOCKCTL, "run", "--config", str(lab.configs[worker]), "--job", f"{job}-{lab.uid}"]
    return subprocess.run(
        [*argv, "--", "/bin/sh", "-c", script],
        capture_output=True,
        env=_environ(lab),
        timeout=60,
        check=False,
    )


def lockctl(lab: Lab, *args: str) -> subprocess.CompletedProcess[str]:
    """A reader's command, with the checks every reader's output gets: no secret, no raw
    control character, no traceback."""
    flags = ["--spec", str(lab.spec_path), "--address", lab.cluster.address("server-1")]
    flags += ["--token-file", str(lab.cluster.layout.management_token_file)]
    result = subprocess.run(
        [*LOCKCTL, *args, *flags, *lab.cluster.tls_flags()],
        capture_output=True,
        text=True,
        timeout=60,
        env=_environ(lab),
        check=False,
    )
    leaked = any(secret in result.stdout + result.stderr for secret in lab.secrets)
    assert not leaked
    assert _raw_controls(result.stdout + result.stderr) == []
    assert "Traceback" not in result.stderr, result.stderr
    return result


def _raw_controls(text: str) -> list[str]:
    unsafe = {"Cc", "Cf", "Cs", "Zl", "Zp"}
    return [c for c in text if c not in "\n\t" and unicodedata.category(c) in unsafe]


def _tick_json(lab: Lab, job: str, tick: datetime) -> dict[str, Any]:
    shown = lockctl(
        lab, "history", "--job", f"{job}-{lab.uid}", "--tick", tick_name(tick), "--json"
    )
    assert shown.returncode == 0, shown.stderr
    found: dict[str, Any] = json.loads(shown.stdout)
    return found


def _assert_safe_tail(lab: Lab, tail: str) -> None:
    leaked = any(secret in tail for secret in lab.secrets)
    assert not leaked
    assert _raw_controls(tail) == []
    assert encoded_size(tail) <= OUTPUT_BUDGET


def test_run_keeps_the_end_of_its_output_bounded_printable_and_masked(lab: Lab) -> None:
    tick = parse_schedule(f"@every {EVERY}s").next_ticks(datetime.now(timezone.utc), 1)[0]
    done = _run_at(lab, "worker-1", "noisy", tick, NOISY)
    events = done.stderr.decode(errors="replace")
    assert done.returncode == 0 and '"event":"acquired"' in events, _masked(lab, events[-2000:])
    # All of it still went where it went before: the runner's own stdout and stderr.
    out, err = done.stdout.decode(errors="replace"), events
    assert all(f"out-{n:03d} " in out for n in range(LINES))
    assert all(f"err-{n:03d} " in err for n in range(LINES))
    assert "\x1b[2Jclear" in out and "last-err" in err

    record = _tick_json(lab, "noisy", tick)
    assert record["outcome"] == "succeeded" and record["worker"] == "worker-1"
    stdout, stderr = record["stdout"], record["stderr"]
    for tail in (stdout, stderr):
        _assert_safe_tail(lab, tail)
        assert tail.count(MASKED) == 1  # the planted token near the end; the middle one is cut
    assert stdout.endswith("\\x1b[2Jclear\\rover \ufffd\ufffd done\n")
    assert "out-149 padding" in stdout and "out-100 " not in stdout
    assert stderr.endswith("err-149 padding padding padding padding padding padding\nlast-err\n")

    raw, _ = lab.cluster.management().kv.get(tick_key(f"test/output-{lab.uid}/noisy/.lock", tick))
    assert raw is not None and raw.value is not None
    assert len(raw.value) <= RECORD_MAX_BYTES
    leaked = any(secret.encode() in raw.value for secret in lab.secrets)
    assert not leaked

    shown = lockctl(lab, "history", "--job", f"noisy-{lab.uid}", "--tick", tick_name(tick))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"noisy-{lab.uid} tick {tick_name(tick)}: succeeded"
    assert "    | \\x1b[2Jclear\\rover \ufffd\ufffd done" in lines
    assert f"    | token={MASKED}" in lines and "    | last-err" in lines


def test_a_tick_without_a_record_is_refused_in_one_line(lab: Lab) -> None:
    never = datetime(2020, 1, 1, tzinfo=timezone.utc)
    shown = lockctl(lab, "history", "--job", f"noisy-{lab.uid}", "--tick", tick_name(never))
    assert shown.returncode == 2 and len(shown.stderr.splitlines()) == 1, shown.stderr
    bad = lockctl(lab, "history", "--job", f"noisy-{lab.uid}", "--tick", "yesterday")
    assert bad.returncode == 2 and "--tick 'yesterday': not a tick name" in bad.stderr
    alone = lockctl(lab, "history", "--tick", tick_name(never))
    assert alone.returncode == 2 and "--tick needs --job" in alone.stderr


def test_the_timeline_shows_who_ran_each_tick_and_a_gap_for_a_missed_one(lab: Lab) -> None:
    """Tick 1 succeeds on worker-1, nobody runs tick 2, tick 3 fails on worker-2: once tick 2's
    window closed, the strips read `# .` and `. F` (a blank column: the gap)."""
    every = parse_schedule(f"@every {EVERY}s")
    first, second, third = every.next_ticks(datetime.now(timezone.utc), 3)
    assert _run_at(lab, "worker-1", "gaps", first, "echo one").returncode == 0
    assert _run_at(lab, "worker-2", "gaps", third, "echo oops >&2; exit 3").returncode == 3

    def missed() -> bool:  # no row at all until its window closed: refused, exit 2
        args = ("history", "--job", f"gaps-{lab.uid}", "--tick", tick_name(second), "--json")
        shown = lockctl(lab, *args)
        return shown.returncode == 0 and json.loads(shown.stdout)["outcome"] == "missed"

    assert eventually(missed, timeout=60)
    shown = lockctl(lab, "history", "--job", f"gaps-{lab.uid}", "--timeline")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith(f"gaps-{lab.uid}: @every {EVERY}s (UTC), ")
    assert f"{tick_name(first)} .. " in lines[0]
    column = 2 + len("worker-1") + 2  # where the strips start: after the names
    strips = {line.split()[0]: line[column:] for line in lines[1:3]}
    assert strips["worker-1"].startswith("# .") and strips["worker-2"].startswith(". F"), lines
    assert any(line.startswith("legend: # succeeded, F failed") for line in lines)
    assert _tick_json(lab, "gaps", third)["stderr"] == "oops\n"


def test_the_scheduler_keeps_the_end_of_each_run_too(lab: Lab) -> None:
    """`lockctl schedule` forks its jobs through its namespace helper: their output too."""
    raw = json.loads(lab.configs["worker-1"].read_text())
    job = f"sched-{lab.uid}"
    raw["jobs"] = {job: raw["jobs"][job]}
    config = lab.tmp / "worker-1-sched.json"
    config.write_text(json.dumps(raw))
    scheduler = SchedulerProcess(config, env=_environ(lab))
    try:

        def completed() -> list[dict[str, Any]]:
            return [e for e in scheduler.events("released") if e.get("child_status") == 0]

        assert eventually(completed, timeout=60), _masked(lab, "\n".join(scheduler.lines[-20:]))
    finally:
        assert scheduler.stop() == 0
    (acquired, *_) = scheduler.events("acquired")  # one job: its first run, released first
    tick = datetime.fromisoformat(acquired["tick"].replace("Z", "+00:00"))
    record = _tick_json(lab, "sched", tick)
    assert record["stdout"] == f"sched-out {tick_name(tick)}\n"
    assert record["stderr"] == f"sched-err token={MASKED}\n"
    # and the job's stderr still reached the scheduler's own (the test reads it there)
    assert any(line.startswith("sched-err token=") for line in scheduler.lines)


def _masked(lab: Lab, text: str) -> str:
    """`text` for an assertion's message: a failing test's report shows no secret."""
    for secret in lab.secrets:
        text = text.replace(secret, MASKED)
    return text
