"""What the supervisor drives as "the job": a command's process tree (runner/child.py), or
another body with the same few operations (provision/embed/ runs a Python callable, in a
thread or a forked process). The fencing decision (runner/fencing.py) only sees these facts:
whether the job's first part exited, whether anything of it is alive, and the signals it was
sent, so every body is fenced by the same rules."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from typing import Protocol

from provision.runner.forkserver import KeptProcess


class JobBody(Protocol):
    """The job under a held lock, as the supervisor and the monitors use it."""

    containment: str  # how its processes are contained, for the `acquired` event
    warning: str | None  # why the containment is weaker than a PID namespace, if it is
    # the process whose end a descriptor can tell (None: the monitors wait() in a thread)
    process: subprocess.Popen[bytes] | KeptProcess | None

    @property
    def pid(self) -> int: ...

    @property
    def exit_status(self) -> int | None: ...

    def start(self, lock_env: Mapping[str, str]) -> None: ...

    def wait(self) -> int: ...

    def signal_tree(self, signum: int) -> bool: ...

    def tree_alive(self) -> bool: ...

    def output_tails(self) -> tuple[str | None, str | None]: ...

    def abort(self) -> None: ...

    def close(self) -> None: ...
