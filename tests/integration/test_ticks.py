"""Once per tick, on the real cluster: `lockctl run` of a scheduled job claims the tick it belongs
to in the same transaction as the lock, so workers whose timers fire up to a second apart run
each tick exactly once, with a job of a few milliseconds and no min_hold; a tick nobody ran is
recorded missed; a tick whose previous run still goes is skipped as an overlap.

Runners are real `lockctl run` subprocesses on three workers (three client agents), fired at
chosen offsets after each tick of an `@every 3s` schedule.
"""

from __future__ import annotations

import json
import random
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from workers_lab import minted_workers, spec_text

from provision.ledger.records import TickOutcome, tick_name
from provision.ledger.store import Ledger
from provision.ledger.turns import claim_order
from provision.schedule import parse_schedule
from tests.lockctl_process import LOCKCTL

if TYPE_CHECKING:
    from conftest import LiveCluster


WORKERS = ("worker-1", "worker-2", "worker-3")
EVERY = 3  # seconds between ticks
SCHEDULE = parse_schedule(f"@every {EVERY}s")
JOBS = ("once2", "once3", "missed", "overlap", "waits")
WAIT = 30.0


@dataclass(frozen=True)
class Lab:
    tmp: Path
    configs: dict[str, Path]
    jobs: dict[str, str]
    keys: dict[str, str]
    cluster: LiveCluster


# The waiters of the --wait test wait for the lock within their tick's window, until the start
# deadline: the long run before them (4 s) must end inside it. With the default deadline (the
# interval, 3 s) that left 2 s, which a loaded machine's slow starts used up; 10 s leaves 7.
WAITS_DEADLINE = "10s"


def _spec_text(cluster: LiveCluster, uid: str) -> str:
    jobs = {
        f"{short}-{uid}": {
            "prefix": f'"test/ticks-{uid}/{short}/"',
            "schedule": f'"@every {EVERY}s"',
        }
        for short in JOBS
    }
    jobs[f"waits-{uid}"]["start_deadline"] = f'"{WAITS_DEADLINE}"'
    return spec_text(cluster, WORKERS, jobs)


@pytest.fixture(scope="module")
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("ticks")
    uid = uuid.uuid4().hex[:8]
    spec_path = tmp / "locks.hcl"
    spec_path.write_text(_spec_text(live_cluster, uid))
    kv = f"test/ticks-{uid}/"
    with minted_workers(live_cluster, spec_path, WORKERS, tmp, uid, kv) as made:
        yield Lab(
            tmp,
            made.configs,
            {short: f"{short}-{uid}" for short in JOBS},
            {short: f"{kv}{short}/.lock" for short in JOBS},
            live_cluster,
        )


def _run(
    lab: Lab, worker: str, short: str, command: str, *flags: str
) -> subprocess.CompletedProcess[str]:
    argv = [*LOCKCTL, "run", "--config", str(lab.configs[worker]), "--job", lab.jobs[short]]
    argv += flags
    return subprocess.run(
        [*argv, "--", "sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )


def _events(result: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]


def _named(result: subprocess.CompletedProcess[str], name: str) -> list[dict[str, Any]]:
    return [event for event in _events(result) if event["event"] == name]


def _next_tick(after: float | None = None) -> datetime:
    now = (
        datetime.now(timezone.utc) if after is None else datetime.fromtimestamp(after, timezone.utc)
    )
    return SCHEDULE.next_ticks(now, 1)[0]


def _sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.time()))


def _fire(
    lab: Lab, short: str, offsets: dict[str, float], tick: datetime, command: str, *flags: str
) -> dict[str, subprocess.CompletedProcess[str]]:
    """Start one runner per worker at tick + its offset (threads); their results by worker."""
    results: dict[str, subprocess.CompletedProcess[str]] = {}

    def one(worker: str, offset: float) -> None:
        _sleep_until(tick.timestamp() + offset)
        results[worker] = _run(lab, worker, short, command, *flags)

    threads = [threading.Thread(target=one, args=item) for item in offsets.items()]
    for thread in threads:
        thread.start()
    # the tick may be a while off (a claim order the test needs can be a minute away)
    for thread in threads:
        thread.join(max(0.0, tick.timestamp() - time.time()) + max(offsets.values()) + WAIT)
    return results


@pytest.mark.parametrize("workers", [2, 3])
def test_runners_up_to_a_second_apart_run_each_tick_exactly_once(lab: Lab, workers: int) -> None:
    short = f"once{workers}"
    ran = lab.tmp / f"{short}.ran"
    command = f'echo "$LOCKCTL_TICK $LOCKCTL_WORKER $LOCK_INDEX" >> {ran}'
    rng = random.Random(workers)
    fired = SCHEDULE.next_ticks(datetime.now(timezone.utc), 6)
    rounds: list[list[subprocess.CompletedProcess[str]]] = []
    for tick in fired:
        # the first timer fires just after the tick, the others up to a second later
        offsets = {w: 0.05 + rng.uniform(0, 0.9) for w in WORKERS[:workers]}
        rounds.append(list(_fire(lab, short, offsets, tick, command).values()))
    runs = [run for round_ in rounds for run in round_]
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]

    # Safety: no tick ran twice, whatever the timing.
    acquired = [e["tick"] for r in runs for e in _named(r, "acquired")]
    assert len(acquired) == len(set(acquired)), acquired
    lines = [line.split() for line in (ran.read_text() if ran.exists() else "").splitlines()]
    assert sorted(tick for tick, _, _ in lines) == sorted(acquired)
    skipped = [e for r in runs for e in _named(r, "skipped")]
    # A runner that started after its tick's window (a machine so loaded that starting Python
    # took longer than the interval) says so, and runs nothing: its tick is missed for it.
    late = [e for r in runs for e in _named(r, "missed")]
    unsaid = [
        [(e["event"], e.get("tick"), e.get("reason")) for e in _events(r)]
        for r in runs
        if not any(_named(r, name) for name in ("acquired", "skipped", "missed"))
    ]
    assert len(skipped) + len(acquired) + len(late) == len(runs), unsaid  # one verdict each
    assert all(f"tick {e['tick']} already" in e["reason"] for e in skipped), skipped
    assert all("later than its start deadline" in e["reason"] for e in late), late
    assert all(e["lag_ms"] > e["deadline_ms"] for e in late), late
    # Liveness: every tick a runner was on time for (it ran it, or found it taken) was run.
    # A tick found taken was run by a runner of this test, or recorded missed by a late one
    ran_by = {e["tick"]: e.get("taken_outcome") for e in skipped}
    recorded_missed = {e["tick"] for e in late if e.get("recorded")}
    assert all(
        (tick in recorded_missed) if outcome == "missed" else (tick in acquired)
        for tick, outcome in ran_by.items()
    ), (skipped, acquired, late)
    on_time = [tick for tick in fired if tick_name(tick) in acquired]
    assert on_time, (fired, late)  # at least one round had a runner on time

    records = {r.tick: r for r in Ledger(lab.cluster.management(), lab.keys[short]).records()}
    by_tick = {tick: worker for tick, worker, _ in lines}
    for tick in on_time:
        record = records.get(tick)
        assert record is not None, (tick_name(tick), sorted(map(tick_name, records)), acquired)
        assert (record.outcome, record.exit_status) == (TickOutcome.SUCCEEDED, 0)
        assert record.worker == by_tick[tick_name(tick)]
    indexes = [int(index) for _, _, index in lines]
    assert indexes == sorted(indexes) and len(set(indexes)) == len(indexes)  # the fencing token


def test_a_tick_nobody_ran_is_recorded_missed_once(lab: Lab) -> None:
    ledger = Ledger(lab.cluster.management(), lab.keys["missed"])
    first = _next_tick()
    _fire(lab, "missed", {"worker-1": 0.05}, first, "true")
    skipped_ticks = SCHEDULE.next_ticks(first, 2)  # all runners stopped for two ticks
    later = SCHEDULE.next_ticks(skipped_ticks[-1], 1)[0]
    _fire(lab, "missed", {"worker-2": 0.05}, later, "true")
    records = {r.tick: r for r in ledger.records()}
    assert records[first].outcome is TickOutcome.SUCCEEDED
    assert records[later].outcome is TickOutcome.SUCCEEDED
    # the first skipped tick's window (3s) plus grace (2s) closed before `later` + a moment
    assert records[skipped_ticks[0]].outcome is TickOutcome.MISSED
    assert records[skipped_ticks[0]].worker == "worker-2"  # who noticed
    # noticed again by the next run: written once, never twice (cas index 0)
    again = SCHEDULE.next_ticks(later, 1)[0]
    before = ledger.read(skipped_ticks[0])[0]
    _fire(lab, "missed", {"worker-3": 0.05}, again, "true")
    after = {r.tick: r for r in ledger.records()}
    assert after[skipped_ticks[0]] == before
    assert after[skipped_ticks[1]].outcome is TickOutcome.MISSED
    # and a late runner for a missed tick cannot claim it
    assert ledger.read(skipped_ticks[1])[0] is not None


def test_a_tick_whose_previous_run_still_goes_is_skipped_as_an_overlap(lab: Lab) -> None:
    tick = _next_tick()
    results: dict[str, subprocess.CompletedProcess[str]] = {}

    def long_run() -> None:
        results["long"] = _fire(lab, "overlap", {"worker-1": 0.05}, tick, "sleep 4")["worker-1"]

    thread = threading.Thread(target=long_run)
    thread.start()
    following = SCHEDULE.next_ticks(tick, 1)[0]
    short = _fire(lab, "overlap", {"worker-2": 0.05}, following, "true")["worker-2"]
    thread.join(WAIT)
    assert short.returncode == 0
    skipped = [e for e in _events(short) if e["event"] == "skipped"]
    assert len(skipped) == 1, short.stderr
    assert skipped[0]["tick"] == tick_name(following)
    assert f"overlap, tick {tick_name(tick)} is still running" in skipped[0]["reason"]
    assert "worker-1" in skipped[0]["reason"]
    assert results["long"].returncode == 0


def _orders_after(job: str, start: datetime) -> Iterator[tuple[datetime, datetime]]:
    """Pairs of consecutive ticks after `start` whose first tick's first-ranked worker is last
    in the claim order of the second (provision/ledger/turns.py)."""
    for tick in SCHEDULE.next_ticks(start, 60):
        following = SCHEDULE.next_ticks(tick, 1)[0]
        if claim_order(job, tick, WORKERS)[0] == claim_order(job, following, WORKERS)[-1]:
            yield tick, following


def test_with_wait_the_next_tick_runs_once_the_previous_run_ends(lab: Lab) -> None:
    """--wait on a scheduled job: wait for the lock within the tick's window; the first waiter
    to get it runs the tick, the other then finds the tick taken and skips at once.

    The ticks are chosen so that the long run is its tick's first choice (it starts at once)
    and the two waiters are the following tick's first two (they arrive while it still runs)."""
    tick, following = next(_orders_after(lab.jobs["waits"], datetime.now(timezone.utc)))
    holder, *waiting = claim_order(lab.jobs["waits"], following, WORKERS)[::-1]
    ran = lab.tmp / "waits.ran"
    results: dict[str, subprocess.CompletedProcess[str]] = {}

    def long_run() -> None:
        results["long"] = _fire(lab, "waits", {holder: 0.05}, tick, "sleep 4")[holder]

    thread = threading.Thread(target=long_run)
    thread.start()
    command = f'echo "$LOCKCTL_TICK $LOCKCTL_WORKER" >> {ran}'
    offsets = dict(zip(waiting[::-1], (0.05, 0.3), strict=True))
    waiters = _fire(lab, "waits", offsets, following, command, "--wait")
    thread.join(WAIT)
    assert sorted(waiters) == sorted(waiting)
    assert all(r.returncode == 0 for r in waiters.values()), waiters
    lines = ran.read_text().splitlines()
    assert len(lines) == 1 and lines[0].split()[0] == tick_name(following)
    winner = lines[0].split()[1]
    loser = next(w for w in waiters if w != winner)
    assert _named(waiters[winner], "waiting") and _named(waiters[winner], "acquired")
    skipped = _named(waiters[loser], "skipped")
    # Woken by the winner's acquire it finds the tick running; woken late (a loaded machine),
    # after the completion, which frees the lock and says how the run ended in one transaction,
    # it finds it run. Either way it names the winner and runs nothing.
    reasons = (f"already taken by {winner} (running)", f"already run by {winner} (succeeded)")
    assert len(skipped) == 1 and skipped[0]["reason"].endswith(reasons), skipped
