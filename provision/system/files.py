"""Atomic file writes: a reader, or a crash, sees the old file or the new one, never half of one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

SECRET_MODE = 0o600
PUBLIC_MODE = 0o644


def write_atomically(path: Path, text: str, *, mode: int) -> Path:
    """Write `text` (UTF-8, newlines as given) to `path` with `mode`; returns `path`.

    The temporary file is made in the same folder, so the rename is atomic; mkstemp creates it
    0600, so a secret is never readable by others even for a moment, and it gets `mode` before
    the rename. It is fsynced first, so a crash never leaves a renamed but empty file, and it is
    removed on any failure, so none is left behind.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
