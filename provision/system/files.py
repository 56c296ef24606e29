"""Atomic file writes: a reader, or a crash, sees the old file or the new one, never half of one."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
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


def write_all_or_none(
    root: Path,
    files: Mapping[Path, str],
    *,
    mode: int,
    check: Callable[[Path], None] | None = None,
) -> list[Path]:
    """Write every file of `files` (paths relative to `root`) or none of them; returns the paths.

    All are first written (fsynced) into a staging folder inside `root`, where `check(staging)`
    may read them and raise. Only then is each renamed into place: no rendering, writing or check
    can fail once the first file has moved, as every target folder exists and no target is a
    folder by then. On a failure the staging folder goes, and so do the folders this call made.
    """
    made = _make_folders(root)
    try:
        staging = Path(tempfile.mkdtemp(dir=root, prefix=".staging-", suffix=".tmp"))
    except BaseException:
        _remove_empty(made)
        raise
    try:
        for relative, text in files.items():
            (staging / relative).parent.mkdir(parents=True, exist_ok=True)
            write_atomically(staging / relative, text, mode=mode)
        if check is not None:
            check(staging)
        for relative in files:
            made += _make_folders((root / relative).parent)
            if (root / relative).is_dir():
                raise IsADirectoryError(errno.EISDIR, "is a folder", str(root / relative))
        for relative in files:
            os.replace(staging / relative, root / relative)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        _remove_empty(made)
        raise
    shutil.rmtree(staging, ignore_errors=True)
    return [root / relative for relative in files]


def _make_folders(folder: Path) -> list[Path]:
    """Make `folder` and its missing parents; returns those it made, deepest first."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    return missing


def _remove_empty(folders: list[Path]) -> None:
    for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            folder.rmdir()  # only while empty: never what someone else put there
