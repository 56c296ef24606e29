"""Keyed jobs' keys (provision/keyed.py): which keys are taken, and where a key's lock and
ledger live (under the job's prefix, so the job's policy covers them)."""

from __future__ import annotations

import pytest

from provision.keyed import key_problem, keyed_lock_key, keys_folder, keys_in
from provision.ledger.records import ticks_prefix
from provision.workers.job_config import JobConfig
from tests.unit.tick_fleet import TIMINGS


@pytest.mark.parametrize(
    "key",
    ["a", "7", "tenant-42", "acme.example.com", "Tenant_42", "x" * 128, "a.b-c_d"],
)
def test_a_key_of_letters_digits_dots_dashes_underscores_is_taken(key: str) -> None:
    assert key_problem(key) is None


@pytest.mark.parametrize(
    "key",
    [
        "",
        "x" * 129,
        "a/b",  # a KV path segment: never a folder of its own
        "..",
        "a..b",
        ".hidden",
        "trailing.",
        "-flag",  # never read as an option where it is passed on
        "tenant 42",
        "t\x1b[2J",  # a terminal's escape
        "ténant",
        "a\nb",
        "a\x00b",
        "%2e%2e",
    ],
)
def test_any_other_key_is_refused_never_escaped(key: str) -> None:
    problem = key_problem(key)
    assert problem is not None and problem.startswith("must be 1-128 characters")


@pytest.mark.parametrize("key", [None, 42, b"tenant", ["a"]])
def test_a_key_that_is_not_text_is_refused(key: object) -> None:
    assert key_problem(key) == "must be a string"


def test_a_keys_lock_and_ledger_are_under_the_jobs_prefix() -> None:
    lock = keyed_lock_key("locks/report/.lock", "tenant-42")
    assert lock == "locks/report/keys/tenant-42/.lock"
    assert ticks_prefix(lock) == "locks/report/keys/tenant-42/ticks/"
    assert keys_folder("locks/report/.lock") == "locks/report/keys/"
    assert lock.startswith("locks/report/")  # the job's policy: key_prefix "locks/report/"
    with pytest.raises(ValueError, match="not a key"):
        keyed_lock_key("locks/report/.lock", "../other")


def test_a_keyed_job_config_keeps_its_name_and_timings() -> None:
    job = JobConfig("report", "locks/report/.lock", TIMINGS, "@every 10s")
    keyed = job.keyed("tenant-42")
    assert (keyed.name, keyed.timings, keyed.schedule) == ("report", TIMINGS, "@every 10s")
    assert (keyed.lock_key, keyed.key) == ("locks/report/keys/tenant-42/.lock", "tenant-42")
    assert job.key is None


def test_the_keys_seen_are_the_folders_under_keys_that_name_a_key() -> None:
    folder = "locks/report/keys/"
    names = [
        "locks/report/keys/tenant-42/",
        "locks/report/keys/acme.example.com/",
        "locks/report/keys/tenant-42/",  # listed twice: once
        "locks/report/keys/stray",  # a key, not a folder: no run wrote it
        "locks/report/keys/bad key/",  # no key's name
        "locks/other/keys/x/",
    ]
    assert keys_in(names, folder) == ["acme.example.com", "tenant-42"]
    assert keys_in([], folder) == []
