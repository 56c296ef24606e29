"""The seam between the supervisor and what runs under the lock: a job body.

The supervisor (runner/supervisor.py) and the lock's helpers (runner/monitors.py) only start
the body, ask whether it has ended and how, and stop it; so a command's process tree (Child,
runner/child.py) and an HTTP call to the app (HttpJob, runner/http_job.py) run under the same
tick claim, renewal, fencing, timeout and record. Stopping an HTTP call is aborting it: the
fencing token the app checks, not a kill, protects what it does (docs/http-jobs.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from provision.fencing import BodyFence


class JobBody(Protocol):
    """What runs under a held lock. `signal_tree` stops it (a signal to a process tree, an
    abort of a request); `exit_status` is None until it has ended, then 0 for success."""

    containment: str  # how it is contained: a PID namespace, a process group, "http"
    warning: str | None  # why its containment is weaker than it could be, if it is
    process: Any  # a process the lock's helpers may wait on through a descriptor, or None

    @property
    def pid(self) -> int | None: ...

    @property
    def exit_status(self) -> int | None: ...

    def start(self, lock_env: Mapping[str, str], fence: BodyFence) -> None:
        """Start under the held lock: `lock_env` says what it is, `fence` how long it is safe
        (a process killed by the supervisor may ignore it; a body that must judge its own
        safety, or that the supervisor cannot kill in time, follows it)."""

    def wait(self) -> int: ...

    def signal_tree(self, signum: int) -> bool: ...

    def tree_alive(self) -> bool: ...

    def output_tails(self) -> tuple[str | None, str | None]: ...

    def abort(self) -> None: ...

    def close(self) -> None: ...
