"""The job's stdout and stderr: still where they went before, and their ends kept for the record.

Before, the job inherited the runner's descriptors 1 and 2 (a terminal, the journal of a unit).
Now each is a pipe, and the process's output pump (runner/pump.py: one thread for every job's
pipes) copies every chunk to the runner's same descriptor as it comes (a tee: nothing is held
back or reordered within a stream) and keeps the last bytes (system/tails.py). The copy
writes as the job did, blocking: a slow journal slows the jobs as it did. A descriptor of ours
that is closed or broken is left; the tail is still kept.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from provision.runner.pump import output_pump
from provision.system.tails import MIN_SECRET, TailBuffer, output_tail

DRAIN_TIMEOUT = 2.0  # seconds to read what the job's last processes wrote, once they are gone
KEY_FILE_MAX = 65536  # bytes of a TLS key file read for its lines to mask


class _Stream:
    """One of the job's two streams: a pipe whose chunks the pump (runner/pump.py) hands here,
    to be kept (the tail) and copied to our descriptor `target`."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.read_end, self.write_end = os.pipe()
        self.tail = TailBuffer()
        self.pumped = False  # the pump has the read end: it closes it at end of file
        self.done = threading.Event()
        self.target_broken = False

    def received(self, chunk: bytes) -> None:
        self.tail.write(chunk)
        if not self.target_broken:
            self._forward(chunk)

    def ended(self) -> None:
        self.read_end = -1
        self.done.set()

    def _forward(self, chunk: bytes) -> None:
        view = memoryview(chunk)
        try:
            while view:
                view = view[os.write(self.target, view) :]
        except OSError:  # closed, a broken pipe: the job must not stall or die for it
            self.target_broken = True


class OutputTee:
    """Pipes for the job's stdout and stderr (`child_fds`), tee'd to ours (1 and 2) by the
    process's one output pump."""

    def __init__(self) -> None:
        self.streams = (_Stream(1), _Stream(2))

    @property
    def child_fds(self) -> tuple[int, int]:
        return self.streams[0].write_end, self.streams[1].write_end

    def start(self) -> None:
        """The job has its ends: close ours (the job's end of file is then the pipe's), copy."""
        pump = output_pump()
        for stream in self.streams:
            _close(stream.write_end)
            stream.write_end = -1
            stream.pumped = True
            pump.add(stream)

    def tails(self, secrets: Iterable[str]) -> tuple[str | None, str | None]:
        """The ends of stdout and stderr, masked and printable (None: the stream said nothing),
        once the pump read what the job's processes wrote (they are gone: end of file)."""
        known = list(secrets)
        found = []
        deadline = time.monotonic() + DRAIN_TIMEOUT
        for stream in self.streams:
            if stream.pumped:
                stream.done.wait(max(0.0, deadline - time.monotonic()))
            raw, cut = stream.tail.snapshot()
            found.append(output_tail(raw, cut, known) or None)
        return found[0], found[1]

    def close(self) -> None:
        for stream in self.streams:
            _close(stream.write_end)
            stream.write_end = -1
            if not stream.pumped:
                _close(stream.read_end)
                stream.read_end = -1
            # else: the pump closes it at end of file (a process outside the job's tree may
            # still write: the pump reads on)


def _close(fd: int) -> None:
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)


def runner_secrets(
    token: str | None, environ: Mapping[str, str], client_key: Path | None
) -> list[str]:
    """What the runner knows that must never reach a record: its token secret (however it was
    given), and each line of its TLS client key."""
    found = [token or "", environ.get("CONSUL_HTTP_TOKEN", "").strip()]
    if client_key is not None:
        found += key_lines(client_key)
    return [secret for secret in found if len(secret) >= MIN_SECRET]


# A scheduler asks for the key's lines at every run: a stat each time, a read when it changed.
_key_lines: dict[str, tuple[tuple[int, ...], tuple[str, ...]]] = {}
_key_lines_lock = threading.Lock()


def key_lines(client_key: Path) -> tuple[str, ...]:
    """The lines of the TLS client key (not its armour), read again whenever the file's inode,
    size, mtime or ctime differ from the read before (a rotation by rename or in place). The
    stat comes before the read: a change between them is seen at the next call."""
    path = os.fspath(client_key)
    try:
        found = os.stat(path)
    except OSError:
        return ()
    signature = (found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns)
    with _key_lines_lock:
        cached = _key_lines.get(path)
    if cached is not None and cached[0] == signature:
        return cached[1]
    try:
        with open(path, "rb") as handle:
            text = handle.read(KEY_FILE_MAX).decode("utf-8", errors="replace")
    except OSError:
        return ()
    lines = tuple(line.strip() for line in text.splitlines() if "-----" not in line)
    with _key_lines_lock:
        _key_lines[path] = (signature, lines)
    return lines
