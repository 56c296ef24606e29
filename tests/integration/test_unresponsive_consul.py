"""An address that accepts connections and never answers (issue 13, F): every command ends within
its --timeout, retries included, with exit 3 (Consul unavailable) and one line.

The "agent" is a loopback TCP server started here: it accepts every connection, reads nothing,
answers nothing, and is stopped at the end. No Consul cluster is needed, so none is started.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.consul import Consul, ConsulSettings, ConsulUnavailable, RetryPolicy
from provision.spec import load_spec
from provision.workers.config import config_record
from tests.lockctl_process import run_lockctl

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 1.0  # the --timeout every command gets here
# What a command may take beyond its --timeout: starting Python and importing typer, rich and
# requests (~0.4 s alone, more on a loaded 2-core machine). Today's code took 15 s and more.
STARTUP_ALLOWANCE = 5.0


class SilentServer:
    """Accepts connections on 127.0.0.1 and holds them open without a byte in answer."""

    def __init__(self) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.socket.settimeout(0.1)
        self.address = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        self.accepted = 0
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self.socket.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            self._held.append(connection)

    def __enter__(self) -> SilentServer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)
        for connection in self._held:
            connection.close()
        self.socket.close()


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    with SilentServer() as server:
        yield server


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    (tmp_path / "policies").mkdir()
    shutil.copy(ROOT / "policies" / "locks.hcl", tmp_path / "policies" / "locks.hcl")
    return tmp_path


def lockctl(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = run_lockctl(*args, cwd=cwd, drop=("CONSUL_HTTP",))
    return done, time.monotonic() - started


def assert_unavailable_in_time(done: subprocess.CompletedProcess[str], elapsed: float) -> None:
    assert done.returncode == 3, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1].startswith("lockctl: error: consul: ")
    assert "no answer within the client timeout" in done.stderr
    assert elapsed < TIMEOUT + STARTUP_ALLOWANCE, f"took {elapsed:.1f} s"


@pytest.mark.parametrize(
    "command",
    [["status"], ["plan"], ["apply"], ["rotate", "--worker", "worker-1"]],
    ids=lambda command: command[0],
)
def test_every_command_ends_within_its_timeout(
    silent: SilentServer, checkout: Path, command: list[str]
) -> None:
    done, elapsed = lockctl(
        *command, "--address", silent.address, "--timeout", str(TIMEOUT), cwd=checkout
    )
    assert_unavailable_in_time(done, elapsed)
    assert silent.accepted >= 1  # it did get as far as the silent agent


def test_bootstrap_does_not_resend_a_call_that_went_unanswered(
    silent: SilentServer, checkout: Path, tmp_path: Path
) -> None:
    """A bootstrap sent and never answered may have minted the one management token: sending
    it again would be told "already bootstrapped" and the token would be lost. So it is tried
    once and reported unavailable within its timeout (it was retried for 30 s)."""
    token_file = tmp_path / "management.token"
    done, elapsed = lockctl(
        "bootstrap", "--management-token-file", str(token_file),
        "--address", silent.address, "--timeout", str(TIMEOUT), cwd=checkout,
    )  # fmt: skip
    assert_unavailable_in_time(done, elapsed)
    assert silent.accepted == 1
    assert not token_file.exists()


def test_verify_exits_3_within_its_timeout(silent: SilentServer, checkout: Path) -> None:
    """Each check used to find the silence out for itself, call by call: 121 s, exit 1."""
    inventory = checkout / "inventory.json"
    inventory.write_text(json.dumps({f"worker-{n}": silent.address for n in (1, 2, 3)}))
    done, elapsed = lockctl(
        "verify", "--inventory", str(inventory), "--address", silent.address,
        "--timeout", str(TIMEOUT), "--junit", str(checkout / "verify.xml"),
        cwd=checkout,
    )  # fmt: skip
    assert_unavailable_in_time(done, elapsed)
    assert not (checkout / "verify.xml").exists()  # no report of checks that never ran


def test_run_ends_within_the_client_timeout(silent: SilentServer, tmp_path: Path) -> None:
    """`run` has no --timeout for Consul: its calls get the default 10 s, once, not per retry."""
    token = tmp_path / "worker-1.token"
    token.write_text("00000000-0000-0000-0000-000000000000\n")
    token.chmod(0o600)
    record = config_record(load_spec(ROOT / "policies" / "locks.hcl"), "worker-1", token)
    record["consul"]["address"] = silent.address
    config = tmp_path / "lockctl.json"
    config.write_text(json.dumps(record))
    ran = tmp_path / "ran"
    done, elapsed = lockctl(
        "run", "--job", "nightly-ingest", "--config", str(config), "--", "touch", str(ran),
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr
    assert elapsed < 10.0 + STARTUP_ALLOWANCE
    assert not ran.exists()


@pytest.mark.parametrize("timeout", [0.3, 1.0])
def test_a_call_with_retries_ends_within_its_timeout(silent: SilentServer, timeout: float) -> None:
    """Idempotent calls retry read timeouts; the deadline (15 s here) no longer multiplies the
    timeout: the whole call, retries included, ends by its timeout."""
    consul = Consul(ConsulSettings(address=silent.address, timeout=timeout), retry=RetryPolicy())
    for call in (consul.status.leader, lambda: consul.session.renew("x"), consul.acl.list_tokens):
        started = time.monotonic()
        with pytest.raises(ConsulUnavailable, match="no answer within the client timeout"):
            call()
        assert time.monotonic() - started < timeout + 2.0  # the deadline's 15 s: far above
