"""One `lockctl schedule` subprocess for the scheduler tests: its stderr events collected as
they come, stopped by signal or killed by its PID, its pipe closed at the end."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

LOCKCTL = [sys.executable, "-m", "provision"]
WAIT = 30.0


class SchedulerProcess:
    def __init__(self, config: Path, *flags: str) -> None:
        self.config = config
        self.process = subprocess.Popen(
            [*LOCKCTL, "schedule", "--config", str(config), *flags],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        found = [json.loads(line) for line in list(self.lines) if line.startswith("{")]
        return [e for e in found if name is None or e["event"] == name]

    def stop(self, signum: int = signal.SIGTERM) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signum)
        code = self.process.wait(WAIT)
        self._close()
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(WAIT)
        self._close()

    def _close(self) -> None:
        self._reader.join(5)
        if not self._reader.is_alive() and self.process.stderr is not None:
            self.process.stderr.close()
