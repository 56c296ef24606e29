"""How the job's process tree is held together, and what the machine allows.

Two mechanisms, the strongest available is used:

- `pid-namespace`: the job runs under its own init (nsinit.py) as PID 1 of a new PID namespace,
  made by util-linux's `unshare` (as root `--pid`; otherwise `--user --map-current-user --pid`, an
  unprivileged user namespace), with a /proc of its own (`--mount-proc`, in a mount namespace
  whose mounts do not propagate back). No process can leave a PID namespace, whatever it does with
  sessions, groups, double forks or signals, and when its init ends the kernel kills them all.
  The init ends when the job's main process exits, when the runner SIGKILLs it, and when the
  runner itself dies (unshare has PDEATHSIG=SIGKILL and takes its child along).
- `process-group`: the job leads a process group and the runner is a child subreaper, so the
  group and the job's orphans are found and stopped. A process that leaves the group AND is
  orphaned after the runner itself was SIGKILLed escapes: every `acquired` event names the
  mode, and the first run that falls back says why in a `containment` event, once per process
  (never silently weaker, never a raw line on every tick).

Why the machine refused the namespace comes back to the runner as words, not as a line in the
job's output: the namespace helper's init says `refused STEP: WHY` on the control socket
(nsserver.py), and unshare's own stderr is a pipe of the runner's (nsinit.py takes the job's).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from provision.runner.nsinit import REFUSED
from provision.system.text import printable

PID_NAMESPACE = "pid-namespace"
PROCESS_GROUP = "process-group"
NSINIT = Path(__file__).with_name("nsinit.py")

# Set once the machine refused a PID namespace (no unshare, no permission): every later run of
# this process uses process groups without trying again. A fact about the machine, not a state.
_refused: str | None = None
# The refusals already said in a `containment` event: each once per process, not on every run.
_told: set[str] = set()
_told_lock = threading.Lock()


def namespace_refused() -> str | None:
    """Why a PID namespace cannot be had here, or None while it may be."""
    if _refused is not None:
        return _refused
    if not sys.platform.startswith("linux"):
        return "PID namespaces are Linux only"
    if shutil.which("unshare") is None:
        return "util-linux's unshare is not installed"
    return None


def remember_refusal(reason: str) -> None:
    global _refused
    _refused = reason


def first_telling(reason: str) -> bool:
    """Whether `reason` is yet to be said in this process (True once, then False): the run that
    says it emits the `containment` event, the later ones only name their mode."""
    with _told_lock:
        told = reason in _told
        _told.add(reason)
    return not told


def refusal_reason(init_said: bytes, unshare_said: bytes, code: int) -> str:
    """Why the job's namespace ended before its init said ready: the step its init names
    (`refused STEP: WHY`), else the last line unshare (or a Python that could not start the
    init: its error ends a traceback) wrote on its stderr, else its exit status."""
    if init_said.startswith(REFUSED):
        return printable(init_said[len(REFUSED) :].decode(errors="replace").strip())
    lines = unshare_said.decode(errors="replace").splitlines()
    said = next((line.strip() for line in reversed(lines) if line.strip()), "")
    if said:
        return printable(said)
    return f"the job's namespace ended before its init was ready (exit {code})"


def namespace_argv(
    control_fd: int, stderr_fd: int, command: Sequence[str], hidden: Sequence[str] = ()
) -> list[str]:
    """unshare + nsinit around `command`; nsinit talks to the runner on `control_fd`, gives
    the job `stderr_fd` as its stderr (unshare keeps its own: the runner's, for why it failed)
    and covers the `hidden` files (absolute paths: never `--`) before it says ready."""
    unshare = shutil.which("unshare") or "unshare"
    own = ["--pid"] if os.geteuid() == 0 else ["--user", "--map-current-user", "--pid"]
    if hidden and os.geteuid() != 0 and _keeps_caps(unshare):
        # Our uid, mapped to itself, has no capability in the new namespace once unshare execs
        # the init, so it could not cover the files. The init takes them back off before the
        # job starts (nsinit._cover): the job has none, and cannot uncover them.
        own.append("--keep-caps")
    # A /proc of the namespace's own (in a mount namespace of its own), or ps, pgrep and
    # /proc/self inside the job would describe the runner's namespace instead of the job's.
    own.append("--mount-proc")
    fds = [str(control_fd), str(stderr_fd)]
    nsinit = [sys.executable, "-I", "-S", str(NSINIT), *fds, *hidden, "--", *command]
    return [unshare, *own, "--fork", "--kill-child=SIGKILL", "--", *nsinit]


@functools.cache
def _keeps_caps(unshare: str) -> bool:
    """Whether this unshare has --keep-caps (util-linux 2.38 and later)."""
    try:
        helped = subprocess.run([unshare, "--help"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--keep-caps" in helped.stdout


def pdeathsig_argv(argv: Sequence[str]) -> tuple[list[str], bool]:
    """The argv that starts `argv` with PDEATHSIG=SIGKILL, and whether a preexec hook must set
    it instead. util-linux's `setpriv --pdeathsig` does it in the child's own exec chain, so
    Python can use its vfork path (0.2 ms instead of 2.9 ms measured: the hand-over waits on it).
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return list(argv), True
    return [setpriv, "--pdeathsig", "KILL", "--", *argv], False


# -- the process primitives the job's containment is made of ---------------------------------
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_libc = None


def _prctl(option: int, value: int) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    _libc.prctl(option, value, 0, 0, 0)


def become_subreaper() -> None:
    """Orphaned descendants of ours get re-parented to us, not to init (Linux only)."""
    with contextlib.suppress(OSError, AttributeError):
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def die_with_parent() -> None:  # runs in the child between fork and exec
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def open_pidfd(pid: int) -> int:
    """A pidfd for `pid` (signals to it can never reach a process that reused the PID), or the
    PID itself, negated, where the kernel has no pidfds."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return -pid


def send_signal(process: int, signum: int) -> None:
    """`signum` to a process by what open_pidfd gave for it."""
    if process >= 0:
        signal.pidfd_send_signal(process, signum)
    else:
        os.kill(-process, signum)
