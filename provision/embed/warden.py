"""An isolated body's processes: the body, in a PID namespace of its own, under a warden that
enforces the fencing bounds beside it, so the promise holds whatever happens to the app.

    app (any thread) --fork--> keeper: unshare(PID[, user]), then fork:
        warden (PID 1 of the new namespace) --fork--> the body (PID 2), and all it starts

- The app sends the warden each newer confirmation of the lock (its send time on the monotonic
  clock, which every process of the machine shares) and each signal the supervisor decides,
  through a pipe. The warden asks the fencing decision (provision/fencing.py `decide`) itself: it
  signals the namespace at `fence_after` after the newest confirmation it has and ends it at
  `kill_after`, so a SIGSTOPped app (or one that cannot get the CPU) cannot keep the body alive
  past LockDelay.
- The app is killed (kill -9, the OOM killer): the keeper dies with it (PDEATHSIG), the warden
  with the keeper, and the kernel kills every process of the namespace with its PID 1.
- The body ends: the warden exits with its status, and the kernel kills what it left behind.
- The body's `run.check()` reads the newest confirmation from memory the warden shares with it.

Where no PID namespace can be made (not root and no unprivileged user namespaces), the body
leads a process group of its own, which the warden signals instead; a process that leaves it
(setsid) is then not contained, and the body says so in its `warning`.

Everything after the fork runs on os calls only and ends with os._exit: no app code, no
`finally` or atexit of the app's runs in these processes.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import select
import signal
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from provision.fencing import Action, Facts, FenceBounds, decide

CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
PR_SET_PDEATHSIG = 1
MESSAGE = struct.Struct("=Bd")  # app -> warden: (CONFIRMED, send time) or (SIGNAL, signum)
CONFIRMED, SIGNAL = 1, 2
SHARED = struct.Struct("=dQ")  # warden -> body: the send time and its bits inverted
READ_TRIES = 64  # a read that keeps racing the warden's write gives up on the newest value
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1)
IN_NAMESPACE, IN_GROUP = b"N", b"G"  # the keeper's first word: how the body is contained
EXIT_NO_BODY = 125  # the keeper or the warden could not start the body
KILL_POLL = 0.01  # seconds between looks while a killed tree dies
WORD_POLL = 0.2  # seconds between looks at whether a silent keeper has ended


class SharedConfirmation:
    """The newest confirmation's send time, written by the warden, read by the body: memory
    shared across the forks, no lock (a process killed holding one would block the other).
    The value is stored beside its bits inverted: a read that raced the write sees them
    disagree and reads again."""

    def __init__(self, confirmed_at: float) -> None:
        self._memory = mmap.mmap(-1, SHARED.size)
        self.write(confirmed_at)

    def write(self, confirmed_at: float) -> None:
        (bits,) = struct.unpack("=Q", struct.pack("=d", confirmed_at))
        SHARED.pack_into(self._memory, 0, confirmed_at, bits ^ 0xFFFFFFFFFFFFFFFF)

    def read(self) -> float:
        value = float("-inf")  # never vouched for: a body that cannot read it is told it lost
        for _ in range(READ_TRIES):
            value, inverted = SHARED.unpack_from(self._memory, 0)
            (bits,) = struct.unpack("=Q", struct.pack("=d", value))
            if bits ^ inverted == 0xFFFFFFFFFFFFFFFF:
                return float(value)
        return float("-inf")

    def close(self) -> None:
        self._memory.close()


@dataclass(frozen=True)
class Warded:
    """The body's processes as the app holds them: the keeper's PID (the app waits for it:
    its status is the body's) and the write end of the warden's pipe."""

    keeper: int
    to_warden: int
    contained: bytes  # IN_NAMESPACE or IN_GROUP + why no namespace


def launch(body: Callable[[], None], bounds: FenceBounds, shared: SharedConfirmation) -> Warded:
    """Fork the keeper, the warden and the body; return once the keeper said how the body is
    contained (it may already be running)."""
    to_warden_r, to_warden = os.pipe()
    said_r, said_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the keeper: never returns
        os.close(to_warden)
        os.close(said_r)
        _keeper(_Parts(body, bounds, shared, to_warden_r, said_w))
    os.close(to_warden_r)
    os.close(said_w)
    os.set_blocking(to_warden, False)
    try:
        contained = _keepers_word(said_r, pid)
    finally:
        os.close(said_r)
    return Warded(pid, to_warden, contained or IN_GROUP + b"the body's keeper ended at once")


def tell(warded: Warded, kind: int, value: float) -> None:
    """Send the warden a confirmation or a signal; never blocks (a full pipe drops it: the
    warden then counts from an older confirmation, which only fences sooner)."""
    with contextlib.suppress(OSError):
        os.write(warded.to_warden, MESSAGE.pack(kind, value))


def _keepers_word(fd: int, keeper: int) -> bytes:
    """The keeper's one write (atomic: a pipe), or b"" once it has ended without it. Not an end
    of file: a body forked meanwhile by another thread of the app holds the pipe open too."""
    while True:
        readable, _, _ = select.select([fd], [], [], WORD_POLL)
        if readable:
            return os.read(fd, 512)
        if os.waitid(os.P_PID, keeper, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return b""


@dataclass(frozen=True)
class _Parts:
    body: Callable[[], None]
    bounds: FenceBounds
    shared: SharedConfirmation
    from_app: int
    said: int


def _keeper(parts: _Parts) -> None:
    code = EXIT_NO_BODY
    try:
        _die_with_parent()
        for signum in FORWARDED:  # the app's handlers are the app's, not ours
            signal.signal(signum, signal.SIG_DFL)
        os.setpgid(0, 0)  # a STOP or a ^C sent to the app's group does not reach the body
        contained = _contain()
        warden = os.fork()
        if warden == 0:
            os.close(parts.said)
            _warden(parts, in_namespace=contained == IN_NAMESPACE)
        os.write(parts.said, contained)
        os.close(parts.said)
        os.close(parts.from_app)
        code = _exit_code(os.waitpid(warden, 0)[1])
    except BaseException as exc:  # nothing may escape into the app's code
        _say("keeper", exc)
    os._exit(code)


def _contain() -> bytes:
    """A PID namespace for the next child (this process is single-threaded: a fork), with a
    user namespace of its own when not root; else the word that says why not."""
    libc = ctypes.CDLL(None, use_errno=True)
    root = os.geteuid() == 0
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(CLONE_NEWPID if root else CLONE_NEWUSER | CLONE_NEWPID) != 0:
        return IN_GROUP + os.strerror(ctypes.get_errno()).encode()
    if not root:  # our own ids mapped to themselves, as `unshare --map-current-user` does
        try:
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
        except OSError as exc:
            return IN_GROUP + (exc.strerror or "no id map").encode()
    return IN_NAMESPACE


def _warden(parts: _Parts, *, in_namespace: bool) -> None:
    code = EXIT_NO_BODY
    try:
        _die_with_parent()
        body = os.fork()
        if body == 0:
            _body(parts, in_group=not in_namespace)
        with contextlib.suppress(OSError):  # as the body does: no window without its group
            if not in_namespace:
                os.setpgid(body, body)
        code = _watch(parts, body, in_namespace)
    except BaseException as exc:
        _say("warden", exc)
    os._exit(code)


def _body(parts: _Parts, *, in_group: bool) -> None:
    status = 1
    try:
        _die_with_parent()
        if in_group:
            os.setpgid(0, 0)
        os.close(parts.from_app)
        parts.body()
        status = 0
    except BaseException:  # the body's own failure is its status
        import traceback

        traceback.print_exc()
    os._exit(status)


def _watch(parts: _Parts, body: int, in_namespace: bool) -> int:
    """The warden's life: the fencing decision on the confirmations the app sends, until the
    body ends (its status) or is killed (128+9)."""
    confirmed_at, terminated_at = parts.shared.read(), None
    body_fd = os.pidfd_open(body)
    app_gone = False

    def send(signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if in_namespace:
                os.kill(-1, signum)  # from PID 1: every process of the namespace but this one
            else:
                os.killpg(body, signum)

    while True:
        done, status = os.waitpid(body, os.WNOHANG)
        if done:  # in a namespace, our exit ends what the body left; in a group, this does
            if not in_namespace:
                send(signal.SIGKILL)
            return _exit_code(status)
        now = time.monotonic()
        decision = decide(_facts(now, confirmed_at, terminated_at, app_gone), parts.bounds)
        if decision.action is Action.TERMINATE and terminated_at is None:
            send(decision.signum or signal.SIGTERM)
            terminated_at = now
            continue  # the grace starts: decide when it ends
        wait = None if decision.wake_at is None else max(0.0, decision.wake_at - now)
        if decision.action is Action.KILL:
            send(signal.SIGKILL)
            wait = KILL_POLL  # what dies wakes nobody but the body's own end: look again soon
        watched = [body_fd] if app_gone else [parts.from_app, body_fd]
        readable, _, _ = select.select(watched, [], [], wait)
        if parts.from_app in readable:
            for kind, value in _messages(parts.from_app):
                if kind == CONFIRMED and value > confirmed_at:
                    confirmed_at = value
                    parts.shared.write(value)
                elif kind == SIGNAL:
                    send(int(value))
                    if int(value) in (signal.SIGTERM, signal.SIGKILL) and terminated_at is None:
                        terminated_at = now
                elif kind == 0:  # end of file: the app is gone
                    app_gone = True


def _facts(now: float, confirmed_at: float, terminated_at: float | None, gone: bool) -> Facts:
    """What the warden knows: the body runs, and the lock was confirmed at `confirmed_at`
    (the app gone: as lost as Consul saying so)."""
    return Facts(
        now=now,
        confirmed_at=confirmed_at,
        lost=gone,
        job_exited=False,
        tree_alive=True,
        stop_signal=None,
        verdict=None,
        terminated_at=terminated_at,
        hold_until=0.0,
    )


def _messages(fd: int) -> list[tuple[int, float]]:
    """Every whole message waiting; (0, 0) once at the end of file."""
    try:
        data = os.read(fd, MESSAGE.size * 256)
    except BlockingIOError:
        return []
    if not data:
        return [(0, 0.0)]
    whole = len(data) - len(data) % MESSAGE.size  # writes of one message are atomic (a pipe)
    return [MESSAGE.unpack_from(data, at) for at in range(0, whole, MESSAGE.size)]


def _exit_code(status: int) -> int:
    """As a shell has it: the exit status, or 128+N for a signal N."""
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else EXIT_NO_BODY


def _say(who: str, exc: BaseException) -> None:
    with contextlib.suppress(OSError):
        os.write(2, f"lockctl: the isolated body's {who} failed: {type(exc).__name__}\n".encode())


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
