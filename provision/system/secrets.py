"""A token secret that cannot leak by accident: its repr and str are masked. Token files: read
with their content checked, written atomically 0600, and only ever with a real token secret."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from provision.errors import EXIT_DENIED, InputError, LocalEnvironmentError, LockctlError
from provision.system.files import SECRET_MODE, UnreadableFile, read_regular_file, write_atomically

MASK = "********"
# Consul (1.4+) makes every SecretID a UUID and refuses to be given one that is not; a redacted
# answer says "<hidden>" instead. Nothing else is ever written to a token file.
TOKEN_SECRET_PATTERN = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)
MAX_TOKEN_FILE_BYTES = 4096  # a token file is one line; anything bigger is not one


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


class NotATokenSecret(LockctlError):
    """A value about to be written as a token secret is not one (e.g. Consul's redacted
    "<hidden>", which is what a caller without acl = "write" is shown)."""

    exit_code = EXIT_DENIED


def is_token_secret(secret: Secret | None) -> bool:
    """Whether `secret` is shaped like a Consul token secret (a UUID)."""
    return secret is not None and TOKEN_SECRET_PATTERN.fullmatch(secret.reveal()) is not None


def read_secret_file(path: Path) -> Secret:
    """Read a token file (surrounding whitespace stripped, as Consul's own CLI does).

    The value goes into an HTTP header, so whitespace or control characters inside it (a
    second line) are bad input here, not a connection error later. At most
    MAX_TOKEN_FILE_BYTES are read: a token file is never bigger.
    """
    try:  # a regular file only: a FIFO as a token file would hang every command
        raw = read_regular_file(path, MAX_TOKEN_FILE_BYTES)
    except UnreadableFile as exc:
        raise InputError(f"{path}: cannot read token file: {exc}") from None
    if len(raw) > MAX_TOKEN_FILE_BYTES:
        raise InputError(f"{path}: not a token file (more than {MAX_TOKEN_FILE_BYTES} bytes)")
    try:
        value = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise InputError(f"{path}: token file is not UTF-8 text") from None
    if not value:
        raise InputError(f"{path}: token file is empty")
    if not value.isprintable() or any(char.isspace() for char in value):
        raise InputError(
            f"{path}: token file holds more than one token secret (whitespace or control "
            "characters inside it); it must hold one line"
        )
    return Secret(value)


def write_secret_file(path: Path, secret: Secret) -> None:
    """Write `secret` to `path` atomically with mode 0600: readers see the old file or the new
    one, and a crash never leaves a half-written or world-readable token behind.

    Only a real token secret is written: callers check first and say which permission is
    missing; this is the last line of defence.
    """
    if not is_token_secret(secret):
        raise NotATokenSecret(
            f"{path}: not written: the value is not a token secret (a redacted SecretID?)"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, secret.reveal() + "\n", mode=SECRET_MODE)


def check_writable(folder: Path, flag: str) -> None:
    """Create `folder` (0700) if needed and prove a file can be written there, before any change
    is made in Consul: a token whose secret cannot be saved is lost (`flag` names the option)."""
    try:
        import tempfile  # here, not at the top: `lockctl run` reads its token, writes none

        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".lockctl-probe.")
        os.close(fd)
        Path(probe).unlink()
    except OSError as exc:
        raise LocalEnvironmentError(
            f"{flag}: cannot write token files there ({exc.strerror})"
        ) from None
