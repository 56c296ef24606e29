"""The guarded resource: a Unix-socket server that sees every critical section, on its own clock.

Each process of a job connects, sends `enter` (job, worker, session, LockIndex, run, role, and
the tick under `lockctl schedule`), then `write`s while it works, then `exit`, one JSON object a
line; every message is answered `{"ok": true|false}`. A write (enter is the first) carrying a
LockIndex LOWER than the highest this oracle accepted for the job is rejected and counted: that
is the fencing check a real resource would do with LOCK_INDEX. A job without a LockIndex
(`consul lock` gives its child none) cannot be fenced and is accepted.

One connection is one `Section` (one process); the sections with the same `run` (an id the job's
main process draws and its members inherit) are one `Holder`: one lock holder's whole process
tree. Overlaps and late kills are checked between holders, never between members of one.

A section's PID is the peer's, from SO_PEERCRED, as this process's PID namespace numbers it: the
job's own getpid() is a PID in the job's namespace under `lockctl run`, useless out here.

Times are this process's time.monotonic() when a message arrives, and when the connection closes:
the kernel closes it when the process dies, so `closed` is when that member was dead. Namespaces
share the filesystem, so jobs in any network namespace reach the socket.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import socketserver
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Section:
    """One critical section: one process of a job from enter to its connection's close."""

    job: str
    worker: str
    session: str | None
    lock_index: int | None
    pid: int  # the peer's PID (SO_PEERCRED), in the oracle's PID namespace
    run: str
    role: str
    entered: float
    last_accepted: float
    exited: float | None = None  # the job said it was done
    closed: float | None = None  # the connection closed: the process was gone (or let go)
    writes: int = 0
    rejected_at: list[float] = field(default_factory=list)
    enter_rejected: bool = False
    tick: str | None = None  # LOCKCTL_TICK: the scheduled tick this run is for (scheduler runs)

    @property
    def end(self) -> float:
        """When the job was last seen alive."""
        return self.closed if self.closed is not None else time.monotonic()


@dataclass(frozen=True)
class Holder:
    """One lock holder's process tree: the sections of one run, oldest first."""

    run: str
    sections: tuple[Section, ...]

    @property
    def first(self) -> Section:
        return self.sections[0]

    @property
    def worker(self) -> str:
        return self.first.worker

    @property
    def lock_index(self) -> int | None:
        return self.first.lock_index

    @property
    def tick(self) -> str | None:
        return self.first.tick

    @property
    def entered(self) -> float:
        return self.first.entered

    @property
    def accepted(self) -> list[Section]:
        return [s for s in self.sections if not s.enter_rejected]

    @property
    def last_accepted(self) -> float:
        """The last accepted write of any member (or its accepted enter); a member whose enter
        was refused had nothing accepted (once refused, always: the highest index only grows)."""
        return max((s.last_accepted for s in self.accepted), default=self.entered)

    @property
    def end(self) -> float:
        """When the last member was last seen alive."""
        return max(s.end for s in self.sections)

    @property
    def alive(self) -> bool:
        return any(s.closed is None for s in self.sections)

    @property
    def pids(self) -> list[int]:
        return [s.pid for s in self.sections]

    def role_of(self, pid: int) -> str | None:
        return next((s.role for s in self.sections if s.pid == pid), None)


@dataclass(frozen=True)
class Overlap:
    """Two holders of one job whose ACCEPTED activity intersected: two holders acted at once."""

    older: Holder
    newer: Holder
    seconds: float


@dataclass(frozen=True)
class LateKill:
    """A holder's process tree still (partly) alive when the next holder's job entered."""

    older: Holder
    newer: Holder
    seconds: float


class Oracle:
    """The server, its sections, and the checks over them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self.sections: list[Section] = []
        self.marks: list[tuple[float, str]] = []
        self._highest: dict[str, int] = {}
        path.unlink(missing_ok=True)
        oracle = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                oracle._serve(self.rfile, self.wfile, peer_pid(self.request))

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

        self._server = Server(str(path), Handler)
        os.chmod(path, 0o666)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> Oracle:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self.path.unlink(missing_ok=True)

    @staticmethod
    def now() -> float:
        return time.monotonic()

    def mark(self, what: str) -> float:
        """Record a fault (or another driver event) on the oracle's clock."""
        at = self.now()
        with self._lock:
            self.marks.append((at, what))
        return at

    # -- the protocol --------------------------------------------------------------------------
    def _serve(self, rfile: object, wfile: object, pid: int) -> None:
        section: Section | None = None
        try:
            for raw in rfile:  # type: ignore[attr-defined]
                at = self.now()
                message = json.loads(raw)
                ok = self._handle(message, at, section, pid)
                if message.get("op") == "enter":
                    section = ok if isinstance(ok, Section) else None
                    ok = section is not None and not section.enter_rejected
                wfile.write(json.dumps({"ok": bool(ok)}).encode() + b"\n")  # type: ignore[attr-defined]
                wfile.flush()  # type: ignore[attr-defined]
        except (OSError, ValueError):
            pass
        finally:
            if section is not None:
                with self._lock:
                    section.closed = self.now()

    def _handle(
        self, message: dict[str, object], at: float, section: Section | None, pid: int
    ) -> object:
        op = message.get("op")
        with self._lock:
            if op == "enter":
                index = message.get("lock_index")
                new = Section(
                    job=str(message["job"]),
                    worker=str(message["worker"]),
                    session=None if message.get("session") is None else str(message["session"]),
                    lock_index=None if index is None else int(str(index)),
                    pid=pid,
                    run=str(message.get("run") or f"pid-{pid}"),
                    role=str(message.get("role") or "main"),
                    entered=at,
                    last_accepted=at,
                    tick=None if message.get("tick") is None else str(message["tick"]),
                )
                self.sections.append(new)
                new.enter_rejected = not self._accept(new, at)
                return new
            if section is None:
                return False
            if op == "write":
                return self._accept(section, at)
            if op == "exit":
                section.exited = at
                return True
        return False

    def _accept(self, section: Section, at: float) -> bool:
        """The fencing rule: refuse a LockIndex below the highest accepted for this job."""
        highest = self._highest.get(section.job)
        if section.lock_index is not None and highest is not None and section.lock_index < highest:
            section.rejected_at.append(at)
            return False
        if section.lock_index is not None:
            self._highest[section.job] = max(highest or 0, section.lock_index)
        section.writes += 1
        section.last_accepted = at
        return True

    # -- the checks ----------------------------------------------------------------------------
    def of_job(self, job: str) -> list[Section]:
        with self._lock:
            return sorted((s for s in self.sections if s.job == job), key=lambda s: s.entered)

    def rejections(self, job: str) -> int:
        return sum(len(s.rejected_at) for s in self.of_job(job))

    def holders(self, job: str) -> list[Holder]:
        """The job's holders (process trees), by when their first member entered."""
        runs: dict[str, list[Section]] = {}
        for section in self.of_job(job):
            runs.setdefault(section.run, []).append(section)
        return sorted((Holder(r, tuple(s)) for r, s in runs.items()), key=lambda h: h.entered)

    def holder(self, job: str, run: str) -> Holder | None:
        return next((h for h in self.holders(job) if h.run == run), None)

    def overlaps(self, job: str) -> list[Overlap]:
        """Pairs of holders whose accepted activity [first accepted enter, last accepted write of
        any member] intersects: a stale holder's member wrote, unrefused, beside the next."""
        holders = [h for h in self.holders(job) if h.accepted]
        found = []
        for i, older in enumerate(holders):
            for newer in holders[i + 1 :]:
                began = min(s.entered for s in newer.accepted)
                if began < older.last_accepted:
                    found.append(Overlap(older, newer, older.last_accepted - began))
        return found

    def late_kills(self, job: str) -> list[LateKill]:
        """Each holder against the next: was all of the older one's tree dead before the newer
        entered?"""
        found = []
        for older, newer in itertools.pairwise(self.holders(job)):
            if older.end > newer.entered:
                found.append(LateKill(older, newer, older.end - newer.entered))
        return found

    def open_holder(self, job: str) -> Holder | None:
        """The newest holder of `job` with a member still connected."""
        live = [h for h in self.holders(job) if h.alive]
        return live[-1] if live else None


def peer_pid(connection: socket.socket) -> int:
    """The connected process's PID in our PID namespace (the kernel translates it)."""
    ucred = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, _uid, _gid = struct.unpack("3i", ucred)
    return int(pid)


def connect(path: Path) -> socket.socket:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(str(path))
    return client
