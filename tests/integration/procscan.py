"""Finding a test's processes by a marker in their argv (a `sleep 300.<digits>` no other process
has), to prove that none of a job's processes survived; and whether a process has a handler for
a signal yet (to signal it the instant it does)."""

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


def catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler for `signum` now (SigCgt in /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text(encoding="ascii")
    except OSError:
        return False
    (mask,) = [line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")]
    return bool(int(mask, 16) >> (signum - 1) & 1)
