"""Loaded only by the processes a test runs under libfaketime (their PYTHONPATH names this
directory). libfaketime 0.9.10, Debian 12's, fails Python 3.11's time.sleep with EINVAL when the
monotonic clock is left real (FAKETIME_DONT_FAKE_MONOTONIC, as a real clock step leaves it): it
rewrites clock_nanosleep's absolute monotonic deadline by the wall clock's offset
(wolfcw/libfaketime#426). Sleeping through select, which it does not touch, is the same sleep."""

import select
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        select.select([], [], [], left)


time.sleep = _sleep
