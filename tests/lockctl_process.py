"""The tests' one way to run lockctl as a user does (a process of its own, its output captured)
and their one way to wait for something to become true (polling within a bound, never a bare
sleep that hopes)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

LOCKCTL = [sys.executable, "-m", "provision"]
TIMEOUT = 60.0
WAIT = 30.0  # how long a test waits for something that should come soon


def run_lockctl(
    *args: str,
    env: Mapping[str, str] | None = None,
    timeout: float = TIMEOUT,
    cwd: Path | None = None,
    drop: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """`lockctl ARGS` to its end: the environment is this one's without the variables whose names
    start with one of `drop` (a caller's CONSUL_* or FORCE_COLOR), plus `env`."""
    environ = {k: v for k, v in os.environ.items() if not (drop and k.startswith(drop))}
    return subprocess.run(
        [*LOCKCTL, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**environ, **(env or {})},
        cwd=cwd,
        check=False,
    )


def eventually(check: Callable[[], Any], timeout: float = WAIT, pause: float = 0.1) -> Any:
    """`check()`'s first true result within `timeout` seconds, else its last one."""
    give_up_at = time.monotonic() + timeout
    while True:
        result = check()
        if result or time.monotonic() > give_up_at:
            return result
        time.sleep(pause)


def wait_until(condition: Callable[[], Any], timeout: float = 10.0, pause: float = 0.02) -> bool:
    """Whether `condition()` became true within `timeout` seconds."""
    return bool(eventually(condition, timeout, pause))
