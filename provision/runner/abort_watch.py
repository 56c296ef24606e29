"""`lockctl abort JOB` heard by `lockctl run` of a scheduled job: while its run holds the lock, one
blocking read of the job's abort key (lockctl/control/JOB/abort) hands each note not heard before
to the tick core, which stops the run only when the note names it (tick/core.py `abort`, by
ledger/aborts.py `stops`: its tick and its session), as it does in `lockctl schedule`.

    started   by the run's first body (its claim won): a run over within WATCH_AFTER costs
              Consul no read; the first read (index 0) answers at once, so a note written since
              the claim is heard then
    stopped   at the turn's end (runner/on_core.py): a read still out ends with the process
              (a daemon thread, never joined: its blocking read may wait ABORT_WAIT more)
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from provision.consul import Consul, ConsulError
from provision.consul.watch import watch_tree
from provision.ledger.aborts import ABORT_MAX_BYTES, AbortNote, decode_abort
from provision.system.control_keys import abort_key

ABORT_WAIT = 60.0  # seconds per blocking read of the abort key (Consul answers at a change)
WATCH_AFTER = 1.0  # seconds after the body's start before the first read (as a plain lock's)
ERROR_PAUSE = 1.0  # seconds before a read Consul did not answer is sent again


class AbortWatch:
    """One thread: each abort note of `job` not heard before goes to `hand(note)` (from this
    thread: `hand` passes it to the core's clock)."""

    def __init__(self, consul: Consul, job: str, hand: Callable[[AbortNote], None]) -> None:
        self.consul, self.key, self.hand = consul, abort_key(job), hand
        self.stopped = threading.Event()
        self.heard: set[str] = set()  # abort ids handed on already
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Once, from the clock's thread when a body starts; a later call does nothing."""
        if self._thread is None and not self.stopped.is_set():
            self._thread = threading.Thread(target=self._run, name="lockctl-abort", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """No note is handed on after this returns (a read out is left to end by itself)."""
        self.stopped.set()

    def _run(self) -> None:
        if self.stopped.wait(WATCH_AFTER):
            return
        index = 0  # the first read answers at once
        while not self.stopped.is_set():
            try:  # the key as a prefix: consul/watch.py's index rules, an absent key as []
                transport, size = self.consul.transport, ABORT_MAX_BYTES * 2
                entries, index = watch_tree(transport, self.key, index, ABORT_WAIT, max_bytes=size)
            except ConsulError:
                index = 0
                self.stopped.wait(ERROR_PAUSE)
                continue
            for entry in entries:
                note = decode_abort(entry.value) if entry.key == self.key else None
                if note is not None and note.note.id not in self.heard:
                    self._hand(note)

    def _hand(self, note: AbortNote) -> None:
        assert note.note.id is not None  # decode_abort: a note without an id is none
        self.heard.add(note.note.id)
        if not self.stopped.is_set():
            self.hand(note)
