"""The CLI owns the signals; the core only reads a stop request at its safe points.

The handlers: a stop signal is a StopRequest, SIGHUP a ReloadRequest for the scheduler (held
until it exists), all restored or ignored after. The core: apply's lock and apply and rotate
heed a stop request before the session, in the wait, as the lock is taken, and between calls,
each ending with Interrupted (exit 130) and the lock's session destroyed; none sets a handler.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import responses

from provision.acl import rotate as rotate_module
from provision.acl import serialize
from provision.acl import writes as writes_module
from provision.acl.apply import apply_plan
from provision.acl.plan import Plan, PolicyChange
from provision.acl.rotate import rotate_worker_token
from provision.acl.serialize import LOCK_KEY, apply_lock
from provision.cli.signals import ReloadRequest, signals_request_stop, stop_signals
from provision.consul import Consul, ConsulSettings, RetryPolicy
from provision.errors import EXIT_INTERRUPTED, Interrupted
from provision.runner.stop import StopRequest
from provision.system.secrets import Secret

ROOT = Path(__file__).resolve().parents[2]
ADDRESS = "http://consul.test:8500"
SESSION = "lock-session"


@dataclass
class FakeStop:
    """A stop request the test sets (the core only reads `requested` and `signum`)."""

    signum: int | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None


@pytest.fixture
def consul(monkeypatch: pytest.MonkeyPatch) -> Consul:
    monkeypatch.setattr(writes_module, "RETRY_PAUSE", 0.0)
    monkeypatch.setattr(rotate_module, "RETRY_PAUSE", 0.0)
    settings = ConsulSettings(address=ADDRESS, token=Secret("1" * 8), timeout=1)
    return Consul(settings, retry=RetryPolicy(deadline=0.0))


def _session_answers() -> None:
    responses.put(f"{ADDRESS}/v1/session/create", json={"ID": SESSION})
    responses.put(f"{ADDRESS}/v1/session/destroy/{SESSION}", json=True)


def _destroyed() -> bool:
    return any(c.request.url.endswith(f"/session/destroy/{SESSION}") for c in responses.calls)


# --- the handlers ---------------------------------------------------------------------------


def test_a_stop_signal_is_a_request_and_the_handlers_come_back() -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    with stop_signals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.sleep(5) and stop.signum == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt: only recorded
        assert stop.signum == signal.SIGTERM  # the first one is kept
    assert {s: signal.getsignal(s) for s in before} == before
    with pytest.raises(OSError):
        os.fstat(stop.fileno())  # the pipe is closed


def test_sighup_is_a_reload_request_held_until_the_scheduler_takes_it() -> None:
    reload = ReloadRequest()
    stop = StopRequest()
    seen: list[str] = []
    try:
        with signals_request_stop(stop, reload=reload):
            os.kill(os.getpid(), signal.SIGHUP)
            assert not stop.sleep(0.05) and reload.pending  # not a stop
            reload.forward_to(lambda: seen.append("reload"))
            assert seen == ["reload"] and not reload.pending  # passed on once
            os.kill(os.getpid(), signal.SIGHUP)
            assert not stop.sleep(0.05)
            assert seen == ["reload", "reload"]  # from now on at once
            os.kill(os.getpid(), signal.SIGTERM)
            assert stop.sleep(5) and stop.signum == signal.SIGTERM
    finally:
        stop.close()


def test_a_reload_requested_before_the_config_is_read_is_met_by_the_read() -> None:
    reload = ReloadRequest()
    reload.request()
    reload.clear()  # run_schedule: just before it reads the config
    seen: list[str] = []
    reload.forward_to(lambda: seen.append("reload"))
    assert seen == []


def test_outside_the_main_thread_no_handler_is_set() -> None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with stop_signals() as stop:
                assert not stop.requested
        except BaseException as exc:  # reported to the main thread
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert errors == []


def test_the_acl_core_sets_no_signal_handler() -> None:
    for path in sorted((ROOT / "provision" / "acl").glob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"signal\.(signal|setitimer|pthread_sigmask)\(", text), path


# --- the core heeds it ----------------------------------------------------------------------


@responses.activate
def test_a_stop_before_the_lock_creates_no_session(consul: Consul) -> None:
    with (
        pytest.raises(Interrupted, match="interrupted by SIGTERM before taking") as caught,
        apply_lock(consul, "apply", stop=FakeStop(signal.SIGTERM)),
    ):
        raise AssertionError("the block ran")
    assert caught.value.exit_code == EXIT_INTERRUPTED
    assert len(responses.calls) == 0


@responses.activate
def test_a_stop_during_the_acquire_releases_the_lock_before_the_block(consul: Consul) -> None:
    """The race of a loaded machine: the signal comes after Consul granted the lock and before
    the block starts. Then the session is destroyed (the lock freed) and the block never runs."""
    stop = FakeStop()
    _session_answers()

    def granted(_request: object) -> tuple[int, dict[str, str], str]:
        stop.signum = signal.SIGTERM  # "arrives" while the acquire is answered
        return 200, {}, "true"

    responses.add_callback(responses.PUT, f"{ADDRESS}/v1/kv/{LOCK_KEY}", callback=granted)
    with (
        pytest.raises(Interrupted, match=f"as it took {LOCK_KEY}"),
        apply_lock(consul, "apply", stop=stop),
    ):
        raise AssertionError("the block ran")
    assert _destroyed()


@responses.activate
def test_a_stop_while_waiting_ends_the_wait_within_a_poll(
    consul: Consul, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(serialize, "STOP_POLL", 0.01)
    stop = FakeStop()
    _session_answers()
    responses.put(f"{ADDRESS}/v1/kv/{LOCK_KEY}", json=False)  # someone else holds it
    held = [{"Key": LOCK_KEY, "Value": None, "Session": "other", "LockIndex": 1}]
    waits: list[str] = []

    def read(request: object) -> tuple[int, dict[str, str], str]:
        url = str(getattr(request, "url", ""))
        if "wait=" in url:
            waits.append(url)
            stop.signum = signal.SIGINT
        return 200, {"X-Consul-Index": "7"}, json.dumps(held)

    responses.add_callback(responses.GET, f"{ADDRESS}/v1/kv/{LOCK_KEY}", callback=read)
    with (
        pytest.raises(Interrupted, match=f"SIGINT while waiting for {LOCK_KEY}"),
        apply_lock(consul, "apply", wait=60, stop=stop),
    ):
        raise AssertionError("the block ran")
    assert len(waits) == 1, waits  # one short blocking query, then the stop was seen
    assert _destroyed()


@responses.activate
def test_a_stop_between_calls_starts_no_further_call(consul: Consul, tmp_path: Path) -> None:
    stop = FakeStop()
    made: list[str] = []

    def create(request: object) -> tuple[int, dict[str, str], str]:
        made.append("policy")
        if len(made) == 2:
            stop.signum = signal.SIGTERM
        return 200, {}, '{"ID": "p", "Name": "x", "Description": "", "Rules": ""}'

    responses.add_callback(responses.PUT, f"{ADDRESS}/v1/acl/policy", callback=create)
    changes = tuple(
        PolicyChange("create", f"lock-j{i}", "new", None, "lockctl-managed: x", "key {}")
        for i in range(5)
    )
    with pytest.raises(Interrupted) as caught:
        apply_plan(consul, Plan(changes, (), 0, 0), tmp_path, concurrency=1, stop=stop)
    assert str(caught.value) == (
        "interrupted by SIGTERM: 2 of 5 changes were applied; run apply again to converge"
    )
    assert caught.value.exit_code == EXIT_INTERRUPTED
    assert made == ["policy", "policy"]


@responses.activate
def test_a_stop_under_the_lock_before_the_mint_rotates_nothing(
    consul: Consul, tmp_path: Path
) -> None:
    stop = FakeStop()
    _session_answers()
    responses.put(f"{ADDRESS}/v1/kv/{LOCK_KEY}", json=True)
    old = {"AccessorID": "old", "Description": "lockctl worker w1", "Policies": [{"Name": "p"}]}

    def tokens(_request: object) -> tuple[int, dict[str, str], str]:
        stop.signum = signal.SIGHUP
        return 200, {}, json.dumps([old])

    responses.add_callback(responses.GET, f"{ADDRESS}/v1/acl/tokens", callback=tokens)
    with pytest.raises(Interrupted, match="SIGHUP before rotating the token of w1"):
        rotate_worker_token(consul, "w1", tmp_path, stop=stop)
    assert not any(c.request.url.endswith("/v1/acl/token") for c in responses.calls)
    assert _destroyed() and list(tmp_path.iterdir()) == []


# --- the commands set them first ------------------------------------------------------------

STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@pytest.fixture
def own_handlers() -> Iterator[None]:
    """The test process's handlers back after a command that leaves them ignored (schedule)."""
    before = {s: signal.getsignal(s) for s in STOPS}
    yield
    for number, handler in before.items():
        signal.signal(number, handler)


def _defaults(handlers: dict[int, object]) -> list[int]:
    """The signals among `handlers` whose action is still the default (death, or Ctrl-C)."""
    return [n for n, h in handlers.items() if h in (signal.SIG_DFL, signal.default_int_handler)]


def test_apply_and_rotate_set_their_handlers_before_they_read_the_spec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGTERM on a loaded machine came after apply had taken its lock and before its handler:
    the lock stayed to its TTL. Now the handlers come first: by the time the spec is read."""
    import typer
    from typer.testing import CliRunner

    from provision.cli import acl
    from provision.cli.app import ErrorBoundaryGroup
    from provision.errors import InputError

    seen: list[dict[int, object]] = []

    def read_spec(*_args: object) -> object:
        seen.append({s: signal.getsignal(s) for s in STOPS})
        raise InputError("stop here")

    monkeypatch.setattr(acl, "_desired", read_spec)
    monkeypatch.setattr(acl, "_spec_workers", read_spec)
    app = typer.Typer(cls=ErrorBoundaryGroup)
    for name in ("apply", "rotate"):
        app.command(name)(getattr(acl, name))
    before = {s: signal.getsignal(s) for s in STOPS}
    spec = tmp_path / "locks.hcl"
    spec.write_text("")
    flags = ["--spec", str(spec), "--address", ADDRESS]
    for argv in (["apply", *flags], ["rotate", "--worker", "w1", *flags]):
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 2 and "stop here" in result.output, result.output
    assert len(seen) == 2 and [_defaults(handlers) for handlers in seen] == [[], []]
    assert {s: signal.getsignal(s) for s in STOPS} == before  # restored after the command


def test_schedule_sets_its_handlers_before_it_reads_the_config_and_reloads_on_sighup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own_handlers: None
) -> None:
    """A SIGHUP right after start killed the scheduler (default action) or stopped it (the stop
    handler came before the reload one). Now, from before the config is read, SIGHUP is a
    reload request, passed to the scheduler once it exists; SIGTERM alone stops."""
    from provision.cli import schedulejob
    from provision.runner import containment
    from provision.scheduler import on_core
    from provision.workers import config as worker_config

    config = tmp_path / "lockctl.json"
    config.write_text("{}")
    seen: list[dict[int, object]] = []
    made: list[FakeScheduler] = []

    @dataclass
    class Loaded:
        worker: str = "w1"

    def load(_path: Path, allow_unsafe: bool = False) -> Loaded:
        seen.append({s: signal.getsignal(s) for s in STOPS})
        assert _defaults(seen[-1]) == [], "a signal now would kill the scheduler"
        os.kill(os.getpid(), signal.SIGHUP)  # after the read began: a reload once it runs
        return Loaded()

    class FakeScheduler:
        def __init__(self, _config: Loaded, stop: StopRequest, *_a: object, **_k: object) -> None:
            self.stop, self.reloads, self.report = stop, 0, None
            made.append(self)

        def request_reload(self) -> None:
            self.reloads += 1

        def run(self) -> int:
            assert self.reloads == 1 and not self.stop.requested  # the early SIGHUP
            os.kill(os.getpid(), signal.SIGHUP)
            assert self.reloads == 2 and not self.stop.requested
            os.kill(os.getpid(), signal.SIGTERM)
            assert self.stop.sleep(5) and self.stop.signum == signal.SIGTERM
            return 0

    monkeypatch.setattr(worker_config, "load_worker_config", load)
    monkeypatch.setattr(on_core, "CoreScheduler", FakeScheduler)
    monkeypatch.setattr(containment, "become_subreaper", lambda: None)
    assert schedulejob.run_schedule(schedulejob.ScheduleArgs(config)) == 0
    assert len(seen) == 1 and len(made) == 1
    assert [signal.getsignal(s) for s in STOPS] == [signal.SIG_IGN] * 3  # exits right after
