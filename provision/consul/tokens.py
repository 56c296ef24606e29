"""The token a client sends by default, and the file it came from: re-read when Consul refuses it.

`lockctl rotate` writes a worker's new token to the worker's token file, then deletes the old
token. A process that read the file before (a `lockctl run` whose job is running, a scheduler)
is refused from then on (403 "ACL not found", once its agent's ACL cache lets the old token go).
So on a 403 the transport asks `refresh`: when the file now holds another token, that one is
sent once in the refused call's place, and by every later call of every client sharing this
source. Only a token that was read from that file is ever replaced by the file's
(settings.token_file_to_reread): a client given another token in its place (verify's probes with
none, or with another worker's, over settings that name the management token's file) keeps its
403. The token never goes anywhere but the header: not in an error, a log line or argv.
"""

from __future__ import annotations

import threading
from pathlib import Path

from provision.errors import InputError
from provision.system.secrets import Secret, read_secret_file


def newer_token(refused: Secret | None, current: Secret | None, on_file: Secret | None) -> bool:
    """Whether the file's token is worth a retry of a call refused with `refused`: it is there,
    it is not the refused one, and nobody switched to another meanwhile (then `current`, the
    token now in use, is retried instead: see TokenSource.refresh)."""
    return on_file is not None and on_file != refused and current == refused


class TokenSource:
    """The token calls send by default; safe to use from every thread."""

    def __init__(self, token: Secret | None, path: Path | None) -> None:
        self.path = path
        self._token = token
        self._lock = threading.Lock()

    @property
    def current(self) -> Secret | None:
        with self._lock:
            return self._token

    def refresh(self, refused: Secret | None) -> Secret | None:
        """The token to send instead of `refused`, which Consul just refused: the one another
        call already switched to, else the file's when it holds another; None when there is
        none (no file, the same token, a file that cannot be read now): the refusal stands."""
        with self._lock:  # one re-read however many calls were refused at once
            if self._token != refused:
                # another thread has switched already (or a login replaced the token that a
                # logout has just revoked: consul/login.py): try that one
                return self._token
            if self.path is None:
                return None
            on_file = self._read()
            if not newer_token(refused, self._token, on_file):
                return None
            self._token = on_file
            return on_file

    def replace(self, token: Secret | None) -> None:
        """Send `token` from now on (a reload read it from the same file)."""
        with self._lock:
            self._token = token

    def _read(self) -> Secret | None:
        assert self.path is not None
        try:
            return read_secret_file(self.path)
        except InputError:  # gone, empty or half written just now: keep what we have
            return None
