"""PID 1 of a job's own PID namespace: the init that makes the job's process tree one unit.

Started by the runner as `unshare --pid --mount-proc --fork --kill-child -- python -I -S
nsinit.py FD ERR -- CMD` before the lock is acquired (its start-up is off the hand-over path).
ERR is the job's stderr, passed apart: unshare's own stderr is a pipe the runner reads when it
could not make the namespace (its words are the reason the runner gives, not a line in the job's
output). It says `ready` on the control socket FD, then waits for the runner's go: the lock
variables as JSON, then end of file. It starts CMD in a session of its own and from then on:

- forwards SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to every process of the
  namespace (kill(-1) from PID 1), so a setsid'd daemon gets them too; one that came between
  the go and the job's start is sent to the job as soon as it exists;
- reaps every process re-parented to it;
- exits with CMD's status (128+N for signal N) the moment CMD exits. The kernel then kills every
  process left in the namespace and reaps them before this init's own exit is reported: when the
  runner sees the namespace end, nothing of the job is alive.

If the runner dies, unshare dies with it (PDEATHSIG) and takes this init along (--kill-child),
and with it the whole namespace. End of file before any go means: the lock was not ours, exit.

Standard library only, no site (-S): it must start in a few milliseconds and import nothing of
lockctl. Run by the runner, never by hand.
"""

from __future__ import annotations

import json
import os
import signal
import sys

FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
RESET_TO_DEFAULT = (*FORWARDED, signal.SIGPIPE, signal.SIGXFSZ)
MAX_GO_BYTES = 1024 * 1024
# What the init says to the runner on the control socket: ready for the go, or (the namespace
# helper's init, nsserver.py) which step of the namespace the machine refused, and why.
READY = b"ready\n"
REFUSED = b"refused "


def main(argv: list[str]) -> int:
    # nsinit.py FD ERR [HIDDEN ...] -- CMD ...: the files to cover are absolute paths, never "--"
    end = argv.index("--", 3)
    os.dup2(int(argv[2]), 2)  # the job's stderr from now on, ours included
    os.close(int(argv[2]))
    return init(int(argv[1]), argv[end + 1 :], dict(os.environ), argv[3:end])


def init(
    control: int, command: list[str], env: dict[str, str], hidden: list[str] | None = None
) -> int:
    """PID 1's whole life: ready, the go, the job, the reaping; CMD's status as a shell has it.
    Also run in a forked process by the scheduler's resident helper (nsserver.py)."""
    for signum in FORWARDED:
        signal.signal(signum, _forward)
    if hidden:
        _cover(hidden)
    os.write(control, READY)
    extra_env = _read_go(control)
    os.close(control)
    if extra_env is None:
        return 0  # no go: another worker holds the lock
    job = _start(command, {**env, **extra_env})
    _job_started()
    return 127 if job is None else _reap_until(job)


MS_BIND = 4096
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4


def _cover(paths: list[str]) -> None:
    """Bind /dev/null over each file, in this init's own mount namespace (private: the host's
    files are untouched), before the job exists: the worker's token and TLS key read as empty
    to the job, which runs as the same user as lockctl. A file that cannot be covered is said
    on stderr, and the job still runs (its environment names none of them)."""
    import ctypes  # only here: a job without secrets to hide does not pay for it

    libc = ctypes.CDLL(None, use_errno=True)
    for path in paths:
        if os.path.exists(path) and libc.mount(b"/dev/null", path.encode(), None, MS_BIND, None):
            why = os.strerror(ctypes.get_errno())
            os.write(2, f"lockctl: warning: cannot hide {path!r} from the job: {why}\n".encode())
    # Not root, this init may hold capabilities in its user namespace as ambient ones (unshare
    # --keep-caps, to mount the covers): the job must not inherit them, or it could uncover.
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)


# Signals that came before the job existed (the runner's SIGTERM can come right after its go,
# while the job is being spawned): sent to it as soon as it does, never lost. A lost SIGTERM
# would leave the job running until the kill grace is over, then SIGKILLed.
_early: list[int] | None = []


def _forward(signum: int, _frame: object) -> None:
    if _early is not None:
        _early.append(signum)
        return
    _kill_all(signum)


def _job_started() -> None:
    global _early
    early, _early = _early or [], None
    for signum in early:
        _kill_all(signum)


def _kill_all(signum: int) -> None:
    try:  # noqa: SIM105 - contextlib would be one more import on the job's start-up path
        os.kill(-1, signum)  # from PID 1: every process of the namespace but this one
    except ProcessLookupError:
        pass


def _read_go(control: int) -> dict[str, str] | None:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = os.read(control, 65536)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_GO_BYTES:
            return None
    if not chunks:
        return None
    go = json.loads(b"".join(chunks))
    return {str(key): str(value) for key, value in go["env"].items()}


def _start(command: list[str], env: dict[str, str]) -> int | None:
    """Start the job: a session of its own, signals as a normal program has them, exec'd from
    a vfork (posix_spawn: ~0.3 ms, where a fork of this Python is ~2 ms; a scheduler starts
    tens of jobs a second). glibc's child runs no handler of ours: it resets every handled
    signal before it applies ours. None when it cannot start (said on stderr)."""
    program = _find(command[0], env.get("PATH", os.defpath))
    try:
        return os.posix_spawn(
            program,
            command,
            env,
            setsid=True,
            setsigdef=RESET_TO_DEFAULT,
            setsigmask=(),
        )
    except OSError as exc:
        os.write(2, f"lockctl: cannot start {command[0]!r}: {exc.strerror}\n".encode())
        return None


def _find(name: str, path: str) -> str:
    """`name` looked up in the job's PATH as execvp would (the runner checked it exists)."""
    if "/" in name:
        return name
    for folder in path.split(os.pathsep):
        candidate = os.path.join(folder or ".", name)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return name  # posix_spawn then says why not


def _reap_until(job: int) -> int:
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 0
        if pid == job:  # as a shell reports it: 128+N for signal N
            return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


if __name__ == "__main__":
    # os._exit: no interpreter shutdown (several ms): the job's end is the hand-over's start
    os._exit(main(sys.argv))
