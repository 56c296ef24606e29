"""What the run keeps in .lockctl/vagrant/: report.txt, summary.json, and the secret check of them.

The end-of-run secret check searches every file kept (artifacts, logs, flow.log: the whole
output) for the token secrets the run minted, every line of the base64 body of each TLS private
key it made (the CA's, every agent's, lockctl's) and its gossip key, byte for byte, binary files
included.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flow.phases import parse_phases

MIN_KEY_LINE = 16  # a key body's short last line could match by chance; 16+ base64 chars cannot
PRIVATE_DIRS = ("run", "stage")  # removed at the end: the secrets live there during the run
RESET_FILES = ("report.txt", "summary.json", "phases.txt")
RESET_GLOBS = ("verify.*", "ticks.*", "scheduler.*")


def reset(art: Path) -> None:
    """Remove the last run's artifacts (the box cache lives elsewhere)."""
    for name in RESET_FILES:
        (art / name).unlink(missing_ok=True)
    for pattern in RESET_GLOBS:
        for path in art.glob(pattern):
            path.unlink()


def append_report(art: Path, line: str) -> None:
    """A line for both the output and report.txt."""
    print(line, flush=True)
    with (art / "report.txt").open("a", encoding="utf-8") as handle:
        handle.write(line + "\n")


def minted_secrets(secrets_dir: Path) -> list[bytes]:
    """Every token secret the run wrote (one per *.token file), never printed."""
    found = []
    for path in sorted(secrets_dir.glob("*.token")) if secrets_dir.is_dir() else []:
        found += [line.strip() for line in path.read_bytes().splitlines() if line.strip()]
    return found


@dataclass(frozen=True)
class RunSecrets:
    """Everything secret the run made, as the bytes to search for (never printed)."""

    tokens: list[bytes]
    key_lines: list[bytes]  # the body lines of every *-key.pem
    keys: int  # how many private keys those lines are of
    gossip_keys: list[bytes]

    @property
    def all(self) -> list[bytes]:
        return self.tokens + self.key_lines + self.gossip_keys

    def describe(self) -> str:
        gossip = " and the gossip key" if self.gossip_keys else ""
        return (
            f"{len(self.tokens)} token secrets, {self.keys} TLS private keys "
            f"({len(self.key_lines)} lines){gossip}"
        )


def private_key_lines(pem: bytes) -> list[bytes]:
    """The base64 body of a PEM private key, line by line (the BEGIN/END lines are no secret)."""
    lines = [line.strip() for line in pem.splitlines()]
    return [line for line in lines if len(line) >= MIN_KEY_LINE and not line.startswith(b"-----")]


def run_secrets(secrets_dir: Path, tls_dir: Path) -> RunSecrets:
    """The tokens in `secrets_dir`, the keys and the gossip key in `tls_dir` (vagrant/prepare)."""
    key_files = sorted(tls_dir.glob("*-key.pem")) if tls_dir.is_dir() else []
    gossip = tls_dir / "gossip.key"
    return RunSecrets(
        tokens=minted_secrets(secrets_dir),
        key_lines=[line for path in key_files for line in private_key_lines(path.read_bytes())],
        keys=len(key_files),
        gossip_keys=[gossip.read_bytes().strip()] if gossip.is_file() else [],
    )


def kept_files(art: Path) -> Iterable[Path]:
    """Every file the run keeps: everything under `art` but its private dirs."""
    for path in sorted(art.rglob("*")):
        relative = path.relative_to(art).parts
        if path.is_file() and not path.is_symlink() and relative[0] not in PRIVATE_DIRS:
            yield path


def files_holding(secrets: list[bytes], files: Iterable[Path]) -> list[Path]:
    return [path for path in files if any(secret in path.read_bytes() for secret in secrets)]


def check_no_secret_kept(art: Path, secrets_dir: Path, tls_dir: Path) -> bool:
    """False (and the files named in the report) if a secret the run made is in anything kept."""
    made = run_secrets(secrets_dir, tls_dir)
    if not made.all:
        return True
    leaks = files_holding(made.all, kept_files(art))
    if leaks:
        names = " ".join(str(path.relative_to(art)) for path in leaks)
        append_report(art, f"teardown: SECRET FOUND in: {names}")
        return False
    append_report(art, f"teardown: none of the {made.describe()} is in the artifacts or the output")
    return True


def build_summary(
    status: int, servers: int, workers: int, phases_text: str, art: Path
) -> dict[str, Any]:
    """summary.json: the exit status, sizes, whether verify, the tick check and the scheduler
    check passed, phases."""
    phases = parse_phases(phases_text)
    ticks_file = art / "ticks.json"
    ticks = json.loads(ticks_file.read_text(encoding="utf-8")) if ticks_file.is_file() else None
    sched_file = art / "scheduler.json"
    sched = json.loads(sched_file.read_text(encoding="utf-8")) if sched_file.is_file() else None
    return {
        "exit_status": status,
        "servers": servers,
        "workers": workers,
        "verify_junit": "verify.xml" if (art / "verify.xml").is_file() else None,
        "tick_check_passed": None if ticks is None else ticks["passed"],
        "scheduler_check_passed": None if sched is None else sched["passed"],
        "phases_s": phases,
        "total_s": round(sum(phases.values()), 1),
    }


def write_summary(art: Path, summary: dict[str, Any]) -> None:
    (art / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
