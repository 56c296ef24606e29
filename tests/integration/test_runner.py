"""`lockctl run` and `lockctl status` on the real cluster, as subprocesses (real signals, real
process groups): one holder per tick, hand-over, env, SIGTERM, fencing, permissions, min-hold,
no orphans, PDEATHSIG.

A module fixture renders the policies of a small spec whose workers are the cluster's worker-1
and worker-2, creates them (names suffixed with a uuid), mints one token per worker and writes the
worker configs. Each test has its own job (its own lock key), so tests are independent.
Processes the jobs start carry a unique marker in their argv (`sleep 300.<digits>`); they are
found by scanning /proc and, if a test fails, stopped by pid.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from procscan import pids_with
from workers_lab import minted_workers

from provision.consul import Consul
from provision.errors import EXIT_DENIED, EXIT_INPUT, EXIT_LOCK_LOST, EXIT_WAIT_TIMEOUT
from tests.lockctl_process import LOCKCTL, run_lockctl, wait_until

if TYPE_CHECKING:
    from conftest import LiveCluster


WORKERS = ("worker-1", "worker-2")
LOCK_DELAY = 4.0  # the fencing bound: 4s > renew 1s + kill grace 1s + 1s margin
KILL_GRACE = 1.0
JOBS = (
    "two",
    "handover",
    "env",
    "sigterm",
    "ignore-term",
    "destroyed",
    "released",
    "timeout",
    "min-hold",
    "pg-normal",
    "pg-fenced",
    "pg-term",
    "kill9",
    "status",
    "unsafe",
    "denied",
    "anytime",
    "stderr-full",
    "stderr-closed",
    "hide-normal",
    "hide-fenced",
    "hide-term",
    "hide-kill9",
    "no-unshare",
)
WAIT = 20.0  # the longest any single subprocess wait may take


@dataclass(frozen=True)
class Lab:
    tmp: Path
    spec_path: Path
    configs: dict[str, Path]  # worker -> its lockctl.json
    jobs: dict[str, str]  # short name -> job name
    keys: dict[str, str]  # short name -> lock key
    secrets: tuple[str, ...]  # every token secret minted here: must never be printed
    session_only_token: Path  # worker-1's session policy only: no key rights
    management_token_file: Path
    cluster: LiveCluster

    def management(self, agent: str = "server-1") -> Consul:
        return self.cluster.management(agent)


def _spec_text(cluster: LiveCluster, uid: str) -> str:
    lines = [
        "defaults {",
        '  ttl            = "10s"',
        f'  lock_delay     = "{LOCK_DELAY:g}s"',
        '  renew_interval = "1s"',
        f'  kill_grace     = "{KILL_GRACE:g}s"',
        "}",
    ]
    for worker in WORKERS:
        lines += [f'worker "{worker}" {{', f'  address = "{cluster.address(worker)}"', "}"]
    for short in JOBS:
        lines += [
            f'job "{short}-{uid}" {{',
            f'  prefix  = "test/runner-{uid}/{short}/"',
            '  workers = ["worker-1", "worker-2"]',
            "}",
        ]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("runner")
    uid = uuid.uuid4().hex[:8]
    spec_path = tmp / "locks.hcl"
    spec_path.write_text(_spec_text(live_cluster, uid))
    kv = f"test/runner-{uid}/"
    with minted_workers(live_cluster, spec_path, WORKERS, tmp, uid, kv) as made:
        session_only = tmp / "session-only" / "worker-1.token"
        made.mint("session only", ["session-worker-1"], session_only)
        yield Lab(
            tmp=tmp,
            spec_path=spec_path,
            configs=made.configs,
            jobs={short: f"{short}-{uid}" for short in JOBS},
            keys={short: f"{kv}{short}/.lock" for short in JOBS},
            secrets=tuple(made.secrets),
            session_only_token=session_only,
            management_token_file=live_cluster.layout.management_token_file,
            cluster=live_cluster,
        )


# --- processes ----------------------------------------------------------------------------------


class Runner:
    """One `lockctl run` subprocess; its stderr lines are collected as they come."""

    def __init__(
        self,
        lab: Lab,
        worker: str,
        short: str,
        command: list[str],
        *flags: str,
        config: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        argv = [*LOCKCTL, "run", "--config", str(config or lab.configs[worker])]
        argv += ["--job", lab.jobs[short], *flags, "--", *command]
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self.pid = self.process.pid
        self.lines: list[str] = []
        self.stdout: list[str] = []
        self.ended: float | None = None
        self._changed = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read, args=(stream, into), daemon=True)
            for stream, into in (
                (self.process.stderr, self.lines),
                (self.process.stdout, self.stdout),
            )
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: Any, into: list[str]) -> None:
        for line in stream:
            with self._changed:
                into.append(line.rstrip("\n"))
                self._changed.notify_all()

    def events(self) -> list[dict[str, Any]]:
        with self._changed:
            lines = list(self.lines)
        return [json.loads(line) for line in lines if line.startswith("{")]

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events() if e["event"] == name]

    def wait_event(self, name: str, timeout: float = WAIT) -> dict[str, Any]:
        give_up_at = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines:
                    if line.startswith("{") and json.loads(line)["event"] == name:
                        return dict(json.loads(line))
                left = give_up_at - time.monotonic()
                if left <= 0 or (self.process.poll() is not None and not self._alive_readers()):
                    raise AssertionError(f"no {name!r} event; stderr: {self.lines}")
                self._changed.wait(min(left, 0.1))

    def _alive_readers(self) -> bool:
        return any(reader.is_alive() for reader in self._readers)

    def wait(self, timeout: float = WAIT) -> int:
        code = self.process.wait(timeout)
        self.ended = time.monotonic()
        for reader in self._readers:
            reader.join(2.0)  # an orphan holding the pipe open would keep it alive
        if not self._alive_readers():
            assert self.process.stdout is not None and self.process.stderr is not None
            self.process.stdout.close()
            self.process.stderr.close()
        return code

    def stop_if_running(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.wait()


@pytest.fixture
def runners() -> Iterator[list[Runner]]:
    """Runners a test started; any still running at the end are killed (by pid)."""
    started: list[Runner] = []
    yield started
    for runner in started:
        runner.stop_if_running()


@pytest.fixture
def marker() -> Iterator[str]:
    """A unique `sleep` argument; any process still carrying it at the end is killed by pid."""
    mark = f"300.{uuid.uuid4().int % 10**9:09d}"
    yield mark
    for pid in pids_with(mark):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def start(
    lab: Lab, runners: list[Runner], worker: str, short: str, *args: Any, **kw: Any
) -> Runner:
    runner = Runner(lab, worker, short, *args, **kw)
    runners.append(runner)
    return runner


def lockctl(*args: str, timeout: float = WAIT, **env: str) -> subprocess.CompletedProcess[str]:
    return run_lockctl(*args, env=env, timeout=timeout)


def timestamp_into(path: Path) -> str:
    return f"date +%s.%N > {path}"


def read_float(path: Path) -> float:
    return float(path.read_text().strip())


def probe_acquire(lab: Lab, key: str) -> bool:
    """Can another session (management token, through worker-2, LockDelay 0) acquire at once?"""
    consul = lab.management("worker-2")
    session = consul.session.create(name="probe", ttl=10, lock_delay=0)
    try:
        acquired = consul.kv.put(key, b"probe", acquire=session)
        if acquired:
            consul.kv.put(key, release=session)
        return acquired
    finally:
        consul.session.destroy(session)


# --- one holder per tick --------------------------------------------------------------------


def test_two_runners_at_once_one_runs_the_other_skips(lab: Lab, runners: list[Runner]) -> None:
    ran = lab.tmp / "two.ran"
    command = ["sh", "-c", f'echo "$LOCKCTL_WORKER" >> {ran}; sleep 1']
    for round_ in range(3):
        pair = [start(lab, runners, w, "two", command) for w in WORKERS]
        codes = [runner.wait() for runner in pair]
        assert codes == [0, 0], [r.lines for r in pair]
        outcomes = sorted(
            "skipped" if r.named("skipped") else "ran" if r.named("acquired") else "?" for r in pair
        )
        assert outcomes == ["ran", "skipped"], [r.lines for r in pair]
        lines = ran.read_text().split()
        assert len(lines) == round_ + 1  # exactly one child per round
        holder = next(r for r in pair if r.named("acquired"))
        assert holder.named("released")[0]["released"] is True
        skipper = next(r for r in pair if r.named("skipped"))
        (skipped,) = skipper.named("skipped")
        holder_worker = holder.named("acquired")[0]["worker"]
        # A worker's token may not read the other worker's session: the claim stays unverified.
        claim = f"its record claims worker {holder_worker} (unverified)"
        assert skipped["reason"] == f"held by another session; {claim}"
        assert skipped["holder_claims"] == holder_worker
        assert skipped["holder"] == holder.named("acquired")[0]["session"]


def test_release_hands_over_at_once_to_a_waiting_runner(lab: Lab, runners: list[Runner]) -> None:
    go, end, began, index = (lab.tmp / f"handover.{n}" for n in ("go", "end", "began", "index"))
    wait_for_go = f"while [ ! -e {go} ]; do sleep 0.01; done"
    holder_command = ["sh", "-c", f"{wait_for_go}; {timestamp_into(end)}"]
    holder = start(lab, runners, "worker-1", "handover", holder_command)
    first = holder.wait_event("acquired")
    waiter_command = ["sh", "-c", f'{timestamp_into(began)}; echo "$LOCK_INDEX" > {index}']
    waiter = start(lab, runners, "worker-2", "handover", waiter_command, "--wait", "--timeout=20s")
    waiter.wait_event("waiting")
    go.touch()
    assert holder.wait() == 0
    assert waiter.wait() == 0, waiter.lines
    handover = read_float(began) - read_float(end)
    assert 0 < handover < 1.0, f"hand-over took {handover:.3f} s"
    second = waiter.named("acquired")[0]
    assert second["lock_index"] > first["lock_index"]
    assert int(index.read_text()) == second["lock_index"]


def test_child_sees_the_lock_in_its_environment(lab: Lab, runners: list[Runner]) -> None:
    env_file, go = lab.tmp / "env.out", lab.tmp / "env.go"
    command = ["sh", "-c", f"env > {env_file}; while [ ! -e {go} ]; do sleep 0.01; done"]
    # lockctl's own credentials in the runner's environment never reach the job
    own = {"CONSUL_HTTP_TOKEN": "runner-only-token", "CONSUL_HTTP_TOKEN_FILE": "/runner/only"}
    runner = start(lab, runners, "worker-1", "env", command, env={**os.environ, **own})
    acquired = runner.wait_event("acquired")
    assert wait_until(lambda: env_file.exists() and env_file.stat().st_size > 0, 10)
    time.sleep(0.1)  # env has opened the file; let it finish writing
    entry, _ = lab.management().kv.get(lab.keys["env"], consistency="consistent")
    go.touch()
    assert runner.wait() == 0
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    assert env["LOCK_KEY"] == lab.keys["env"]
    assert env["LOCK_SESSION"] == acquired["session"]
    assert entry is not None and entry.session == acquired["session"]
    assert int(env["LOCK_INDEX"]) == acquired["lock_index"] == entry.lock_index
    assert int(env["LOCK_MODIFY_INDEX"]) == entry.modify_index
    assert not set(own) & set(env)
    # LockIndex is the fencing token: it grows with every acquire.
    again = start(lab, runners, "worker-2", "env", ["sh", "-c", 'test "$LOCK_INDEX" -gt 0'])
    assert again.wait() == 0
    assert again.named("acquired")[0]["lock_index"] > acquired["lock_index"]


# --- stopping the child -----------------------------------------------------------------------


def test_sigterm_to_the_runner_stops_the_child_and_releases(
    lab: Lab, runners: list[Runner], marker: str
) -> None:
    runner = start(lab, runners, "worker-1", "sigterm", ["sleep", marker])
    runner.wait_event("acquired")
    assert wait_until(lambda: pids_with(marker), 5)
    runner.process.send_signal(signal.SIGTERM)
    assert runner.wait() == 128 + signal.SIGTERM
    assert runner.ended is not None
    assert not pids_with(marker)
    released = runner.named("released")[0]
    assert released["released"] is True
    assert probe_acquire(lab, lab.keys["sigterm"])  # at once: no lock-delay after a release


# Delays after the `acquired` event at which the runner gets SIGTERM: while the job (0.2 s) runs,
# as it ends, during the release and the session's destroy.
SIGTERM_DELAYS = [0.025 * n for n in range(0, 16)]


def test_sigterm_at_any_moment_leaves_no_traceback_and_no_session(
    lab: Lab, runners: list[Runner]
) -> None:
    codes = set()
    for delay in SIGTERM_DELAYS:
        runner = start(lab, runners, "worker-1", "anytime", ["sh", "-c", "sleep 0.2 & wait"])
        runner.wait_event("acquired")
        time.sleep(delay)
        runner.process.send_signal(signal.SIGTERM)
        code = runner.wait()
        assert not any("Traceback" in line for line in runner.lines), runner.lines
        # stopped by the signal (143), or done before it came (0)
        assert code in {128 + signal.SIGTERM, 0}, (delay, code, runner.lines)
        assert runner.named("released") or runner.named("lost"), runner.lines
        codes.add(code)
    assert 128 + signal.SIGTERM in codes  # the sweep did reach a running job
    name = f"lockctl {lab.jobs['anytime']} on worker-1"
    assert [s for s in lab.management().session.list(node="worker-1") if s.name == name] == []


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(
    lab: Lab, runners: list[Runner], marker: str
) -> None:
    command = ["sh", "-c", f"trap '' TERM; sleep {marker}"]
    runner = start(lab, runners, "worker-1", "ignore-term", command)
    runner.wait_event("acquired")
    assert wait_until(lambda: pids_with(marker), 5)
    signalled = time.monotonic()
    runner.process.send_signal(signal.SIGTERM)
    assert runner.wait() == 128 + signal.SIGKILL
    assert runner.ended is not None
    took = runner.ended - signalled
    assert KILL_GRACE - 0.1 <= took < KILL_GRACE + 2.0, took
    assert not pids_with(marker)
    assert probe_acquire(lab, lab.keys["ignore-term"])


@pytest.mark.parametrize("how", ["destroyed", "released"])
def test_a_lock_taken_away_fences_the_child(
    lab: Lab, runners: list[Runner], marker: str, how: str
) -> None:
    runner = start(lab, runners, "worker-1", how, ["sleep", marker])
    acquired = runner.wait_event("acquired")
    assert wait_until(lambda: pids_with(marker), 5)
    management = lab.management()
    taken = time.monotonic()
    if how == "destroyed":
        management.session.destroy(acquired["session"])
    else:
        assert management.kv.put(lab.keys[how], release=acquired["session"])
    assert runner.wait() == EXIT_LOCK_LOST
    assert runner.ended is not None
    # Another session could acquire at `taken` + LockDelay (or at once after a release): the
    # child must be dead well before that; the watch sees the loss at once.
    assert runner.ended - taken < 1.5, runner.ended - taken
    assert not pids_with(marker)
    fenced = runner.named("fenced")
    assert len(fenced) == 1 and fenced[0]["session"] == acquired["session"]
    assert runner.named("lost") and not runner.named("released")


def test_wait_timeout_runs_out_and_a_healthy_lock_is_not_fenced(
    lab: Lab, runners: list[Runner]
) -> None:
    # The holder's child outlives the fencing delay (D - G - margin = 2 s) several times over:
    # only the renewals keep it running.
    holder = start(lab, runners, "worker-1", "timeout", ["sleep", "4.5"])
    holder.wait_event("acquired")
    waiter = start(
        lab, runners, "worker-2", "timeout", ["touch", str(lab.tmp / "timeout.ran")],
        "--wait", "--timeout", "1500ms",
    )  # fmt: skip
    assert waiter.wait() == EXIT_WAIT_TIMEOUT
    assert waiter.ended is not None
    assert 1.5 <= waiter.ended - waiter.started < 5.0
    assert (
        waiter.named("gave-up")
        and not waiter.named("timed-out")
        and not (lab.tmp / "timeout.ran").exists()
    )
    assert holder.wait() == 0, holder.lines
    assert len(holder.named("renewed")) >= 3 and not holder.named("fenced")


def test_min_hold_keeps_the_lock_after_the_child_exits(lab: Lab, runners: list[Runner]) -> None:
    done, skipped_ran = lab.tmp / "min-hold.done", lab.tmp / "min-hold.other"
    holder = start(lab, runners, "worker-1", "min-hold", ["touch", str(done)], "--min-hold", "3s")
    holder.wait_event("acquired")
    assert wait_until(done.exists, 10)
    other = start(lab, runners, "worker-2", "min-hold", ["touch", str(skipped_ran)])
    assert other.wait() == 0
    assert other.named("skipped") and not skipped_ran.exists()
    assert holder.wait() == 0
    held = holder.named("released")[0]["held_ms"]
    assert 3000 <= held < 6000, held
    after = start(lab, runners, "worker-2", "min-hold", ["touch", str(skipped_ran)])
    assert after.wait() == 0 and skipped_ran.exists()


# --- no orphans -------------------------------------------------------------------------------


def _family(marker: str) -> list[str]:
    """A script with a background child, a grandchild in a new session, and a double fork."""
    return [
        "sh",
        "-c",
        f"sleep {marker} & setsid sleep {marker} & (setsid sleep {marker} &); sleep 0.3; "
        '[ "$1" = exit ] && exit 0; wait',
        "family",
    ]


@pytest.mark.parametrize("ending", ["normal", "fenced", "term"])
def test_no_process_of_the_job_outlives_the_runner(
    lab: Lab, runners: list[Runner], marker: str, ending: str
) -> None:
    command = _family(marker) + (["exit"] if ending == "normal" else [])
    short = {"normal": "pg-normal", "fenced": "pg-fenced", "term": "pg-term"}[ending]
    runner = start(lab, runners, "worker-1", short, command)
    acquired = runner.wait_event("acquired")
    assert wait_until(lambda: len(pids_with(marker)) == 3, 5), pids_with(marker)
    if ending == "fenced":
        lab.management().session.destroy(acquired["session"])
    elif ending == "term":
        runner.process.send_signal(signal.SIGTERM)
    code = runner.wait()
    expected = {"normal": 0, "fenced": EXIT_LOCK_LOST, "term": 128 + signal.SIGTERM}[ending]
    assert code == expected, runner.lines
    assert not pids_with(marker)


def _hiding_family(marker: str) -> list[str]:
    """A script whose processes do all they can to outlive it: a background child, a daemon in
    a session of its own that ignores SIGTERM and SIGHUP and has a child, and a double fork."""
    daemon = f"trap '' TERM HUP; sleep {marker} & wait"
    return [
        "sh",
        "-c",
        f'sleep {marker} & setsid sh -c "{daemon}" & (setsid sleep {marker} &); sleep 1; '
        '[ "$1" = exit ] && exit 0; wait',
        "family",
    ]


@pytest.mark.parametrize("ending", ["normal", "fenced", "term", "kill9"])
def test_no_process_of_a_hiding_job_survives(
    lab: Lab, runners: list[Runner], marker: str, ending: str
) -> None:
    """Whatever the job's processes do with sessions, forks and signals, none is alive after the
    job's end, after the lock is lost, after SIGTERM to the runner, and about a second after
    the runner itself is SIGKILLed: they live in the job's own PID namespace."""
    command = _hiding_family(marker) + (["exit"] if ending == "normal" else [])
    runner = start(lab, runners, "worker-1", f"hide-{ending}", command)
    acquired = runner.wait_event("acquired")
    assert acquired["containment"] == "pid-namespace"
    assert wait_until(lambda: len(pids_with(marker)) == 3, 5), pids_with(marker)  # 3 sleeps
    ended_at = time.monotonic()
    if ending == "fenced":
        lab.management().session.destroy(acquired["session"])
    elif ending == "term":
        runner.process.send_signal(signal.SIGTERM)
    elif ending == "kill9":
        runner.process.kill()
    code = runner.wait()
    expected = {"normal": 0, "fenced": EXIT_LOCK_LOST, "term": 143, "kill9": -9}[ending]
    assert code == expected, runner.lines
    assert wait_until(lambda: not pids_with(marker), 1.0), pids_with(marker)
    assert time.monotonic() - ended_at < KILL_GRACE + 2.0
    if ending == "kill9":
        lab.management().session.destroy(acquired["session"])


def test_without_pid_namespaces_the_runner_says_so_and_still_contains_its_group(
    lab: Lab, runners: list[Runner], marker: str
) -> None:
    """Where unshare is refused (a container without CAP_SYS_ADMIN), the job runs in a process
    group: the run says so in a `containment` event, and the group and its orphans still stop."""
    fake = lab.tmp / "refusing-bin"
    fake.mkdir(exist_ok=True)
    (fake / "unshare").write_text(
        "#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n"
    )
    (fake / "unshare").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    argv = [*LOCKCTL, "run", "--config", str(lab.configs["worker-1"]), "--job"]
    argv += [lab.jobs["no-unshare"], "--", *_family(marker), "exit"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=WAIT)
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    warning = next(e for e in events if e["event"] == "containment")
    assert warning["mode"] == "process-group" and "no PID namespace" in warning["warning"]
    # unshare's words are the reason, not a line of the job's output
    assert "(unshare: unshare failed: Operation not permitted)" in warning["warning"], warning
    assert not [line for line in done.stderr.splitlines() if line.startswith("unshare:")]
    assert next(e for e in events if e["event"] == "acquired")["containment"] == "process-group"
    assert wait_until(lambda: not pids_with(marker), 2.0), pids_with(marker)


def test_kill_9_of_the_runner_kills_its_child(lab: Lab, runners: list[Runner], marker: str) -> None:
    runner = start(lab, runners, "worker-1", "kill9", ["sleep", marker])
    acquired = runner.wait_event("acquired")
    assert wait_until(lambda: pids_with(marker), 5)
    runner.process.kill()
    runner.wait()
    assert wait_until(lambda: not pids_with(marker), 2), "PDEATHSIG did not reach the child"
    lab.management().session.destroy(acquired["session"])


# --- refusals -----------------------------------------------------------------------------------


def _config_with(lab: Lab, name: str, token_file: Path | None = None, **timings: str) -> Path:
    """worker-1's config with another token file, or other timings for job "unsafe"."""
    config = json.loads(lab.configs["worker-1"].read_text())
    if token_file is not None:
        config["consul"]["token_file"] = str(token_file)
    config["jobs"][lab.jobs["unsafe"]].update(timings)
    path = lab.tmp / name
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("who", ["session-only token", "worker-2 token on worker-1"])
def test_a_token_without_rights_is_denied_in_one_line(
    lab: Lab, runners: list[Runner], who: str
) -> None:
    token = lab.session_only_token if who == "session-only token" else None
    if token is None:
        token = Path(json.loads(lab.configs["worker-2"].read_text())["consul"]["token_file"])
    config = _config_with(lab, f"denied-{who.split()[0]}.json", token)
    ran = lab.tmp / "denied.ran"
    runner = start(lab, runners, "worker-1", "denied", ["touch", str(ran)], config=config)
    assert runner.wait() == EXIT_DENIED
    assert len(runner.lines) == 1 and runner.lines[0].startswith("lockctl: error: "), runner.lines
    assert "Traceback" not in "".join(runner.lines)
    output = "\n".join(runner.lines + runner.stdout)
    assert not any(secret in output for secret in lab.secrets)
    assert not ran.exists()


def test_a_command_that_cannot_start_is_refused_before_locking(
    lab: Lab, runners: list[Runner]
) -> None:
    runner = start(lab, runners, "worker-1", "two", ["/nonexistent/lockctl-test-job"])
    assert runner.wait() == EXIT_INPUT
    assert runner.lines == [
        "lockctl: error: cannot start '/nonexistent/lockctl-test-job': not found or not executable"
    ]


def test_a_config_that_breaks_the_fencing_bound_is_refused(lab: Lab, runners: list[Runner]) -> None:
    config = _config_with(lab, "unsafe.json", lock_delay="2s")
    ran = lab.tmp / "unsafe.ran"
    refused = start(lab, runners, "worker-1", "unsafe", ["touch", str(ran)], config=config)
    assert refused.wait() == EXIT_INPUT
    assert len(refused.lines) == 1, refused.lines
    assert refused.lines[0].startswith(f"lockctl: error: {config}: jobs.")
    assert "lock_delay" in refused.lines[0] and "--allow-unsafe" in refused.lines[0]
    assert not ran.exists()
    forced = start(
        lab, runners, "worker-1", "unsafe", ["touch", str(ran)], "--allow-unsafe", config=config
    )
    assert forced.wait() == 0 and ran.exists()


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", ":1: not a JSON worker config"),
        ('{"format": 1, "extra": true}', ": extra: unknown field"),
        ("bad-duration", ": jobs.{job}.ttl: 'ten seconds' is not a duration"),
    ],
)
def test_a_bad_config_file_is_refused_with_its_file_and_field(
    lab: Lab, content: str, expected: str
) -> None:
    path = lab.tmp / f"bad-{uuid.uuid4().hex[:6]}.json"
    job = lab.jobs["unsafe"]
    if content == "bad-duration":
        config = json.loads(lab.configs["worker-1"].read_text())
        config["jobs"][job]["ttl"] = "ten seconds"
        content = json.dumps(config)
    path.write_text(content)
    result = lockctl("run", "--config", str(path), "--job", job, "--", "true")
    assert result.returncode == EXIT_INPUT, result.stderr
    assert "Traceback" not in result.stderr
    assert f"{path}{expected.format(job=job)}" in result.stderr, result.stderr
    assert result.stderr.splitlines()[-1].startswith(f"lockctl: error: {path}")


# --- a broken stderr ---------------------------------------------------------------------------


def _run_with_stderr(lab: Lab, short: str, stderr: Any, seconds: float) -> int:
    argv = [*LOCKCTL, "run", "--config", str(lab.configs["worker-1"]), "--job", lab.jobs[short]]
    argv += ["--", "sh", "-c", f"sleep {seconds}; exit 7"]
    return subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=stderr, timeout=WAIT).returncode


@pytest.mark.parametrize("broken", ["full", "closed"])
def test_a_broken_stderr_does_not_break_the_lock(lab: Lab, broken: str) -> None:
    """Events fail to write (a full disk, a reader gone) while renewals go on every second: the
    job runs to its end, its exit status stands, and the lock is released, not fenced."""
    short = f"stderr-{broken}"
    if broken == "full":
        with open("/dev/full", "w") as full:
            code = _run_with_stderr(lab, short, full, 3.5)
    else:
        read_end, write_end = os.pipe()
        os.close(read_end)  # the reader is gone before the first event
        try:
            code = _run_with_stderr(lab, short, write_end, 3.5)
        finally:
            os.close(write_end)
    assert code == 7  # the job's own status: no fencing (76), no crash (1), no 120
    assert probe_acquire(lab, lab.keys[short])  # released, not left to expire


# --- status -------------------------------------------------------------------------------------


def test_status_shows_the_holder(lab: Lab, runners: list[Runner], marker: str) -> None:
    runner = start(lab, runners, "worker-1", "status", ["sleep", marker])
    acquired = runner.wait_event("acquired")
    flags = ["--spec", str(lab.spec_path), "--address", lab.cluster.address("server-1")]
    flags += ["--token-file", str(lab.management_token_file)]
    as_json = lockctl("status", *flags, "--json")
    assert as_json.returncode == 0, as_json.stderr
    states = {state["job"]: state for state in json.loads(as_json.stdout)}
    mine = states[lab.jobs["status"]]
    assert mine["held"] is True
    assert mine["claims"]["worker"] == "worker-1" and mine["node"] == "worker-1"
    assert mine["claim_matches_node"] is True
    assert mine["session"] == acquired["session"]
    assert mine["lock_index"] == acquired["lock_index"]
    assert mine["key"] == lab.keys["status"]
    assert states[lab.jobs["unsafe"]]["held"] is False
    table = lockctl("status", *flags)
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if lab.jobs["status"][:8] in line)
    # In a pipe the table is 160 wide: a long cell wraps within its column, never cut short.
    assert "worker-1" in row and acquired["session"][:8] in row, table.stdout
    assert "…" not in table.stdout
    runner.process.send_signal(signal.SIGTERM)
    assert runner.wait() == 128 + signal.SIGTERM
    after = json.loads(lockctl("status", *flags, "--json").stdout)
    assert not next(s for s in after if s["job"] == lab.jobs["status"])["held"]
