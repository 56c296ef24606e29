"""Every test module's name is unique across tests/: pytest imports them by basename (rootdir
import mode), and a second module of the same name stops the whole run at collection."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_name() -> None:
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    assert sorted(name for name, count in names.items() if count > 1) == []
