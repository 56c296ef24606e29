"""tests/subnets.py: each pytest-xdist worker's clusters on /24s of their own."""

from __future__ import annotations

import pytest

from tests import subnets


@pytest.mark.parametrize(
    ("worker", "configured", "expected"),
    [
        (None, None, "127.0.2"),  # one process: the default
        ("gw0", None, "127.0.2"),
        ("gw1", None, "127.0.52"),
        ("gw3", "127.0.31", "127.0.181"),  # a developer's own subnet moves the same way
        ("gw4", None, "127.0.202"),
    ],
)
def test_each_worker_moves_the_subnet_by_its_stride(
    monkeypatch: pytest.MonkeyPatch, worker: str | None, configured: str | None, expected: str
) -> None:
    for name, value in (("PYTEST_XDIST_WORKER", worker), ("LOCKCTL_TEST_X_SUBNET", configured)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert subnets.worker_subnet("LOCKCTL_TEST_X_SUBNET", "127.0.2") == expected


def test_a_worker_whose_subnet_would_leave_the_octet_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw5")
    monkeypatch.setenv("LOCKCTL_TEST_X_SUBNET", "127.0.16")
    with pytest.raises(RuntimeError, match=r"LOCKCTL_TEST_X_SUBNET=127\.0\.16: worker 5's /24"):
        subnets.worker_subnet("LOCKCTL_TEST_X_SUBNET", "127.0.2")


def test_the_defaults_of_two_workers_never_meet() -> None:
    """The defaults' third octets (the federation's dc2 on the /24 after dc1's) and worker 1's."""
    octets = {2, 4, 10, 16, 17}
    assert not octets & {octet + subnets.WORKER_STRIDE for octet in octets}
