"""The guarded resource: a Unix-socket server that sees every critical section, on its own clock.

A job connects, sends `enter` (job, worker, session, LockIndex, pid), then `write`s while it works,
then `exit`, one JSON object a line; every message is answered `{"ok": true|false}`. A write
(enter is the first) carrying a LockIndex LOWER than the highest this oracle accepted for the job
is rejected and counted: that is the fencing check a real resource would do with LOCK_INDEX. A
job without a LockIndex (`consul lock` gives its child none) cannot be fenced and is accepted.

Times are this process's time.monotonic() when a message arrives, and when the connection closes:
the kernel closes it when the job dies, so `closed` is when the job was dead. Namespaces share the
filesystem, so jobs in any network namespace reach the socket.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import socketserver
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from provision.system.processes import is_running


@dataclass
class Section:
    """One critical section: one job process from enter to its connection's close."""

    job: str
    worker: str
    session: str | None
    lock_index: int | None
    pid: int
    entered: float
    last_accepted: float
    exited: float | None = None  # the job said it was done
    closed: float | None = None  # the connection closed: the process was gone (or let go)
    writes: int = 0
    rejected_at: list[float] = field(default_factory=list)
    enter_rejected: bool = False

    @property
    def end(self) -> float:
        """When the job was last seen alive."""
        return self.closed if self.closed is not None else time.monotonic()


@dataclass(frozen=True)
class Overlap:
    """Two sections of one job whose ACCEPTED activity intersected: two holders acted at once."""

    older: Section
    newer: Section
    seconds: float


@dataclass(frozen=True)
class LateKill:
    """A holder's job still alive when the next holder's job entered."""

    older: Section
    newer: Section
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
                oracle._serve(self.rfile, self.wfile)

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
    def _serve(self, rfile: object, wfile: object) -> None:
        section: Section | None = None
        try:
            for raw in rfile:  # type: ignore[attr-defined]
                at = self.now()
                message = json.loads(raw)
                ok = self._handle(message, at, section)
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

    def _handle(self, message: dict[str, object], at: float, section: Section | None) -> object:
        op = message.get("op")
        with self._lock:
            if op == "enter":
                index = message.get("lock_index")
                new = Section(
                    job=str(message["job"]),
                    worker=str(message["worker"]),
                    session=None if message.get("session") is None else str(message["session"]),
                    lock_index=None if index is None else int(str(index)),
                    pid=int(str(message["pid"])),
                    entered=at,
                    last_accepted=at,
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

    def overlaps(self, job: str) -> list[Overlap]:
        """Pairs whose accepted activity [entered, last accepted write] intersects."""
        sections = [s for s in self.of_job(job) if not s.enter_rejected]
        found = []
        for i, older in enumerate(sections):
            for newer in sections[i + 1 :]:
                if newer.entered < older.last_accepted:
                    found.append(Overlap(older, newer, older.last_accepted - newer.entered))
        return found

    def late_kills(self, job: str) -> list[LateKill]:
        """Each section against the next one: was the older job dead before the newer entered?"""
        sections = self.of_job(job)
        found = []
        for older, newer in itertools.pairwise(sections):
            if older.end > newer.entered:
                found.append(LateKill(older, newer, older.end - newer.entered))
        return found

    def open_section(self, job: str) -> Section | None:
        """The newest section of `job` that is still connected."""
        live = [s for s in self.of_job(job) if s.closed is None]
        return live[-1] if live else None


def kill_leftover_jobs(oracle: Oracle, marker: str) -> list[int]:
    """SIGKILL job processes still alive (only those whose argv carries `marker`)."""
    killed = []
    for section in list(oracle.sections):
        if is_running(section.pid, marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(section.pid, signal.SIGKILL)
            killed.append(section.pid)
    return killed


def connect(path: Path) -> socket.socket:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(str(path))
    return client
