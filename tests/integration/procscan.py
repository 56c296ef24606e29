"""Finding a test's processes by a marker in their argv (a `sleep 300.<digits>` no other process
has), to prove that none of a job's processes survived."""

from __future__ import annotations

from pathlib import Path


def pids_with(marker: str) -> list[int]:
    """Living processes whose argv contains `marker` (zombies have an empty cmdline)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in argv:
            found.append(int(entry.name))
    return found
