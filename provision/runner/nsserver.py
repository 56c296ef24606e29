"""The scheduler's resident helper: it makes each job's PID namespace by forking, not by exec.

`lockctl run` starts a job's namespace with `unshare ... python -I -S nsinit.py`: two execs and
a Python start, 20-40 ms of CPU, once per process, which is fine. A scheduler runs up to tens of
jobs a second, and that cost would eat the machine. So `lockctl schedule` starts this program
once (runner/forkserver.py), and for each job it forks twice, the way `unshare --fork` does:

    this helper -> fork: the namespace's keeper (unshare's part; not needed as root, below)
                   unshare(PID, mount[, user]), fork: PID 1 of the new namespace
                   (a private /proc, then nsinit.init: ready, the go, the job, the reaping)
                   waits for PID 1, exits with its status
              <- reaps the keeper, writes its status to the job's status socket

A fork of this small single-threaded process costs well under a millisecond. The runner talks to
the job's init on the control socket exactly as with unshare (ready, the go), signals the init
through a pidfd, and reads the exit status from the status socket. A step of the namespace the
machine refuses (a container forbids the user namespace, or the mount of a /proc of its own) is
said on the control socket instead of ready: `refused STEP: WHY`, the runner's reason to run the
job in a process group; never a line in the job's output. The chain of PDEATHSIG=SIGKILL
is the same as unshare's: the scheduler dies -> this helper -> the keeper -> PID 1 -> the
kernel ends the namespace.

As root there is no keeper: the helper unshares the PID namespace for its next child only,
forks the init itself (which makes its own mount namespace) and reaps it: one fork per job.

A request is one message on the socket FD: 4 bytes of length, the JSON {"command", "env"}, and
two descriptors (the control and the status socket) as SCM_RIGHTS, or four: then also the job's
stdout and stderr (the runner's pipes, runner/output.py), else the job has the helper's own.
The answer is the PID of what was forked (0 when nothing could be) and whether that is the init
itself (1) or a keeper.
End of file on FD: the scheduler is done, exit (what we forked dies with us: PDEATHSIG).
Standard library only; run by the runner, never by hand.
"""

from __future__ import annotations

import array
import ctypes
import json
import os
import select
import signal
import socket
import struct
import sys
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from provision.runner import nsinit
else:  # a script of its own, started with -I, which leaves our folder off the path
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import nsinit

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
MS_REC, MS_PRIVATE = 16384, 1 << 18
PR_SET_PDEATHSIG = 1
MAX_REQUEST = 4 * 1024 * 1024
EXIT_NO_NAMESPACE = 125  # the keeper could not make the namespace (as unshare exits then)
# The keeper, like unshare, leaves the job's fate to its init: what reaches it by mistake (a
# terminal's ^C, a unit's stop sent to the whole cgroup) is the init's to forward, not its own.
IGNORED = tuple(nsinit.FORWARDED)

_libc = ctypes.CDLL(None, use_errno=True)


def main(argv: list[str]) -> int:
    server = socket.socket(fileno=int(argv[1]))
    for signum in IGNORED:  # the scheduler ends us by closing the socket, or by dying
        signal.signal(signum, signal.SIG_IGN)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd is written
    statuses: dict[int, int] = {}  # keeper pid -> the status socket its end is written to
    while True:
        readable, _, _ = select.select([server.fileno(), wake_read], [], [])
        if wake_read in readable:
            os.read(wake_read, 4096)
        _reap(statuses)
        if server.fileno() in readable and not _serve_one(
            server, statuses, (wake_read, wake_write)
        ):
            return 0


def _serve_one(server: socket.socket, statuses: dict[int, int], ours: tuple[int, ...]) -> bool:
    """Fork the namespace of one request; False at the end of the requests."""
    request = _receive(server)
    if request is None:
        return False
    job, control, status, output = request
    theirs = {server.fileno(), *ours, *statuses.values(), status}
    job["output"] = output
    pid, is_init = (
        _fork_init(job, control, theirs) if _ROOT else (_fork_keeper(job, control, theirs), 0)
    )
    os.close(control)
    for fd in output:  # the job has them: its end of file must not wait for ours
        os.close(fd)
    if pid:
        statuses[pid] = status
    else:
        os.close(status)
    server.sendall(struct.pack("!II", pid, is_init))
    return True


_ROOT = os.geteuid() == 0
_OWN_PID_NAMESPACE = os.open("/proc/self/ns/pid", os.O_RDONLY) if _ROOT else -1


def _fork_init(job: dict[str, Any], control: int, theirs: set[int]) -> tuple[int, int]:
    """As root, one fork: the child is PID 1 of a PID namespace made for it, and ours to reap
    (a second unshare of the PID namespace is refused until we set ours back: setns first)."""
    try:
        _check(_libc.setns(_OWN_PID_NAMESPACE, CLONE_NEWPID), "setns of our PID namespace")
        _unshare(CLONE_NEWPID, "PID")  # for the next child only: we stay where we are
        pid = os.fork()
    except OSError:
        return 0, 0
    if pid == 0 and _is_child():
        try:
            # Our parent is outside our namespace now: getppid() says 0, it cannot be checked.
            # Had the helper died before the PDEATHSIG was set, the end of the control socket
            # (the runner gone with it) still ends this init before any job starts.
            _leave_the_helper(theirs | {_OWN_PID_NAMESPACE}, job["output"], check_parent=False)
            _unshare(CLONE_NEWNS, "mount")
        except OSError as exc:
            _refuse(control, exc)
        _pid1(job, control)
    return pid, 1


def _fork_keeper(job: dict[str, Any], control: int, theirs: set[int]) -> int:
    """Not root: a keeper enters a user namespace of its own (it cannot be undone, so not here)
    and forks the init there, as `unshare --fork` does."""
    try:
        pid = os.fork()
    except OSError:
        return 0
    if pid == 0 and _is_child():
        _keeper(job, control, theirs)
    return pid


_SERVER_PID = os.getpid()


def _is_child() -> bool:
    return os.getpid() != _SERVER_PID


def _receive(server: socket.socket) -> tuple[dict[str, Any], int, int, list[int]] | None:
    fds = array.array("i")
    head, ancillary, _, _ = server.recvmsg(4, socket.CMSG_SPACE(4 * fds.itemsize))
    if len(head) < 4:
        return None
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    (size,) = struct.unpack("!I", head)
    if size > MAX_REQUEST or len(fds) not in (2, 4):
        return None  # not our runner talking: stop serving
    body = b""
    while len(body) < size:
        chunk = server.recv(size - len(body))
        if not chunk:
            return None
        body += chunk
    return json.loads(body), fds[0], fds[1], list(fds[2:])


def _reap(statuses: dict[int, int]) -> None:
    """Collect every keeper that ended and tell its runner how (as Popen has it: -N for a
    signal N)."""
    while statuses:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
        fd = statuses.pop(pid, None)
        if fd is not None:
            try:  # noqa: SIM105 - contextlib would be one more import
                os.write(fd, f"{code}\n".encode())
            except OSError:
                pass  # the runner is gone: nobody to tell
            os.close(fd)


# -- the keeper (unshare's part) and PID 1 --------------------------------------------------
def _keeper(job: dict[str, Any], control: int, theirs: set[int]) -> None:
    """In the forked child: make the namespace, start its init, wait for it, exit with its
    status. Never returns."""
    try:
        _leave_the_helper(theirs, job["output"])
        _enter_namespaces()
        init = os.fork()
    except OSError as exc:
        _refuse(control, exc)
    if init == 0:
        _pid1(job, control)
    os.close(control)
    os._exit(_wait_for(init))


def _leave_the_helper(theirs: set[int], output: list[int], *, check_parent: bool = True) -> None:
    """In a forked child: none of the helper's descriptors or handlers, and death with it;
    the job's own stdout and stderr when the runner sent them."""
    signal.set_wakeup_fd(-1)
    for fd in theirs:
        os.close(fd)
    if output:
        os.dup2(output[0], 1)
        os.dup2(output[1], 2)
        for fd in output:
            os.close(fd)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _die_with_parent()
    if check_parent and os.getppid() != _SERVER_PID:
        os._exit(EXIT_NO_NAMESPACE)  # the helper died before we could follow it


def _enter_namespaces() -> None:
    # Not root: an unprivileged user namespace, with our uid and gid mapped to themselves (as
    # unshare --user --map-current-user does), owns the PID and mount namespaces.
    uid, gid = os.geteuid(), os.getegid()
    _unshare(CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNS, "user, PID and mount")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")


def _pid1(job: dict[str, Any], control: int) -> None:
    """PID 1 of the namespace: its own /proc, then nsinit's life. Never returns."""
    try:
        _become_pid1()
    except OSError as exc:
        _refuse(control, exc)
    code = 127
    try:
        command = [str(part) for part in job["command"]]
        env = {str(key): str(value) for key, value in job["env"].items()}
        hidden = [str(path) for path in job.get("hidden", ())]
        code = nsinit.init(control, command, env, hidden)
    except OSError as exc:  # after ready: the runner went away, or the job could not start
        os.write(2, f"lockctl: the job's init failed: {exc.strerror}\n".encode())
    os._exit(code)


def _become_pid1() -> None:
    _die_with_parent()  # its parent dies (SIGKILL): so does the namespace
    for signum in IGNORED:
        signal.signal(signum, signal.SIG_DFL)
    # A /proc of the namespace's own, in a mount namespace whose mounts stay in it, as unshare
    # --mount-proc makes it: ps and /proc/self inside the job describe the job's. A container
    # that masks part of its own /proc (most do) refuses this mount to a user namespace.
    _mount(b"none", b"/", None, MS_REC | MS_PRIVATE)
    _mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _refuse(control: int, exc: OSError) -> NoReturn:
    """Tell the runner which step the machine refused (it runs the job in a process group
    instead), and end. Never returns."""
    said = f"{exc.filename or 'the namespace'}: {exc.strerror}\n"
    try:  # noqa: SIM105 - contextlib would be one more import
        os.write(control, nsinit.REFUSED + said.encode(errors="replace"))
    except OSError:
        pass  # the runner is gone: nobody to tell
    os._exit(EXIT_NO_NAMESPACE)


def _wait_for(pid: int) -> int:
    while True:
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            return 0
        if os.WIFEXITED(status):
            return os.WEXITSTATUS(status)
        if os.WIFSIGNALED(status):
            return 128 + os.WTERMSIG(status)


def _die_with_parent() -> None:
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")


def _unshare(flags: int, which: str) -> None:
    _check(_libc.unshare(flags), f"unshare of a {which} namespace")


def _mount(source: bytes, target: bytes, kind: bytes | None, flags: int) -> None:
    what = target.decode() if kind else f"--make-rprivate {target.decode()}"
    _check(_libc.mount(source, target, kind, flags, None), f"mount {what}")


def _check(result: int, step: str) -> None:
    """An OSError naming the `step` (its filename: the runner's reason says it) if it failed."""
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno), step)


def _write(path: str, text: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, f"write {path}") from None


if __name__ == "__main__":
    os._exit(main(sys.argv))
