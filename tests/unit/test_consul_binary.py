"""Finding the Debian mirror in apt's configuration, and the binary lookup order."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from provision.cluster.consul_binary import DEFAULT_KEYRING, find_consul, find_debian_mirror
from provision.errors import LocalEnvironmentError

DEB822 = """\
Types: deb
# a comment
URIs: http://mirror.example.test/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example.test/debian-security
Suites: bookworm-security
Components: main
"""


def _apt(
    tmp_path: Path, sources_list: str = "", parts: dict[str, str] | None = None
) -> tuple[Path, Path]:
    sources = tmp_path / "sources.list"
    sources.write_text(sources_list)
    parts_dir = tmp_path / "sources.list.d"
    parts_dir.mkdir()
    for name, text in (parts or {}).items():
        (parts_dir / name).write_text(text)
    return sources, parts_dir


def test_deb822_main_archive_not_security(tmp_path: Path) -> None:
    source = find_debian_mirror(*_apt(tmp_path, parts={"debian.sources": DEB822}))
    assert source.uri == "http://mirror.example.test/debian"
    assert source.keyring == DEFAULT_KEYRING


def test_one_line_format_with_signed_by(tmp_path: Path) -> None:
    line = (
        "deb [arch=amd64 signed-by=/etc/keys/deb.gpg] http://m.example.test/debian/ bullseye main"
    )
    source = find_debian_mirror(*_apt(tmp_path, sources_list=f"# x\n{line}\n"))
    assert source.uri == "http://m.example.test/debian"
    assert source.keyring == Path("/etc/keys/deb.gpg")


def test_skips_third_party_and_disabled_sources(tmp_path: Path) -> None:
    parts = {
        "node.sources": "Types: deb\nURIs: https://node.example.test/x\nSuites: nodistro\n"
        "Components: main\n",
        "a.sources": DEB822.replace("Types: deb\n# a", "Types: deb\nEnabled: no\n# a", 1),
        "b.list": "deb http://second.example.test/debian bookworm main contrib\n",
    }
    assert find_debian_mirror(*_apt(tmp_path, parts=parts)).uri == (
        "http://second.example.test/debian"
    )


def test_no_debian_archive_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LocalEnvironmentError, match="LOCKCTL_APT_MIRROR"):
        find_debian_mirror(*_apt(tmp_path, sources_list="deb http://x.example.test/u focal main\n"))


def _fake_consul(path: Path, version: str = "1.99.0") -> Path:
    path.write_text(f"#!/bin/sh\necho 'Consul v{version}'\necho 'Protocol 2 spoken by default'\n")
    path.chmod(0o755)
    return path


def test_consul_bin_wins_over_path_and_cache(tmp_path: Path) -> None:
    explicit = _fake_consul(tmp_path / "my-consul", "1.20.1")
    (tmp_path / "bin").mkdir()
    _fake_consul(tmp_path / "bin" / "consul", "1.15.0")
    env = {"CONSUL_BIN": str(explicit), "PATH": str(tmp_path / "bin")}
    found = find_consul(env, cache_dir=tmp_path / "cache")
    assert found is not None
    assert (found.path, found.version, found.source) == (explicit, "1.20.1", "CONSUL_BIN")
    del env["CONSUL_BIN"]
    found = find_consul(env, cache_dir=tmp_path / "cache")
    assert found is not None and (found.version, found.source) == ("1.15.0", "PATH")


def test_cache_is_used_when_nothing_else(tmp_path: Path) -> None:
    cached = tmp_path / "cache" / "consul" / "debian-bullseye" / "consul"
    cached.parent.mkdir(parents=True)
    _fake_consul(cached, "1.8.7")
    found = find_consul({"PATH": str(tmp_path / "empty")}, cache_dir=tmp_path / "cache")
    assert found is not None and (found.path, found.source) == (cached, "cache")
    assert find_consul({"PATH": str(tmp_path / "empty")}, cache_dir=tmp_path / "none") is None


def test_bad_consul_bin_is_refused(tmp_path: Path) -> None:
    not_executable = tmp_path / "consul"
    not_executable.write_text("")
    with pytest.raises(LocalEnvironmentError, match="not an executable file"):
        find_consul({"CONSUL_BIN": str(not_executable)})
    broken = tmp_path / "broken"
    broken.write_text("#!/bin/sh\nexit 3\n")
    os.chmod(broken, 0o755)
    with pytest.raises(LocalEnvironmentError, match="printed no version"):
        find_consul({"CONSUL_BIN": str(broken)})
