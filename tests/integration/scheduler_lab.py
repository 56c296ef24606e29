"""One `lockctl schedule` subprocess for the scheduler tests: its stderr events collected as
they come, stopped by signal or killed by its PID, its pipe closed at the end; with --listen on a
free loopback port, its /healthz and /metrics."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.lockctl_process import LOCKCTL

WAIT = 30.0
HOST = "127.0.0.1"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class SchedulerProcess:
    def __init__(
        self,
        config: Path,
        *flags: str,
        env: dict[str, str] | None = None,
        program: Sequence[str] = LOCKCTL,  # another lockctl: test_upgrade.py's previous release
    ) -> None:
        self.config = config
        self.process = subprocess.Popen(
            [*program, "schedule", "--config", str(config), *flags],
            env=env,
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


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


class ListeningScheduler(SchedulerProcess):
    """`lockctl schedule --listen` on a free loopback port."""

    def __init__(self, config: Path) -> None:
        self.port = free_port()
        super().__init__(config, "--listen", f"{HOST}:{self.port}")

    def get(self, path: str) -> tuple[int, str]:
        url = f"http://{HOST}:{self.port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def scrape(self) -> Samples:
        status, text = self.get("/metrics")
        assert status == 200, text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }
