"""Two specs of distinct owners on one cluster (the shared test cluster: each owner is made up
for this test, so `apply --prune` here can touch nothing but the test's own objects): each
apply and prune sees only its own owner's objects, a re-apply is a no-op for both, and a name
the other owner manages is refused with nothing written. And the upgrade: what the previous
release applied (no owners) is this release's default owner's, unchanged. Every object is read
back by name."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.errors import EXIT_INPUT
from provision.spec.names import lock_policy_name, parse_managed, session_policy_name
from tests.conftest import LiveCluster
from tests.integration.named_reads import policy_named, worker_tokens
from tests.integration.previous_release import Release, install_previous_release
from tests.integration.test_apply import Env, env_on, spec_text


class Team:
    """One team's spec on the shared cluster: its owner, worker and jobs carry the test's uid."""

    def __init__(self, env: Env, team: str) -> None:
        self.env = env
        self.owner = env.name(team)
        self.worker = env.name(f"{team}-w")

    def job(self, base: str) -> str:
        return self.env.name(f"{self.owner}-{base}")

    def write(self, jobs: list[str]) -> None:
        body = spec_text({job: [self.worker] for job in jobs}, [self.worker])
        self.env.write_text(f'owner = "{self.owner}"\n{body}')

    def apply(self, *extra: str) -> dict[str, object]:
        result = self.env.run("apply", "--json", *extra)
        assert result.exit_code == 0, result.output
        record: dict[str, object] = json.loads(result.stdout)
        return record

    def token(self) -> str:
        (accessor,) = worker_tokens(self.env.cluster.management(), self.worker, self.owner)
        return accessor


@pytest.fixture
def team_a(
    tmp_path: Path, live_cluster: LiveCluster, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Team]:
    for env in env_on(live_cluster, _folder(tmp_path / "a"), monkeypatch):
        yield Team(env, "team-a")


@pytest.fixture
def team_b(
    tmp_path: Path, live_cluster: LiveCluster, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Team]:
    for env in env_on(live_cluster, _folder(tmp_path / "b"), monkeypatch):
        yield Team(env, "team-b")


def _folder(path: Path) -> Path:
    path.mkdir()
    return path


def _policies(team: Team, names: list[str]) -> dict[str, tuple[str, str]]:
    """Each of `names` that exists: (ID, description), read by its name."""
    mgmt = team.env.cluster.management()
    found = {name: policy_named(mgmt, name) for name in names}
    return {n: (p.id, p.description) for n, p in found.items() if p is not None}


def _deleted(record: dict[str, object], kind: str, field: str) -> list[str]:
    changes = record[kind]
    assert isinstance(changes, list)
    return sorted(c[field] for c in changes if c["action"] == "delete")


def test_prune_of_one_owner_leaves_the_other_owners_objects(team_a: Team, team_b: Team) -> None:
    a_jobs = [team_a.job("keep"), team_a.job("gone")]
    b_jobs = [team_b.job("one"), team_b.job("two")]
    team_a.write(a_jobs)
    team_b.write(b_jobs)
    team_a.apply()
    team_b.apply()
    b_names = [lock_policy_name(j) for j in b_jobs] + [session_policy_name(team_b.worker)]
    b_before = _policies(team_b, b_names)
    assert len(b_before) == 3
    assert all(parse_managed(d) is not None for _, d in b_before.values())
    assert {parse_managed(d).owner for _, d in b_before.values()} == {team_b.owner}  # type: ignore[union-attr]
    b_token = team_b.token()
    # A no-op re-apply for each: the two lists and one token-file check, nothing written
    # (--prune reads the three identity lists too: it may delete managed roles and rules).
    for team in (team_a, team_b):
        again = team.apply()
        assert (again["applied"], again["requests"]) == (0, 2 + 1), again
        again = team.apply("--prune")
        assert (again["applied"], again["requests"]) == (0, 2 + 3 + 1), again

    team_a.write(a_jobs[:1])
    pruned = team_a.apply("--prune")
    assert _deleted(pruned, "policies", "name") == [lock_policy_name(a_jobs[1])]
    assert _deleted(pruned, "tokens", "accessor_id") == []

    a_left = _policies(team_a, [lock_policy_name(j) for j in a_jobs])
    assert list(a_left) == [lock_policy_name(a_jobs[0])]
    assert _policies(team_b, b_names) == b_before  # the same objects, unchanged
    assert team_b.token() == b_token
    b_again = team_b.apply("--prune")
    assert (b_again["applied"], b_again["requests"]) == (0, 2 + 3 + 1), b_again
    # rotate finds B's token by B's owner, and leaves B with one token, converged.
    rotated = team_b.env.run("rotate", "--worker", team_b.worker)
    assert rotated.exit_code == 0, rotated.output
    assert f"revoked {b_token}" in rotated.stdout
    assert team_b.token() != b_token
    assert team_b.apply()["applied"] == 0


def test_a_name_the_other_owner_manages_is_refused_with_nothing_written(
    team_a: Team, team_b: Team
) -> None:
    shared = team_a.job("shared")
    team_a.write([shared])
    team_a.apply()
    team_b.write([team_b.job("one")])
    team_b.apply()
    a_before = _policies(team_a, [lock_policy_name(shared)])
    b_token = team_b.token()

    # B adds a job of its own and one named as A's: the whole apply is refused.
    new_job = team_b.job("new")
    team_b.write([team_b.job("one"), new_job, shared])
    for command in ("plan", "apply"):
        refused = team_b.env.run(command, "--prune")
        assert refused.exit_code == EXIT_INPUT, refused.output
        assert refused.stdout == ""
        assert refused.stderr.count("\n") == 1, refused.stderr
        assert refused.stderr.startswith(
            f"lockctl: error: policy {lock_policy_name(shared)} in Consul is managed by owner "
            f'"{team_a.owner}", not by this spec\'s owner "{team_b.owner}"'
        ), refused.stderr
    assert _policies(team_a, [lock_policy_name(shared)]) == a_before
    assert _policies(team_b, [lock_policy_name(new_job)]) == {}
    mgmt = team_b.env.cluster.management()
    held = mgmt.acl.read_token(b_token)
    assert sorted(held.policy_names) == sorted(
        [lock_policy_name(team_b.job("one")), session_policy_name(team_b.worker)]
    )
    # A is untouched by B's attempt: its re-apply is still a no-op.
    a_again = team_a.apply()
    assert (a_again["applied"], a_again["requests"]) == (0, 2 + 1), a_again


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    return install_previous_release(tmp_path_factory.mktemp("previous-release"))


def _previous(
    team: Team, release: Release, cluster: LiveCluster, *args: str
) -> subprocess.CompletedProcess[str]:
    """`lockctl ARGS` of the previous release, on the test's spec, secrets and cluster."""
    argv = [*release.program, *args, *team.env.flags(), *cluster.tls_flags()]
    return subprocess.run(
        argv, capture_output=True, text=True, env=release.environment(), timeout=120, check=False
    )


def test_the_previous_releases_objects_are_the_default_owners_unchanged(
    team_a: Team, team_b: Team, previous_release: Release, live_cluster: LiveCluster
) -> None:
    """The previous release applies a spec without an owner; this release's apply of the same
    spec is a no-op (nothing written, the same requests), and the previous release does not
    take a named owner's objects for its own (its plan lists none of them as stale)."""
    old = team_a.env
    worker, jobs = old.name("old-w"), [old.name("old-1"), old.name("old-2")]
    old.write_text(spec_text({job: [worker] for job in jobs}, [worker]))
    applied = _previous(team_a, previous_release, live_cluster, "apply")
    assert applied.returncode == 0, applied.stderr
    again = old.run("apply", "--json")
    assert again.exit_code == 0, again.output
    record = json.loads(again.stdout)
    assert (record["applied"], record["requests"]) == (0, 2 + 1), record
    assert len(worker_tokens(old.cluster.management(), worker)) == 1

    team_b.write([team_b.job("one")])
    team_b.apply()
    seen = _previous(team_a, previous_release, live_cluster, "plan")
    assert seen.returncode == 0, seen.stderr  # no change for the previous release either
    for name in (lock_policy_name(team_b.job("one")), session_policy_name(team_b.worker)):
        assert name not in seen.stderr, seen.stderr
    assert team_b.worker not in seen.stderr
