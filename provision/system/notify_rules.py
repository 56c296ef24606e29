"""A job's notifications as the spec and the worker config carry them: each `notify "NAME"`
block (the file its webhook URL is kept in, and which outcomes it is told of) and the job's
`ping_url_file` (a dead-man's switch). Only file paths travel: the URLs are secrets, read on
the worker from files only it may read (`read_url_file`), never from the spec or lockctl.json.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from provision.durations import DurationSyntaxError, parse_duration
from provision.errors import InputError
from provision.system.files import UnreadableFile, read_regular_file
from provision.system.secrets import Secret

# what a notify block may be told of: a run that failed (or was stopped at its timeout), a
# tick nobody ran, a run whose lock was lost, and the first success after any of those
ON_VALUES = ("failed", "missed", "lost", "recovered")
MAX_URL_FILE_BYTES = 4096  # a URL on one line; anything bigger is not one
MAX_PATH = 1024
MAX_TARGETS = 16  # notify blocks per job: more is no alerting anyone means
PING = "ping"  # how a job's ping is named in events and metrics: no notify block's NAME
PING_TAKEN = f'"{PING}" names the ping URL in events and metrics: choose another name'
_PATH = re.compile(r"/[A-Za-z0-9._/+@=,-]*")
_URL = re.compile(r"https?://[^\s/?#]+[^\s]*")


@dataclass(frozen=True)
class NotifyTarget:
    """One `notify "NAME"` block: a webhook told of the outcomes in `on` (ON_VALUES order);
    an outcome that repeats the tick before's is told again once per `repeat_after` (a Go
    duration), never without it."""

    name: str
    url_file: str
    on: tuple[str, ...] = ON_VALUES
    repeat_after: str | None = None

    @property
    def repeat_seconds(self) -> float | None:
        return None if self.repeat_after is None else parse_duration(self.repeat_after).seconds


@dataclass(frozen=True)
class Notifications:
    """A job's notify blocks (sorted by name) and its ping URL's file, if any."""

    targets: tuple[NotifyTarget, ...] = ()
    ping_url_file: str | None = None

    def __bool__(self) -> bool:
        return bool(self.targets) or self.ping_url_file is not None

    def files(self) -> list[tuple[str, str]]:
        """(where, path) of each URL file: `notify.NAME.url_file`, `ping_url_file`."""
        found = [(f"notify.{t.name}.url_file", t.url_file) for t in self.targets]
        return found + ([("ping_url_file", self.ping_url_file)] if self.ping_url_file else [])


NO_NOTIFICATIONS = Notifications()


def url_file_problem(path: object) -> str | None:
    """Why `path` cannot name a URL file on the worker, or None: an absolute path of plain
    characters (it is written into lockctl.json and named in messages)."""
    if not isinstance(path, str):
        return "must be a string: the absolute path of a file holding the URL"
    if len(path) > MAX_PATH or not _PATH.fullmatch(path) or "/../" in f"{path}/":
        return (
            "must be an absolute path of letters, digits and . _ / + @ = , - "
            "(the file on each worker that holds the URL; never the URL itself)"
        )
    return None


def on_problem(values: object) -> str | None:
    """Why `values` is not a list of outcomes a notify block can be told of, or None."""
    expected = ", ".join(f'"{v}"' for v in ON_VALUES)
    if not isinstance(values, (list, tuple)) or not values:
        return f"must be a non-empty list of {expected}"
    for value in values:
        if value not in ON_VALUES:
            shown = str(value)[:40].encode("unicode_escape").decode("ascii")
            return f'"{shown}" is not an outcome to notify of; expected {expected}'
    if len(set(values)) != len(values):
        return "names an outcome twice"
    return None


def repeat_problem(text: object) -> str | None:
    """Why `text` is not a `repeat_after` (a Go duration of at least a second), or None."""
    if not isinstance(text, str):
        return 'must be a duration string such as "4h"'
    try:
        seconds = parse_duration(text).seconds
    except DurationSyntaxError as exc:
        return str(exc)
    if seconds < 1:
        return f'"{text}" is less than 1s; the repeats of an outcome need a window of 1s or more'
    return None


def ordered_on(values: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    return tuple(value for value in ON_VALUES if value in values)


def check_url_files(notifications: Notifications, where: str) -> None:
    """Each URL file of a job read and checked (InputError: `where`, the file, why): what a
    run checks before its cheap skip, so that every replica says a bad file, not only the one
    that runs."""
    for _, path in notifications.files():
        try:
            read_url_file(Path(path))
        except InputError as exc:
            raise InputError(f"{where}: {exc}") from None


def read_url_file(path: Path) -> Secret:
    """The URL in `path`, checked: a regular file this user owns that nobody else may read
    (0600 or 0400), one http or https URL on one line. InputError naming the path (never the
    URL) when it is not."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise InputError(f"{path}: cannot read URL file: {exc.strerror}") from None
    if stat.S_IMODE(info.st_mode) & 0o077:
        mode = f"{stat.S_IMODE(info.st_mode):04o}"
        raise InputError(
            f"{path}: URL file has mode {mode}; it holds a secret, so others must not read it "
            f"(chmod 600 {path})"
        )
    if info.st_uid != os.geteuid():
        raise InputError(f"{path}: URL file is not owned by the user lockctl runs as")
    try:
        raw = read_regular_file(path, MAX_URL_FILE_BYTES)
    except UnreadableFile as exc:
        raise InputError(f"{path}: cannot read URL file: {exc}") from None
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise InputError(f"{path}: URL file is not UTF-8 text") from None
    if len(raw) > MAX_URL_FILE_BYTES or not _URL.fullmatch(text):
        raise InputError(f"{path}: URL file must hold one http:// or https:// URL on one line")
    return Secret(text)
