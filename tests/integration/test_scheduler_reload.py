"""Reload and rotate are safe to do any time (issue 25, item 5), on the real TLS cluster, with
one `lockctl schedule` on worker-1 (and one `lockctl run`):

- a token Consul refuses (403) is `tick-failed` with Consul's reason, not `consul-unavailable`;
- SIGHUP with a config whose token file or CA file is missing or empty is `reload-refused`
  naming it, and the old loops go on untouched (it used to say `reloaded`, then exit 2);
- SIGHUP replaces only the loops that changed: a short job keeps ticking while a long one runs
  through the reload, a job added starts at its next tick, a removed one ends with its run;
- a rotated token (the new one written, the old one deleted, as `lockctl rotate` does) is picked
  up by a running scheduler and a running `lockctl run`, and fences neither's job.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from scheduler_lab import SchedulerProcess
from workers_lab import MintedWorkers, minted_workers, spec_text

from provision.consul import PermissionDenied
from provision.spec.names import token_description
from provision.system.secrets import Secret
from tests.lockctl_process import LOCKCTL, eventually, run_lockctl

if TYPE_CHECKING:
    from conftest import LiveCluster

pytestmark = pytest.mark.cluster

WORKER = "worker-1"
EVERY = 2
LONG = 12  # seconds of the long job: several of the short job's ticks
WAIT = 30.0


@dataclass(frozen=True)
class Lab:
    tmp: Path
    made: MintedWorkers
    uid: str
    cluster: LiveCluster

    @property
    def config(self) -> dict[str, Any]:
        return dict(json.loads(self.made.configs[WORKER].read_text()))

    def job(self, short: str) -> str:
        return f"{short}-{self.uid}"

    def log(self, short: str) -> Path:
        return self.tmp / f"{short}.log"

    def write_config(self, name: str, jobs: list[str], **consul: str) -> Path:
        """A copy of worker-1's config with only these jobs (short names), `consul` changed."""
        raw = self.config
        raw["jobs"] = {self.job(s): raw["jobs"][self.job(s)] for s in jobs}
        raw["consul"].update(consul)
        path = self.tmp / f"{name}.json"
        path.write_text(json.dumps(raw))
        return path


def _command(log: Path, body: str) -> str:
    line = 'echo "$LOCKCTL_TICK $(date +%s.%N)'
    return json.dumps(["/bin/sh", "-c", f'{line} start" >> {log}; {body}; {line} end" >> {log}'])


def _jobs(tmp: Path, uid: str) -> dict[str, dict[str, str]]:
    wait = "for i in $(seq 600); do [ -e {} ] && break; sleep 0.1; done"  # at most 60 s
    bodies = {
        "quick": "sleep 0.1",
        "added": "sleep 0.1",
        "long": wait.format(tmp / "long.go"),  # runs until the test lets it end
    }
    return {
        f"{short}-{uid}": {
            "prefix": f'"test/reload-{uid}/{short}/"',
            "schedule": f'"@every {EVERY}s"',
            "command": _command(tmp / f"{short}.log", body),
        }
        for short, body in bodies.items()
    }


@pytest.fixture(scope="module")
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("reload")
    uid = uuid.uuid4().hex[:8]
    spec_path = tmp / "locks.hcl"
    spec_path.write_text(spec_text(live_cluster, [WORKER], _jobs(tmp, uid)))
    with minted_workers(live_cluster, spec_path, [WORKER], tmp, uid, f"test/reload-{uid}/") as made:
        yield Lab(tmp, made, uid, live_cluster)


@pytest.fixture
def started() -> Iterator[list[SchedulerProcess]]:
    running: list[SchedulerProcess] = []
    yield running
    for scheduler in running:
        scheduler.kill()


def _ran(scheduler: SchedulerProcess, job: str) -> list[dict[str, Any]]:
    return [e for e in scheduler.events("released") if e.get("job") == job]


def _no_traceback(scheduler: SchedulerProcess) -> None:
    assert not any("Traceback" in line for line in scheduler.lines), scheduler.lines


def test_a_token_consul_refuses_is_tick_failed_not_consul_unavailable(
    lab: Lab, started: list[SchedulerProcess]
) -> None:
    unknown = lab.tmp / "unknown.token"
    unknown.write_text(f"{uuid.uuid4()}\n")  # shaped like a secret; Consul knows no such token
    unknown.chmod(0o600)
    config = lab.write_config("refused", ["quick"], token_file=str(unknown))
    scheduler = SchedulerProcess(config)
    started.append(scheduler)
    failed = eventually(lambda: scheduler.events("tick-failed"))
    assert failed, scheduler.lines
    assert failed[0]["error"].startswith("Consul refused the token: consul: "), failed
    assert "403" in failed[0]["error"], failed
    assert not scheduler.events("consul-unavailable"), scheduler.lines
    assert unknown.read_text().strip() not in "\n".join(scheduler.lines)
    assert scheduler.stop() == 0
    _no_traceback(scheduler)


@pytest.mark.parametrize("broken", ["token-missing", "token-empty", "ca-missing"])
def test_sighup_with_a_config_whose_files_cannot_work_is_refused_and_the_old_loops_go_on(
    lab: Lab, started: list[SchedulerProcess], broken: str
) -> None:
    config = lab.write_config(f"files-{broken}", ["quick"])
    good = config.read_text()
    scheduler = SchedulerProcess(config)
    started.append(scheduler)
    assert eventually(lambda: _ran(scheduler, lab.job("quick"))), scheduler.lines
    bad_file = lab.tmp / f"{broken}.file"
    bad_file.unlink(missing_ok=True)
    if broken == "token-empty":
        bad_file.write_text("")
    key = "ca_file" if broken.startswith("ca") else "token_file"
    raw = json.loads(good)
    raw["consul"][key] = str(bad_file)
    config.write_text(json.dumps(raw))
    scheduler.process.send_signal(signal.SIGHUP)
    refused = eventually(lambda: scheduler.events("reload-refused"))
    assert refused and str(bad_file) in refused[0]["error"], scheduler.lines
    print("\n" + next(line for line in scheduler.lines if "reload-refused" in line))  # for docs
    assert f"{config}: consul.{key}" in refused[0]["error"], refused  # the key named
    ran_before = len(_ran(scheduler, lab.job("quick")))
    # the old loop goes on: two more ticks, its session kept, nothing reloaded, no exit
    assert eventually(lambda: len(_ran(scheduler, lab.job("quick"))) >= ran_before + 2)
    assert scheduler.process.poll() is None, scheduler.lines
    assert not scheduler.events("reloaded") and not scheduler.events("session-destroyed")
    assert len(scheduler.events("session-created")) == 1, scheduler.lines
    assert scheduler.stop() == 0
    _no_traceback(scheduler)


def _starts(log: Path, after: float) -> list[float]:
    """When each run of the job's own log started, from `after` on (Unix time)."""
    lines = log.read_text().splitlines() if log.exists() else []
    times = [float(ln.split()[1]) for ln in lines if ln.endswith(" start")]
    return [t for t in times if t >= after]


def _at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["time"]).timestamp()


def test_sighup_changes_only_the_loops_it_changed_and_waits_for_no_long_run(
    lab: Lab, started: list[SchedulerProcess]
) -> None:
    """A long job runs through two reloads: the first adds a job and keeps the others (the
    short job keeps ticking, the new one starts, nothing waits for the long run); the second
    removes the long job and points the connection at a copy of the CA (a new connection):
    the short job goes on at once on a new session, the long run ends under its old one, which
    is destroyed only then; the long job runs no more."""
    marker = lab.tmp / "long.go"
    marker.unlink(missing_ok=True)
    config = lab.write_config("loops", ["quick", "long"])
    scheduler = SchedulerProcess(config)
    started.append(scheduler)
    long_job, quick, added = lab.job("long"), lab.job("quick"), lab.job("added")
    running = lambda: [e for e in scheduler.events("acquired") if e["job"] == long_job]  # noqa: E731
    assert eventually(running), scheduler.lines
    lab.write_config("loops", ["quick", "long", "added"])
    scheduler.process.send_signal(signal.SIGHUP)
    (reloaded,) = eventually(lambda: scheduler.events("reloaded"))
    assert reloaded["kept"] == sorted([long_job, quick]) and reloaded["added"] == [added]
    after = _at(reloaded)
    # while the long run goes on: the short job's ticks, and the new job's first ones
    assert eventually(lambda: len([e for e in _ran(scheduler, quick) if _at(e) > after]) >= 2)
    assert eventually(lambda: _ran(scheduler, added)), scheduler.lines
    assert not _ran(scheduler, long_job) and len(scheduler.events("session-created")) == 1

    ca_copy = lab.tmp / "ca-copy.pem"
    ca_copy.write_bytes(Path(lab.config["consul"]["ca_file"]).read_bytes())
    lab.write_config("loops", ["quick"], ca_file=str(ca_copy))
    scheduler.process.send_signal(signal.SIGHUP)
    assert eventually(lambda: len(scheduler.events("reloaded")) == 2), scheduler.lines
    second = scheduler.events("reloaded")[1]
    assert second["removed"] == sorted([added, long_job]) and second["replaced"] == [quick]
    assert eventually(lambda: len(scheduler.events("session-created")) == 2), scheduler.lines
    assert eventually(lambda: [e for e in _ran(scheduler, quick) if _at(e) > _at(second)])
    assert not _ran(scheduler, long_job) and not scheduler.events("session-destroyed")
    marker.touch()  # the long run ends now, under its old session
    assert eventually(lambda: _ran(scheduler, long_job)), scheduler.lines
    (released,) = _ran(scheduler, long_job)
    assert released["released"] is True and released["child_status"] == 0, released
    (destroyed,) = eventually(lambda: scheduler.events("session-destroyed"))
    assert destroyed["session"] == released["session"] and _at(destroyed) >= _at(released)
    time.sleep(2 * EVERY)
    due = [e for e in scheduler.events("tick-due") if e["job"] == long_job]
    assert all(_at(e) < _at(released) for e in due), due  # removed: no tick after its run
    assert scheduler.stop() == 0
    print("\n" + "\n".join(scheduler.lines))  # for docs/scheduler.md
    for name in ("fenced", "lost", "tick-failed", "consul-unavailable"):
        assert not scheduler.events(name), (name, scheduler.lines)
    _no_traceback(scheduler)


def test_sighup_replaces_a_changed_job_only_when_its_run_ends(
    lab: Lab, started: list[SchedulerProcess]
) -> None:
    """The long job's config changes while it runs: its run goes on (no second run meanwhile,
    the same session), and the new loop takes the first tick after that run, saying the ticks
    that passed as overlap."""
    marker = lab.tmp / "long.go"
    marker.unlink(missing_ok=True)
    config = lab.write_config("changed", ["long"])
    scheduler = SchedulerProcess(config)
    started.append(scheduler)
    long_job = lab.job("long")
    assert eventually(lambda: scheduler.events("acquired")), scheduler.lines
    raw = json.loads(config.read_text())
    raw["jobs"][long_job]["history_limit"] = 17  # a change the loop must take up
    config.write_text(json.dumps(raw))
    scheduler.process.send_signal(signal.SIGHUP)
    reloads = eventually(lambda: scheduler.events("reloaded"))
    assert reloads and reloads[0]["replaced"] == [long_job], scheduler.lines
    time.sleep(2 * EVERY)  # two ticks pass while the old loop's run goes on
    assert len(scheduler.events("acquired")) == 1, scheduler.lines
    marker.touch()
    assert eventually(lambda: len(scheduler.events("acquired")) == 2), scheduler.lines
    first, second = scheduler.events("acquired")
    (released,) = [
        e for e in scheduler.events("released") if e["lock_index"] == first["lock_index"]
    ]
    assert _at(second) >= _at(released) and second["tick"] > first["tick"]
    assert second["session"] == first["session"]  # the same connection: the same session
    overlap = [e for e in scheduler.events("skipped") if "overlap" in e["reason"]]
    assert overlap, scheduler.lines  # the ticks that passed, said by the new loop
    assert scheduler.stop() == 0
    _no_traceback(scheduler)


# --- a rotated token ----------------------------------------------------------------------------
def _rotate(lab: Lab) -> str:
    """`lockctl rotate --worker worker-1` (the real command: a new token written to the worker's
    file, read back, the old one deleted at once); the old secret, to probe with."""
    management = lab.cluster.management()
    old = lab.made.token_ids[-1]  # the live one: each rotate appends its new token
    token = management.acl.read_token(old)
    assert token.secret is not None
    # rotate finds the worker's token by lockctl's description (the lab's carries a uid)
    management.acl.update_token(old, token_description(WORKER), list(token.policy_names))
    done = run_lockctl(
        "rotate", "--worker", WORKER, "--spec", str(lab.tmp / "locks.hcl"),
        "--secrets-dir", str(lab.tmp / "secrets"),
        "--address", lab.cluster.address("server-1"),
        "--token-file", str(lab.cluster.layout.management_token_file),
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    print(f"\n$ lockctl rotate --worker {WORKER} ...\n{done.stdout}")  # for docs/apply.md
    lab.made.token_ids.append(done.stdout.split("new token ")[1].split()[0])  # deleted at the end
    return token.secret.reveal()


def _refused_now(lab: Lab, secret: str) -> bool:
    """The old token is refused through worker-1's agent (where the jobs' calls go)."""
    try:
        lab.cluster.client(WORKER, Secret(secret)).acl.read_self_token()
    except PermissionDenied:
        return True
    return False


def test_a_session_outlives_the_token_that_made_it_and_the_new_token_renews_and_releases_it(
    lab: Lab,
) -> None:
    """What Consul does when rotate deletes the token a held session was made with: the session
    and its lock stay; renewals with the old token are refused (403), with the new one they
    work, and the new one releases the lock. So a holder that switches tokens keeps its lock."""
    old_secret = (lab.tmp / "secrets" / f"{WORKER}.token").read_text().strip()
    old = lab.cluster.client(WORKER, Secret(old_secret))
    session = old.session.create(name="rotate-probe", ttl=10, lock_delay=0)
    key = f"test/reload-{lab.uid}/quick/probe"
    assert old.kv.put(key, b"x", acquire=session)
    assert _rotate(lab) == old_secret
    new_secret = _secret(lab)
    assert eventually(lambda: _refused_now(lab, old_secret), 10)
    with pytest.raises(PermissionDenied):
        old.session.renew(session)
    info = lab.cluster.management().session.info(session, consistency="consistent")
    assert info is not None, "the session went with its token"
    new = lab.cluster.client(WORKER, Secret(new_secret))
    assert new.session.renew(session).id == session
    entry, _ = new.kv.get(key, consistency="consistent")
    assert entry is not None and entry.session == session  # still held
    assert new.kv.put(key, release=session)
    new.session.destroy(session)


def test_a_rotated_token_fences_no_job_of_a_running_lockctl_run(lab: Lab) -> None:
    marker = lab.tmp / "run.go"
    marker.unlink(missing_ok=True)
    config = lab.write_config("rotate-run", ["long"])
    # a plain lock, no schedule: the run holds the lock whenever it starts (an @every 2s tick
    # can be missed by a run that a loaded machine starts 2 s late)
    raw = json.loads(config.read_text())
    raw["jobs"][lab.job("long")]["schedule"] = None
    config.write_text(json.dumps(raw))
    wait = f"for i in $(seq 600); do [ -e {marker} ] && break; sleep 0.1; done"
    run = SchedulerProcess.__new__(SchedulerProcess)  # its stderr reader, for `lockctl run`
    run.config = config
    run.process = subprocess.Popen(
        [*LOCKCTL, "run", "--job", lab.job("long"), "--config", str(config), "--",
         "/bin/sh", "-c", wait],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    run.lines = []
    run._reader = threading.Thread(target=run._read, daemon=True)
    run._reader.start()
    try:
        assert eventually(lambda: run.events("acquired")), run.lines
        old_secret = _rotate(lab)
        assert eventually(lambda: _refused_now(lab, old_secret), 10)
        time.sleep(12)  # longer than the TTL (10 s): renewals with the old token would fence it
        marker.touch()
        assert run.process.wait(WAIT) == 0, run.lines  # not 76 (fenced)
        assert not run.events("fenced") and not run.events("lost"), run.lines
        (released,) = run.events("released")
        assert released["released"] is True and released["child_status"] == 0, released
        assert not [e for e in run.events("renew-failed")], run.lines
        text = "\n".join(run.lines)
        assert old_secret not in text and _secret(lab) not in text
    finally:
        marker.touch()
        run.kill()


def _secret(lab: Lab) -> str:
    return (lab.tmp / "secrets" / f"{WORKER}.token").read_text().strip()


def test_a_rotated_token_is_picked_up_by_a_running_scheduler_without_fencing_its_job(
    lab: Lab, started: list[SchedulerProcess]
) -> None:
    marker = lab.tmp / "long.go"
    marker.unlink(missing_ok=True)
    scheduler = SchedulerProcess(lab.write_config("rotate-schedule", ["quick", "long"]))
    started.append(scheduler)
    long_job = lab.job("long")
    running = lambda: [e for e in scheduler.events("acquired") if e["job"] == long_job]  # noqa: E731
    assert eventually(running), scheduler.lines
    old_secret = _rotate(lab)
    assert eventually(lambda: _refused_now(lab, old_secret), 10)
    refused_at = time.time()
    time.sleep(12)  # longer than the TTL: renewals under the old token would lose the session
    marker.touch()
    assert eventually(lambda: _ran(scheduler, long_job)), scheduler.lines
    (released,) = _ran(scheduler, long_job)[:1]
    assert released["released"] is True and released["child_status"] == 0, released
    quick_after = [
        e
        for e in _ran(scheduler, lab.job("quick"))
        if datetime.fromisoformat(e["time"]).timestamp() > refused_at + 1
    ]
    assert len(quick_after) >= 3, scheduler.lines  # its ticks go on with the new token
    for name in ("fenced", "lost", "tick-failed", "consul-unavailable", "session-lost"):
        assert not scheduler.events(name), (name, scheduler.lines)
    assert len(scheduler.events("session-created")) == 1, scheduler.lines  # the same session
    assert scheduler.stop() == 0
    text = "\n".join(scheduler.lines)
    assert old_secret not in text and _secret(lab) not in text
    _no_traceback(scheduler)
