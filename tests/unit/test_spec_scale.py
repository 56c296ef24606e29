"""The spec's checks across jobs stay right and stay fast at fleet size: the prefix overlap
check (sort, then compare neighbours) gives exactly what comparing every pair gave."""

from __future__ import annotations

import random
import time

from provision.spec.values import prefix_overlaps, prefix_relation


def _every_pair(jobs: list[tuple[str, str]]) -> list[tuple[int, int, str]]:
    """The old check: each job against every earlier one (a repeated name left out)."""
    found = []
    seen: dict[str, int] = {}
    for index, (name, prefix) in enumerate(jobs):
        if name in seen:
            continue
        for other in seen.values():
            relation = prefix_relation(prefix, jobs[other][1])
            if relation:
                found.append((index, other, relation))
        seen[name] = index
    return found


def test_overlaps_are_the_ones_every_pair_gives() -> None:
    rng = random.Random(5)
    segments = ["a", "b", "ab", "a.b", "a-", "z"]
    for _ in range(300):
        jobs = []
        for _ in range(rng.randint(0, 12)):
            depth = rng.randint(1, 3)
            prefix = "/".join(rng.choice(segments) for _ in range(depth)) + "/"
            jobs.append((rng.choice("pqrstu"), prefix))
        assert prefix_overlaps(jobs) == _every_pair(jobs), jobs


def test_relations() -> None:
    assert prefix_relation("locks/a/", "locks/a/") == "is the same as"
    assert prefix_relation("locks/a/b/", "locks/a/") == "is inside"
    assert prefix_relation("locks/a/", "locks/a/b/") == "contains"
    assert prefix_relation("locks/a/", "locks/ab/") is None


def test_ten_thousand_prefixes_are_checked_in_well_under_a_second() -> None:
    jobs = [(f"j{n}", f"locks/j{n}/") for n in range(10_000)]
    jobs.append(("inner", "locks/j7/x/"))
    began = time.perf_counter()
    found = prefix_overlaps(jobs)
    assert time.perf_counter() - began < 1.0
    assert found == [(10_000, 7, "is inside")]


def test_the_quick_prefix_check_agrees_with_every_rule() -> None:
    """prefix_problem's shortcut for plain prefixes says None only where no rule objects."""
    from provision.spec import values

    rng = random.Random(9)
    alphabet = "ab./_-Z9 \t\n\"'\\{}$%é"
    samples = ["locks/a/", "a/./b/", "a/../b/", "a//b/", "x" * 300 + "/", "locks/a/\n", ".a/"]
    samples += [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(3000)
    ]
    for prefix in samples:
        every_rule = next(
            (
                f'"{values.shown(prefix)}" {m}'
                for broken, m in values._PREFIX_RULES
                if broken(prefix)
            ),
            None,
        )
        assert values.prefix_problem(prefix) == every_rule, prefix
