"""lockctl's own lock: one `apply` or `rotate` at a time against a cluster.

Three applies at once each planned "create" and each minted a token; three rotates each revoked
the token another had just announced. Making each create idempotent would not be enough (an
apply re-reading a secret while a rotate revokes it writes a dead token to the file), so every
read-plan-write sequence runs under one Consul lock instead:

    session (TTL 15 s, renewed; LockDelay 0; Behavior delete) + acquire LOCK_KEY

waited for with a bounded timeout (a blocking query, not a poll), and the session is destroyed
on every exit (which also deletes the key). The session is made, renewed and destroyed as the
runner's is (provision.sessions). A holder killed with SIGKILL leaves its session
until the TTL runs out, unless the waiter runs on the same machine and sees that the holder's
process is gone: then it destroys the dead holder's session and takes the lock at once.

Signals are the CLI's (provision/cli/signals.py): its handlers only record a stop request, which
this module asks for at its safe points (before the session is made, at each turn of the wait,
right after the acquire), ending with Interrupted; the block asks it at its own. So a SIGTERM
that comes at any moment, even between the acquire and the block, frees the lock at once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from provision.consul import Consul, ConsulError, PermissionDenied
from provision.consul.models import KVEntry
from provision.errors import EXIT_DENIED, EXIT_ENVIRONMENT, Interrupted, LockctlError
from provision.sessions import OwnSession, SessionTerms
from provision.system.deadline import Deadline

log = logging.getLogger("provision.acl")

LOCK_KEY = "lockctl/apply.lock"
SESSION_TTL = 15.0  # renewed every TTL/3; a SIGKILLed holder's session lapses after ~2 x TTL
DEFAULT_LOCK_WAIT = 60.0
RETRY_PAUSE = 0.05
MAX_BLOCKING_WAIT = 10.0  # one blocking query at most this long, so the deadline is kept
STOP_POLL = 1.0  # with a stop request to heed, one blocking query at most this long
LOCK_HINT = (
    f'the token needs key "{LOCK_KEY}" and session write (for lockctl\'s own lock) as well as '
    'acl = "write"; a management token has all of them'
)


class LockBusy(LockctlError):
    """Another apply or rotate held lockctl's lock for longer than the wait allowed."""

    exit_code = EXIT_ENVIRONMENT


class LockRefused(LockctlError):
    """Consul refused lockctl's own lock (403): the token lacks key or session write."""

    exit_code = EXIT_DENIED


class StopFlag(Protocol):
    """What the core reads of the CLI's stop request (provision.runner.stop.StopRequest)."""

    @property
    def requested(self) -> bool: ...

    @property
    def signum(self) -> int | None: ...


def check_stop(stop: StopFlag | None, when: str) -> None:
    """Raise Interrupted ("interrupted by SIGTERM <when>") if a stop was requested."""
    if stop is not None and stop.requested:
        raise Interrupted(f"interrupted by {signal_name(stop.signum)} {when}".rstrip())


def signal_name(signum: int | None) -> str:
    try:
        return signal.Signals(signum or 0).name
    except ValueError:
        return f"signal {signum}"


@contextlib.contextmanager
def apply_lock(
    consul: Consul,
    command: str,
    *,
    wait: float = DEFAULT_LOCK_WAIT,
    stop: StopFlag | None = None,
) -> Iterator[None]:
    """Hold lockctl's lock for the block; wait at most `wait` seconds for it.

    With `stop`, a stop requested before the session is made, during the wait or by the time
    the lock is taken raises Interrupted (the session destroyed, the lock free); within the
    block, the caller asks `stop` at its own safe points.
    """
    check_stop(stop, f"before taking {LOCK_KEY}")
    session = OwnSession(consul, _session_terms(command))
    try:
        session.create()
    except PermissionDenied:
        raise LockRefused(
            f"Consul refused to create the session for {LOCK_KEY} (403 permission denied): "
            f"{LOCK_HINT}"
        ) from None
    stop_renewing = threading.Event()
    try:
        _acquire(consul, session.id, _holder_record(command), wait, stop)
        check_stop(stop, f"as it took {LOCK_KEY} (released again, nothing changed)")
        renewer = threading.Thread(target=_renew, args=(session, stop_renewing), daemon=True)
        renewer.start()
        yield
    finally:
        stop_renewing.set()
        session.destroy()  # which also deletes the key (Behavior delete)


def _session_terms(command: str) -> SessionTerms:
    """No LockDelay: nothing runs on after a lost apply lock that a delay would keep apart."""
    return SessionTerms(
        name=f"lockctl {command}",
        ttl=SESSION_TTL,
        lock_delay=0.0,
        behavior="delete",
        renew_interval=SESSION_TTL / 3,
    )


def _acquire(
    consul: Consul, session_id: str, record: bytes, wait: float, stop: StopFlag | None
) -> None:
    """Acquire LOCK_KEY for the session, waiting (blocking queries) at most `wait` seconds;
    a stop request ends the wait within STOP_POLL seconds."""
    deadline = Deadline(wait)
    longest = MAX_BLOCKING_WAIT if stop is None else STOP_POLL
    while True:
        check_stop(stop, f"while waiting for {LOCK_KEY} (nothing changed)")
        try:
            if consul.kv.put(LOCK_KEY, record, acquire=session_id):
                return
        except PermissionDenied:
            raise LockRefused(
                f"Consul refused to acquire {LOCK_KEY} (403 permission denied): {LOCK_HINT}"
            ) from None
        entry, meta = consul.kv.get(LOCK_KEY, consistency="consistent")
        holder = entry.session if entry is not None else None
        if entry is not None and holder is not None and _holder_is_gone(entry):
            log.info("%s: its holder's process is gone; ending its session", LOCK_KEY)
            consul.session.destroy(holder)
            continue
        if deadline.expired():
            who = _describe(entry) if entry is not None else "no holder: in a lock-delay?"
            raise LockBusy(
                f"{LOCK_KEY} is held by another lockctl ({who}); gave up after waiting "
                f"{wait:g} s (--lock-wait)"
            )
        if holder is None:  # released between the two calls (or in a lock-delay): again
            time.sleep(RETRY_PAUSE)
            continue
        # Wake when the key changes (released, deleted), but never past the deadline.
        hold = min(longest, max(deadline.remaining(), 0.1))
        consul.kv.get(LOCK_KEY, index=meta.index or 1, wait=hold)


def _renew(session: OwnSession, stop: threading.Event) -> None:
    while not stop.wait(session.terms.renew_interval):
        try:
            session.renew()
        except ConsulError as exc:  # a failed renewal is tried again at the next tick
            if not stop.is_set():  # (at the end the session is destroyed under a renewal)
                log.info("renewing the session of %s failed: %s", LOCK_KEY, exc)


# --- who holds it ---------------------------------------------------------------------------


def _holder_record(command: str) -> bytes:
    """Who holds the lock: shown to a waiter, and lets a waiter on this machine see it died."""
    pid = os.getpid()
    return json.dumps(
        {
            "command": command,
            "host": socket.gethostname(),
            "pid": pid,
            "machine": _machine_identity(),
            "started": _process_start(pid),
        }
    ).encode()


def _machine_identity() -> str:
    """This boot of this machine and this PID namespace: where a PID means the same process."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


def _process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (tells a reused PID apart)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _parse_record(entry: KVEntry) -> dict[str, Any]:
    try:
        record = json.loads(entry.value or b"")
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def _holder_is_gone(entry: KVEntry) -> bool:
    """True only when the holder ran on this machine (same boot, same PID namespace) and its
    process no longer exists; anything unsure means "alive"."""
    record = _parse_record(entry)
    pid, started, machine = record.get("pid"), record.get("started"), record.get("machine")
    here = _machine_identity()
    if not here or machine != here or not isinstance(pid, int) or not isinstance(started, int):
        return False
    return _process_start(pid) != started


def _describe(entry: KVEntry) -> str:
    """The holder as its record claims, made safe to print (it is text from Consul)."""
    record = _parse_record(entry)
    command = _printable(record.get("command"))
    host = _printable(record.get("host"))
    pid = record.get("pid") if isinstance(record.get("pid"), int) else "?"
    return f"`lockctl {command}`, pid {pid} on {host}"


def _printable(value: object, limit: int = 64) -> str:
    text = value if isinstance(value, str) else "?"
    return "".join(c for c in text if c.isalnum() or c in "-_.")[:limit] or "?"
