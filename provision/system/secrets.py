"""A token secret that cannot leak by accident: its repr and str are masked."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from provision.errors import InputError, LocalEnvironmentError
from provision.system.files import SECRET_MODE, write_atomically

MASK = "********"


@dataclass(frozen=True)
class Secret:
    """A secret string; `reveal()` is the only way to the value, so each use is greppable."""

    _value: str = field(repr=False)

    def reveal(self) -> str:
        return self._value

    def __str__(self) -> str:
        return MASK

    def __repr__(self) -> str:
        return f"Secret({MASK})"

    def __bool__(self) -> bool:
        return bool(self._value)


def read_secret_file(path: Path) -> Secret:
    """Read a token file (surrounding whitespace stripped, as Consul's own CLI does)."""
    try:
        value = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise InputError(f"{path}: cannot read token file: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: token file is not UTF-8 text") from None
    if not value:
        raise InputError(f"{path}: token file is empty")
    return Secret(value)


def write_secret_file(path: Path, secret: Secret) -> None:
    """Write `secret` to `path` atomically with mode 0600: readers see the old file or the new
    one, and a crash never leaves a half-written or world-readable token behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, secret.reveal() + "\n", mode=SECRET_MODE)


def check_writable(folder: Path, flag: str) -> None:
    """Create `folder` (0700) if needed and prove a file can be written there, before any change
    is made in Consul: a token whose secret cannot be saved is lost (`flag` names the option)."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".lockctl-probe.")
        os.close(fd)
        Path(probe).unlink()
    except OSError as exc:
        raise LocalEnvironmentError(
            f"{flag}: cannot write token files there ({exc.strerror})"
        ) from None
