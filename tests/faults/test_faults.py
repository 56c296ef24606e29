"""Mutual exclusion under faults: each scenario once, with lockctl's runner, on real Consul agents
in network namespaces (root; part of the default run, as CI has root).

Three workers compete for one job each scenario (`lockctl run --wait`, restarted on a 1 s
schedule); the job is a process tree (main, child, TERM-ignoring grandchild, setsid'd daemon) whose
every member writes its LockIndex to the oracle (bench/faultlab/oracle.py). Per fault: no two
holders' accepted writes overlap, a stale writer is rejected by the LockIndex check (the SIGSTOP
scenario must show it), the old holder's whole tree is dead before the new one starts (unless the
runner itself was paused), no process of the job is alive 1 s after a kill -9 of its runner or
kill grace + 2 s after its runner ended (a /proc scan for the run's marker), the takeover comes
within 2 x TTL + LockDelay + 5 s (and within detection + LockDelay + 2 s for a cut-off host), and
no session or held key is left. The soak with many faults, and `consul lock` for comparison, is
bench/faults.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.faultlab import survivors
from bench.faultlab.harness import (
    JOB_SCRIPT,
    SCENARIOS,
    FaultLab,
    RunResult,
    fault_lab,
    run_scenario,
)
from bench.faultlab.job import ROLES
from bench.faultlab.oracle import Holder, Oracle
from provision.cluster import netns as ns
from provision.cluster import tls
from provision.consul import Consul
from provision.consul.errors import ConsulError
from provision.consul.transport import NO_RETRY
from provision.errors import EXIT_LOCK_LOST
from provision.system.deadline import Deadline, wait_until

pytestmark = pytest.mark.faults

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultLab]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    with fault_lab(tmp_path_factory.mktemp("faults")) as started:
        yield started


def _explain(result: RunResult) -> str:
    return f"{result.scenario} (holder {result.holder}, job {result.job}): {result.problems()}"


@needs_root
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_mutual_exclusion_survives(lab: FaultLab, scenario: str) -> None:
    result = run_scenario(lab, scenario, "lockctl")
    assert result.problems() == [], _explain(result)
    assert result.overlaps == 0
    assert result.survivors == 0, result.survivors_seen
    holders = lab.oracle.holders(result.job)
    partial = [_roles(h, lab.oracle) for h in holders if len(h.sections) != len(ROLES)]
    assert holders and not partial, f"every holder's job ran as a whole process tree: {partial}"
    assert result.takeover is not None and result.takeover <= result.bound
    if scenario == "sigstop":
        assert result.rejections >= 1, "the fence must have stopped the resumed stale writer"
    if scenario == "cut-host":
        assert result.detection is not None and result.detection_bound is not None
        assert result.takeover <= result.detection_bound
    if scenario in ("sigstop", "cut-host", "restart-agent"):
        # The holder lost its lock while its job ran: its runner must say so (exit 76), also
        # when the paused job ended on its own after SIGCONT (fixed in 66eefa0).
        assert result.holder_exit == EXIT_LOCK_LOST, result.runner_exits


def _roles(holder: Holder, oracle: Oracle) -> str:
    """Which members of `holder`'s tree entered and when, beside the driver's marks (the fault,
    the teardown), on the oracle's clock."""
    members = ", ".join(
        f"{s.role} {s.entered:.2f}-{s.closed if s.closed is None else round(s.closed, 2)}"
        for s in holder.sections
    )
    marks = ", ".join(f"{what} {at:.2f}" for at, what in oracle.marks[-3:])
    return f"{holder.worker}: {members} (marks: {marks})"


@needs_root
def test_namespaces_hold_the_addresses_and_cut_isolates_one_host(lab: FaultLab) -> None:
    """The agents' addresses exist only inside the namespaces; a cut stops one host only."""
    layout = lab.cluster
    root_addresses = Path("/proc/net/fib_trie").read_text()
    for agent in layout.agents:
        assert agent.netns is not None and (ns.NETNS_RUN_DIR / agent.netns).exists()
        assert f" {agent.address}\n" not in root_addresses
    worker = layout.workers[0]
    host = layout.host(worker)
    assert layout.netns_prefix is not None
    with lab.driver():
        reachable = lab.management(worker.name).status.leader()
        assert reachable
        ns.cut(layout.netns_prefix, host)
        try:
            other = lab.management(layout.workers[1].name).status.leader()
            assert other
            settings = tls.consul_settings(lab.cluster, address=worker.http_address, timeout=1.0)
            cut_off = Consul(settings)
            with pytest.raises(ConsulError):
                cut_off.status.leader(retry=NO_RETRY)
        finally:
            ns.heal(layout.netns_prefix, host)
    lab.wait_healthy()


class _Job:
    """A fake job (one member of a holder's tree) talking the oracle's protocol."""

    def __init__(self, oracle: Oracle, lock_index: int | None, run: str | None = None) -> None:
        self.client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.client.connect(str(oracle.path))
        self.stream = self.client.makefile("rwb")
        self.entered = self.send(
            "enter",
            job="j",
            worker="w",
            session="s",
            lock_index=lock_index,
            run=run or uuid.uuid4().hex,
            role="main",
            pid=os.getpid(),
        )

    def send(self, op: str, **fields: object) -> bool:
        self.stream.write(json.dumps({"op": op, **fields}).encode() + b"\n")
        self.stream.flush()
        return bool(json.loads(self.stream.readline())["ok"])

    def close(self) -> None:
        self.stream.close()
        self.client.close()


def test_oracle_fences_lower_lock_index_and_counts_overlaps_and_late_kills(tmp_path: Path) -> None:
    """The oracle itself (no cluster): the checks above are only as good as these."""
    oracle = Oracle(tmp_path / "o.sock").start()
    try:
        old = _Job(oracle, 5)
        assert old.entered and old.send("write")
        new = _Job(oracle, 6)
        assert new.entered
        assert not old.send("write"), "a LockIndex below the highest accepted must be refused"
        assert new.send("write")
        assert oracle.rejections("j") == 1
        assert oracle.overlaps("j") == [], "a rejected stale write is not an overlap"
        late = oracle.late_kills("j")
        assert len(late) == 1 and late[0].older.lock_index == 5, "the old job was still alive"
        old.close()
        new.close()
        time.sleep(0.1)
        unfenced = _Job(oracle, None)  # consul lock's child: no fencing token
        also = _Job(oracle, None)
        assert unfenced.send("write") and also.send("write") and unfenced.send("write")
        assert len(oracle.overlaps("j")) == 1, "without a token the resource cannot refuse"
        unfenced.close()
        also.close()
    finally:
        oracle.stop()


def test_oracle_checks_holders_not_members(tmp_path: Path) -> None:
    """Members of one holder's tree may write at once; a member of an older holder that writes
    beside the next holder is an overlap, and is alive when it entered (a late kill)."""
    oracle = Oracle(tmp_path / "o.sock").start()
    try:
        main, daemon = _Job(oracle, None, run="a"), _Job(oracle, None, run="a")
        assert main.send("write") and daemon.send("write") and main.send("write")
        assert oracle.overlaps("j") == [] and oracle.late_kills("j") == []
        main.close()
        time.sleep(0.1)
        newer = _Job(oracle, None, run="b")
        assert newer.send("write") and daemon.send("write"), "unfenced: the orphan's write counts"
        (overlap,) = oracle.overlaps("j")
        assert (overlap.older.run, overlap.newer.run) == ("a", "b")
        assert [k.older.run for k in oracle.late_kills("j")] == ["a"]
        older = oracle.holder("j", "a")
        assert older is not None and older.pids == [os.getpid()] * 2  # SO_PEERCRED: this test
        daemon.close()
        newer.close()
    finally:
        oracle.stop()


def test_job_is_a_process_tree_and_its_orphans_are_found_as_survivors(tmp_path: Path) -> None:
    """The test job itself (no cluster, no lock tool): main, child, a TERM-ignoring grandchild
    and a setsid'd daemon ignoring TERM and HUP all enter the oracle with one identity; with no
    tool to contain them, the rest outlive a SIGKILLed main, and the /proc scan finds them."""
    oracle = Oracle(tmp_path / "o.sock").start()
    marker = f"faultjob-test-{uuid.uuid4().hex[:8]}"
    argv = [sys.executable, str(JOB_SCRIPT), str(oracle.path), "j", "w", "30", marker]
    main = subprocess.Popen(argv, env={**os.environ, "LOCK_INDEX": "7", "LOCK_SESSION": "s"})
    try:
        assert wait_until(Deadline(10.0), lambda: len(oracle.of_job("j")) == len(ROLES), 0.05)
        (holder,) = oracle.holders("j")
        roles = {s.role: s for s in holder.sections}
        assert sorted(roles) == sorted(ROLES) and roles["main"].pid == main.pid
        assert {s.lock_index for s in holder.sections} == {7}
        assert len(set(holder.pids)) == len(ROLES), "SO_PEERCRED: each member's own PID"
        assert os.getsid(roles["daemon"].pid) != os.getsid(main.pid)
        assert _ignored(roles["daemon"].pid) >= {signal.SIGTERM, signal.SIGHUP}
        assert _ignored(roles["grandchild"].pid) >= {signal.SIGTERM}
        assert _parent(roles["grandchild"].pid) == roles["child"].pid
        main.kill()
        main.wait()
        left = survivors.wait_gone(marker, 1.0, job="j")
        assert sorted(left) == sorted(s.pid for s in holder.sections if s.role != "main")
        survivors.kill(left, marker)
        assert survivors.marked(marker) == {}
    finally:
        survivors.kill(survivors.marked(marker), marker)
        main.kill()
        main.wait()
        oracle.stop()


def _ignored(pid: int) -> set[int]:
    """The signals `pid` ignores (SigIgn in /proc/PID/status)."""
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if "SigIgn" in x)
    mask = int(line.split()[1], 16)
    return {n for n in range(1, 65) if mask & (1 << (n - 1))}


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
