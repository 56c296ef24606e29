"""Workers without a local agent (issue 23, items 4 and 6) on a real 3-server cluster of their
own (the lifecycle subnet: the fault test kills a server): `lockctl schedule` replicas that talk
to a server's HTTP address directly, register their own catalog node, run ticks under TTL-only
sessions and deregister on SIGTERM; the rendered policy lets a worker register exactly its own
node; and the server the holder's session was made on is killed while its process-tree job runs.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from lockctl_process import LOCKCTL, eventually
from procscan import pids_with
from workers_lab import MintedWorkers, minted_workers

from provision.cluster.local import ClusterShape, cluster_down, cluster_up
from provision.consul import Consul, ConsulError, PermissionDenied
from provision.consul.models import Session
from provision.consul.transport import IDEMPOTENT, Call
from provision.system.processes import read_pid
from provision.system.secrets import Secret
from tests.conftest import LiveCluster
from tests.subnets import LIFECYCLE_SUBNET as SUBNET

pytestmark = pytest.mark.cluster


PODS = ("pod-0", "pod-1")
EVERY = 3  # the job's schedule: @every EVERY s
TTL, LOCK_DELAY = 10.0, 4.0
# The job: a process tree (this shell and a sleep it waits for) that says when it started and
# when it ended, with its worker and both PIDs, so the test can tell overlaps and survivors.
JOB = """#!/bin/sh
out="$1"; shift
sleep "$1" & child=$!
echo "start $LOCKCTL_WORKER $$ $child $(date +%s.%N)" >> "$out"
trap 'kill $child; echo "end $LOCKCTL_WORKER $$ $(date +%s.%N)" >> "$out"; exit 143' TERM
wait $child
echo "end $LOCKCTL_WORKER $$ $(date +%s.%N)" >> "$out"
"""


class PodCluster(LiveCluster):
    """The cluster, where a pod's address is a server's (it has no agent of its own)."""

    state_dir: Path

    def address(self, name: str) -> str:
        return super().address("server-1" if name in PODS else name)


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PodCluster]:
    state = tmp_path_factory.mktemp("agentless") / "state"
    result = cluster_up(state, ClusterShape(subnet=SUBNET, workers=1))
    try:
        cluster = PodCluster(result.status)
        cluster.state_dir = state
        tls = cluster.layout.tls_dir
        for pod in PODS:  # a pod's client pair, as `--tls-dir` names it: lockctl's own
            shutil.copy(tls / "lockctl.pem", tls / f"{pod}.pem")
            shutil.copy(tls / "lockctl-key.pem", tls / f"{pod}-key.pem")
        yield cluster
    finally:
        cluster_down(state)


def _followers(cluster: LiveCluster) -> list[str]:
    """The servers that are not the leader: killing one leaves the quorum as it was."""
    leader = cluster.management().status.leader().rsplit(":", 1)[0]
    return [
        a.name
        for a in cluster.layout.servers
        if a.http_address.split("//")[1].split(":")[0] != leader
    ]


def _spec(tmp: Path, cluster: LiveCluster, servers: dict[str, str], seconds: int | str) -> Path:
    job = tmp / "job.sh"
    job.write_text(JOB)
    job.chmod(0o755)
    lines = [f'defaults {{\n  ttl = "{TTL:g}s"\n  lock_delay = "{LOCK_DELAY:g}s"']
    lines += ['  renew_interval = "1s"\n  kill_grace = "1s"\n}']
    for pod, server in servers.items():
        lines += [f'worker "{pod}" {{', f'  address = "{cluster.address(server)}"']
        lines += ["  agentless = true", "}"]
    command = f'["{job}", "{tmp / "runs.log"}", "{seconds}"]'
    lines += ['job "report" {', '  prefix = "locks/agentless/"']
    lines += [f"  workers = {list(servers)!r}".replace("'", '"'), f'  schedule = "@every {EVERY}s"']
    lines += [f"  command = {command}", "}"]
    path = tmp / "locks.hcl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _schedule(made: MintedWorkers, pod: str, tmp: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "LOCKCTL_NODE_ADDRESS": f"10.9.0.{PODS.index(pod) + 1}"}
    with (tmp / f"{pod}.log").open("w") as log:  # the child has its own copy of the descriptor
        return subprocess.Popen(
            [*LOCKCTL, "schedule", "--config", str(made.configs[pod])],
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )


def _runs(tmp: Path) -> list[list[str]]:
    path = tmp / "runs.log"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def _stop(process: subprocess.Popen[str]) -> int:
    """SIGTERM, and its exit status; one that does not end within a minute is killed (by its
    PID: nothing of a failed test outlives it) and the timeout raised."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)
        raise


def test_the_policy_lets_a_worker_register_exactly_its_own_node(
    own_cluster: LiveCluster, tmp_path: Path
) -> None:
    spec = _spec(tmp_path, own_cluster, {"pod-0": "server-1", "pod-1": "server-2"}, 1)
    with minted_workers(own_cluster, spec, list(PODS), tmp_path, "p", "locks/agentless/"):
        secret = Secret((tmp_path / "secrets" / "pod-0.token").read_text().strip())
        pod0 = own_cluster.client("server-1", secret)
        pod0.catalog.register_node("pod-0", "10.9.0.1")
        for call in (
            lambda: pod0.catalog.register_node("pod-1", "10.9.0.1"),
            lambda: pod0.catalog.deregister_node("pod-1"),
            lambda: pod0.catalog.register_node("server-1", "10.9.0.1"),
            lambda: pod0.session.create(name="x", ttl=10, lock_delay=0, node="pod-1", checks=()),
        ):
            with pytest.raises(PermissionDenied):
                call()
        made = pod0.session.create(name="x", ttl=10, lock_delay=0, node="pod-0", checks=())
        assert own_cluster.management().session.info(made).checks == ()  # type: ignore[union-attr]
        pod0.catalog.deregister_node("pod-0")  # its sessions end with it (measured)
        assert own_cluster.management().session.info(made, consistency="consistent") is None


def test_a_scheduler_without_an_agent_runs_ticks_on_ttl_only_sessions_and_leaves_on_sigterm(
    own_cluster: LiveCluster, tmp_path: Path
) -> None:
    spec = _spec(tmp_path, own_cluster, {"pod-0": "server-2"}, 1)
    management = own_cluster.management()
    with minted_workers(own_cluster, spec, ["pod-0"], tmp_path, "s", "locks/agentless/") as made:
        scheduler = _schedule(made, "pod-0", tmp_path)
        try:
            assert eventually(lambda: len([r for r in _runs(tmp_path) if r[0] == "end"]) >= 2, 60)
            node = management.catalog.node("pod-0")
            assert node is not None and node["Address"] == "10.9.0.1"
            sessions = management.session.list(node="pod-0")
            assert len(sessions) == 1 and sessions[0].checks == (), sessions
            info = management.session.info(sessions[0].id)
            assert info is not None and info.checks == () and info.ttl == "10s"
        finally:
            code = _stop(scheduler)
        assert code == 0, (tmp_path / "pod-0.log").read_text()
        log = (tmp_path / "pod-0.log").read_text()
        assert '"event":"node-deregistered"' in log and '"ttl_only":true' in log
        assert management.catalog.node("pod-0") is None
        assert management.session.list(node="pod-0") == []


def test_lockctl_run_without_an_agent_registers_its_node_and_holds_a_ttl_only_session(
    own_cluster: LiveCluster, tmp_path: Path
) -> None:
    spec = _spec(tmp_path, own_cluster, {"pod-1": "server-3"}, 1)
    management = own_cluster.management()
    seen = tmp_path / "session"
    # The job says its session, and runs until the test has looked at it.
    script = f'echo "$LOCK_SESSION" > {seen}; while [ ! -e {seen}.read ]; do sleep 0.1; done'
    with minted_workers(own_cluster, spec, ["pod-1"], tmp_path, "r", "locks/agentless/") as made:
        argv = [*LOCKCTL, "run", "--config", str(made.configs["pod-1"]), "--job", "report"]
        env = {**os.environ, "LOCKCTL_NODE_ADDRESS": "10.9.0.7"}
        # Just after a tick: the run takes the tick of its start, and claims it after its
        # imports and a read, well within the tick's 3 s window. Started at a random moment, a
        # slow start (over a second more: the agent's clock is read in whole seconds) found it
        # closed: missed, the job never ran.
        time.sleep(EVERY - time.time() % EVERY + 0.05)
        run = subprocess.Popen(
            [*argv, "--", "/bin/sh", "-c", script], env=env, stderr=subprocess.PIPE, text=True
        )
        try:
            assert eventually(lambda: seen.exists() and seen.read_text().strip(), 60)
            info = management.session.info(seen.read_text().strip())
            assert info is not None and info.node == "pod-1" and info.checks == ()
            node = management.catalog.node("pod-1")
            assert node is not None and node["Address"] == "10.9.0.7"
        finally:
            (tmp_path / "session.read").touch()
            _, err = run.communicate(timeout=60)
        assert run.returncode == 0, err
        assert management.session.list(node="pod-1") == []  # destroyed at the end
        # left registered: another run of this worker may hold a session on it right now
        assert management.catalog.node("pod-1") is not None
        management.catalog.deregister_node("pod-1")


def _voters(cluster: LiveCluster) -> int:
    """How many servers vote in Raft now. A server back from the dead is a non-voter until
    autopilot finds it stable (10 s by default; it had removed it when it failed): killing
    the leader before then leaves one voter of two, and no election."""
    try:
        answer = cluster.management().transport.request(
            Call("GET", "/v1/operator/raft/configuration"), IDEMPOTENT
        )
    except ConsulError:
        return 0
    return sum(1 for server in answer.body["Servers"] if server["Voter"])


def _session_info(consul: Consul, session: str) -> Session | str | None:
    """The session by a consistent read, or "no answer" (an election under way)."""
    try:
        return consul.session.info(session, consistency="consistent")
    except ConsulError:
        return "no answer"


@pytest.mark.parametrize("made_on", ["follower", "leader"])
def test_the_server_a_holder_s_session_was_made_on_is_killed(
    own_cluster: PodCluster, tmp_path: Path, made_on: str
) -> None:
    """The session is in Raft: it survives its server (a leader's death costs an election),
    but the holder reached Consul only through that server, so it cannot renew: its job is
    fenced on its own clock (dead before anyone could take over), the session ends at its TTL
    (lazily: up to 2 x TTL) and the other replica, on another server, runs the job after that
    plus LockDelay. Never both at once."""
    servers_count = len(own_cluster.layout.servers)
    assert eventually(lambda: _voters(own_cluster) == servers_count, 60), "a server does not vote"
    followers = _followers(own_cluster)
    leader = next(a.name for a in own_cluster.layout.servers if a.name not in followers)
    holder, other = PODS
    servers = {holder: leader if made_on == "leader" else followers[0], other: followers[-1]}
    marker = f"600.{uuid.uuid4().int % 10**9}"  # the job's sleep and shell carry it in argv
    spec = _spec(tmp_path, own_cluster, servers, marker)
    with minted_workers(
        own_cluster, spec, list(PODS), tmp_path, made_on, "locks/agentless/"
    ) as made:
        # the holder first, alone, so that it is the one on the server that is killed
        schedulers = {holder: _schedule(made, holder, tmp_path)}
        try:
            started = eventually(lambda: [r for r in _runs(tmp_path) if r[0] == "start"], 60)
            assert started and started[0][1] == holder, started
            schedulers[other] = _schedule(made, other, tmp_path)
            log = tmp_path / f"{other}.log"
            assert eventually(lambda: '"event":"skipped"' in log.read_text(), 60), log.read_text()
            victim = next(a for a in own_cluster.layout.servers if a.name == servers[holder])
            survivor = own_cluster.management(servers[other])
            session = survivor.session.list(node=holder)[0].id
            pid = read_pid(own_cluster.layout.pidfile(victim))
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            killed_at = time.monotonic()
            # Raft kept it: the other servers still know the session the dead one made
            kept = eventually(lambda: isinstance(_session_info(survivor, session), Session), 15)
            assert kept, _session_info(survivor, session)
            # fenced on its own clock: SIGTERM at D - G - margin, SIGKILL at D - margin
            assert eventually(lambda: not pids_with(marker), 30), pids_with(marker)
            fenced_after, tree_dead_at = time.monotonic() - killed_at, time.time()
            assert fenced_after <= LOCK_DELAY + 3, fenced_after
            # nobody renews it: it ends at TTL expiry, lazily (up to 2 x TTL; a new leader
            # starts the TTL of every session afresh)
            gone = eventually(lambda: _session_info(survivor, session) is None, 2 * TTL + 20)
            assert gone, "the session outlived 2 x TTL"
            gone_after = time.monotonic() - killed_at
            taken = eventually(
                lambda: [r for r in _runs(tmp_path) if r[:2] == ["start", other]], 60
            )
            assert taken, f"{other} never ran the job after the kill"
        finally:
            codes = {pod: _stop(process) for pod, process in schedulers.items()}
            cluster_up(own_cluster.state_dir)  # the killed server back, for the next test
        runs = _runs(tmp_path)
        print(f"{made_on}: fenced {fenced_after:.1f}s, session gone {gone_after:.1f}s after")
        ended = [float(r[3]) for r in runs if r[:2] == ["end", holder]]
        took_over = float(taken[0][4])
        # the holder's job ended (its trap on the fencing SIGTERM), and its whole tree was
        # gone, before the other replica's job started
        assert ended and ended[0] < took_over and tree_dead_at < took_over, runs
        print(f"{other} started {took_over - tree_dead_at:.1f}s after the tree was gone")
        assert codes[other] == 0 and codes[holder] == 0, codes
        text = (tmp_path / f"{holder}.log").read_text()
        assert '"event":"lost"' in text or '"event":"fenced"' in text
