"""The end of a job's output, made fit for its tick record: bounded, printable, secrets masked.

Pure: bytes in, text out. A job writes whatever it likes (binary, terminal escapes, the token
it should never have seen), and the tail is stored in Consul and shown by `history`, so:

    the last TAIL_BYTES bytes seen -> a cut secret's visible end dropped -> UTF-8 (replacement)
    -> every secret the runner knows masked -> controls other than newline and tab escaped
    -> the newest part that fits the record's budget (encoded as JSON, in bytes)
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable

from provision.system.text import printable

TAIL_BYTES = 4096  # of each stream, kept while the job runs (the record keeps less: its budget)
MASKED = "[masked]"
MIN_SECRET = 8  # characters: a shorter "secret" (an empty token, "root") is not masked
KEPT_CONTROLS = frozenset("\n\t")


class TailBuffer:
    """The last `size` bytes written to it (thread-safe), and whether anything was cut."""

    def __init__(self, size: int = TAIL_BYTES) -> None:
        self.size = size
        self._data = bytearray()
        self._seen = 0
        self._lock = threading.Lock()

    def write(self, chunk: bytes) -> None:
        with self._lock:
            self._seen += len(chunk)
            self._data += chunk[-self.size :]
            del self._data[: max(0, len(self._data) - self.size)]

    def snapshot(self) -> tuple[bytes, bool]:
        """The bytes kept, and whether earlier ones were dropped."""
        with self._lock:
            return bytes(self._data), self._seen > len(self._data)


def sanitise(text: str) -> str:
    """`text` with every character `printable` would escape escaped, but newlines and tabs.
    The usual output (printable but for its line breaks and tabs) costs C-speed checks only."""
    if text.replace("\n", "").replace("\t", "").isprintable():
        return text
    return "".join(char if char in KEPT_CONTROLS else printable(char) for char in text)


def mask_secrets(text: str, secrets: Iterable[str]) -> str:
    """Every occurrence of each secret (longest first: one may contain another) replaced."""
    for secret in sorted({s for s in secrets if len(s) >= MIN_SECRET}, key=len, reverse=True):
        text = text.replace(secret, MASKED)
    return text


def output_tail(raw: bytes, cut: bool, secrets: Iterable[str]) -> str:
    """The kept bytes of a stream as safe text. When earlier bytes were dropped (`cut`), a
    secret may straddle the cut: its visible end is not a whole secret and would not be masked,
    so as many bytes as the longest secret are dropped from the front first."""
    known = [s for s in secrets if len(s) >= MIN_SECRET]
    if cut:
        longest = max((len(s.encode()) for s in known), default=0)
        raw = raw[longest:]
        raw = raw.lstrip(bytes(range(0x80, 0xC0)))  # a character cut in two at the front
    return sanitise(mask_secrets(raw.decode("utf-8", errors="replace"), known))


def encoded_size(text: str) -> int:
    """Bytes `text` takes as a JSON string in a record (quotes included)."""
    return len(json.dumps(text, ensure_ascii=False).encode())


def newest_within(text: str, budget: int) -> str:
    """The longest end of `text` whose JSON encoding takes at most `budget` bytes: a binary
    search for its start (a longer end never takes fewer bytes), a few C-speed encodings."""
    if encoded_size(text) <= budget:
        return text
    fits, too_long = len(text), 0  # text[fits:] fits (the empty end does), text[too_long:] not
    while fits - too_long > 1:
        middle = (fits + too_long) // 2
        if encoded_size(text[middle:]) <= budget:
            fits = middle
        else:
            too_long = middle
    return text[fits:]


def newest_lines_within(text: str, budget: int) -> str:
    """`newest_within`, beginning at a line when that cut one in two (and a later line is
    kept): a stored tail reads from a line's start."""
    kept = newest_within(text, budget)
    if not kept or len(kept) == len(text) or text[-len(kept) - 1] == "\n":
        return kept
    first_break = kept.find("\n")
    return kept[first_break + 1 :] if 0 <= first_break < len(kept) - 1 else kept
