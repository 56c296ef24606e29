"""scripts/install-consul on a clean cache: fetches Debian's consul with apt, then reuses it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "install-consul"


def _run(cache: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CONSUL_BIN"}
    env.update(PATH="/usr/sbin:/usr/bin:/sbin:/bin", LOCKCTL_CACHE_DIR=str(cache), **extra)
    return subprocess.run(
        [str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600, check=False
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="apt download into a private state needs root")
def test_fetches_into_a_clean_cache_then_reuses_it(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _run(cache)
    assert first.returncode == 0, first.stderr
    binary = cache / "consul" / "debian-bullseye" / "consul"
    assert first.stdout.strip() == f"consul 1.8.7 at {binary} (from apt)"
    assert os.access(binary, os.X_OK)
    sources = (cache / "consul" / "apt" / "sources.list").read_text()
    assert " bullseye main" in sources

    second = _run(cache)
    assert second.returncode == 0
    assert second.stdout.strip() == f"consul 1.8.7 at {binary} (from cache)"


def test_consul_bin_is_reported_without_fetching(tmp_path: Path) -> None:
    fake = tmp_path / "consul"
    fake.write_text("#!/bin/sh\necho 'Consul v1.21.0'\n")
    fake.chmod(0o755)
    done = _run(tmp_path / "cache", CONSUL_BIN=str(fake))
    assert done.returncode == 0
    assert done.stdout.strip() == f"consul 1.21.0 at {fake} (from CONSUL_BIN)"
    assert not (tmp_path / "cache").exists()


def test_unusable_consul_bin_is_one_line_and_exit_6(tmp_path: Path) -> None:
    done = _run(tmp_path / "cache", CONSUL_BIN=str(tmp_path / "missing"))
    assert done.returncode == 6
    assert done.stderr.count("\n") == 1
    assert "CONSUL_BIN=" in done.stderr and "not an executable file" in done.stderr
