"""Files: atomic writes (a reader, or a crash, sees the old file or the new one, never half of
one), bounded reads of regular files, and the check that a folder can be written before any
file goes into it."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from provision.errors import LocalEnvironmentError

SECRET_MODE = 0o600
PUBLIC_MODE = 0o644


def write_atomically(path: Path, text: str, *, mode: int) -> Path:
    """Write `text` (UTF-8, newlines as given) to `path` with `mode`; returns `path`.

    The temporary file is made in the same folder, so the rename is atomic; mkstemp creates it
    0600, so a secret is never readable by others even for a moment, and it gets `mode` before
    the rename. It is fsynced first, so a crash never leaves a renamed but empty file, and it is
    removed on any failure, so none is left behind.
    """
    import tempfile  # here, not at the top: `lockctl run`'s skip writes no file (~2 ms)

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
    import shutil
    import tempfile

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


class UnreadableFile(Exception):
    """A file lockctl cannot or will not read; the message is the reason, to follow "cannot
    read:" (an OS error's text, or what the file is instead of a regular file)."""


_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def read_regular_file(path: Path, max_bytes: int) -> bytes:
    """The bytes of the regular file at `path`; at most `max_bytes` + 1 of them, so the caller
    can tell a file that is too large without holding all of it.

    Anything but a regular file is refused before a byte is read: a FIFO would wait for a
    writer forever and /dev/zero never ends. The open does not block (O_NONBLOCK: a FIFO with no
    writer would otherwise hang the open itself), and the type is taken from the open file
    (fstat), so a swap between a check and the open cannot slip a device in.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise UnreadableFile(exc.strerror or str(exc)) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a plain file")
            raise UnreadableFile(f"{kind}, not a regular file")
        chunks, left = [], max_bytes + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise UnreadableFile(exc.strerror or str(exc)) from None
    finally:
        os.close(fd)


def folder_write_problem(folder: Path) -> str | None:
    """Why files cannot be written into `folder` (made first if missing), or None when they can.

    Asked before a command writes anything, so it fails whole instead of half-way. The test is
    real, not a guess from mode bits (root ignores those; a read-only mount does not): a probe
    file is made and removed in the folder, or in its nearest existing parent when the folder
    has yet to be made. Nothing is left behind.
    """
    wanted = Path(os.path.abspath(folder))
    existing = wanted
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        where = "" if existing == wanted else f"{existing} "
        kind = "a file" if existing.is_file() else "a broken link" if existing.is_symlink() else ""
        return f"{where}is {kind or 'something else'}, not a folder"
    import tempfile

    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".lockctl-probe-")
    except OSError as exc:
        return f"cannot write in {existing} ({exc.strerror or exc})"
    os.close(fd)
    os.unlink(probe)
    return None


def require_writable_folders(flag: str, folders: Iterable[Path]) -> None:
    """Raise `LocalEnvironmentError` (exit 6) for the first of `folders` no file can be written
    into, naming `flag`: the value is well formed, the machine has something else there."""
    for folder in folders:
        problem = folder_write_problem(folder)
        if problem is not None:
            raise LocalEnvironmentError(f"{flag} {folder}: {problem}")
