"""Finding, or installing, a real Consul binary.

Order: `CONSUL_BIN`, a `consul` on PATH, the project's cache, else Debian's `consul` package from
the bullseye suite (1.8.7, the newest Debian ships), fetched with apt through a private sources
list built from the mirror URI the machine's apt already uses, with private apt state and cache,
and extracted into the cache. Nothing of the system's apt state is touched, and no host name is
written anywhere: the mirror comes from the machine's configuration (or LOCKCTL_APT_MIRROR).

Uses only the standard library, so `scripts/install-consul` runs before any dependency is there.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from provision.errors import LocalEnvironmentError

DEBIAN_SUITE = "bullseye"
DEBIAN_PACKAGE = "consul"
DEFAULT_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
APT_SOURCES = Path("/etc/apt/sources.list")
APT_SOURCE_PARTS = Path("/etc/apt/sources.list.d")
_CHECKOUT = Path(__file__).resolve().parents[2]
_DEBIAN_SUITES = {"bullseye", "bookworm", "trixie", "forky", "sid", "unstable", "testing", "stable"}
_SUITE_DIR = "debian-bullseye"


@dataclass(frozen=True)
class ConsulBinary:
    path: Path
    version: str  # e.g. "1.8.7"
    source: str  # CONSUL_BIN, PATH, cache or apt

    def describe(self) -> str:
        return f"consul {self.version} at {self.path} (from {self.source})"


@dataclass(frozen=True)
class AptSource:
    uri: str
    keyring: Path


def default_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """LOCKCTL_CACHE_DIR, else the checkout's git-ignored `.cache/`, else ~/.cache/lockctl."""
    env = os.environ if env is None else env
    if env.get("LOCKCTL_CACHE_DIR"):
        return Path(env["LOCKCTL_CACHE_DIR"])
    if (_CHECKOUT / "pyproject.toml").is_file():
        return _CHECKOUT / ".cache"
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lockctl"


def find_consul(
    env: Mapping[str, str] | None = None, cache_dir: Path | None = None
) -> ConsulBinary | None:
    """The Consul binary to use without installing anything, or None."""
    env = os.environ if env is None else env
    if env.get("CONSUL_BIN"):
        path = Path(env["CONSUL_BIN"])
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise LocalEnvironmentError(f"CONSUL_BIN={path}: not an executable file")
        return ConsulBinary(path, consul_version(path), "CONSUL_BIN")
    on_path = shutil.which("consul", path=env.get("PATH"))
    if on_path:
        return ConsulBinary(Path(on_path), consul_version(Path(on_path)), "PATH")
    cached = _cached_binary(cache_dir or default_cache_dir(env))
    if cached.is_file():
        return ConsulBinary(cached, consul_version(cached), "cache")
    return None


def install_consul(
    env: Mapping[str, str] | None = None, cache_dir: Path | None = None
) -> ConsulBinary:
    """The Consul binary to use, fetching Debian's package into the cache if there is none."""
    env = os.environ if env is None else env
    cache_dir = cache_dir or default_cache_dir(env)
    found = find_consul(env, cache_dir)
    if found is not None:
        return found
    source = (
        AptSource(env["LOCKCTL_APT_MIRROR"], DEFAULT_KEYRING)
        if env.get("LOCKCTL_APT_MIRROR")
        else find_debian_mirror()
    )
    path = _fetch_with_apt(source, cache_dir)
    return ConsulBinary(path, consul_version(path), "apt")


def consul_version(path: Path) -> str:
    """The version `consul version` reports, e.g. "1.8.7"."""
    try:
        done = subprocess.run(
            [str(path), "version"], capture_output=True, text=True, timeout=30, check=False
        )
    except OSError as exc:
        raise LocalEnvironmentError(f"{path}: cannot run: {exc.strerror}") from None
    match = re.search(r"Consul v(\d+\.\d+\.\d+\S*)", done.stdout)
    if done.returncode != 0 or not match:
        raise LocalEnvironmentError(f"{path}: `consul version` failed or printed no version")
    return match.group(1)


def find_debian_mirror(sources: Path = APT_SOURCES, parts: Path = APT_SOURCE_PARTS) -> AptSource:
    """The Debian archive the machine's apt is configured with (not its security archive)."""
    for entry in _apt_entries(sources, parts):
        if entry is not None:
            return entry
    raise LocalEnvironmentError(
        "no Debian archive in the apt configuration; set LOCKCTL_APT_MIRROR to a Debian mirror "
        "URI, or CONSUL_BIN to a consul binary"
    )


def _apt_entries(sources: Path, parts: Path) -> Iterator[AptSource | None]:
    files = [sources] if sources.is_file() else []
    if parts.is_dir():
        files += sorted(p for p in parts.iterdir() if p.suffix in (".list", ".sources"))
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        stanzas = _deb822(text) if path.suffix == ".sources" else _one_line(text)
        for uri, suites, components, keyring in stanzas:
            base_suites = {s for s in suites if "-" not in s and "/" not in s}
            if base_suites & _DEBIAN_SUITES and "main" in components:
                yield AptSource(uri.rstrip("/"), keyring or DEFAULT_KEYRING)


Stanza = tuple[str, list[str], list[str], Path | None]


def _one_line(text: str) -> Iterator[Stanza]:
    for line in text.splitlines():
        match = re.match(r"\s*deb\s+(\[[^\]]*\]\s+)?(\S+)\s+(\S+)\s+(.*)", line)
        if match:
            options, uri, suite, components = match.groups()
            keyring = re.search(r"signed-by=(\S+?)\]?(\s|$)", options or "")
            yield uri, [suite], components.split(), Path(keyring.group(1)) if keyring else None


def _deb822(text: str) -> Iterator[Stanza]:
    for block in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            match = re.match(r"([A-Za-z-]+):\s*(.*)", line)
            if match and not line.startswith("#"):
                fields[match.group(1).lower()] = match.group(2).strip()
        if "deb" not in fields.get("types", "").split() or fields.get("enabled") == "no":
            continue
        signed_by = fields.get("signed-by", "")
        keyring = Path(signed_by) if signed_by.startswith("/") else None
        for uri in fields.get("uris", "").split():
            yield (
                uri,
                fields.get("suites", "").split(),
                fields.get("components", "").split(),
                (keyring),
            )


def _cached_binary(cache_dir: Path) -> Path:
    return cache_dir / "consul" / _SUITE_DIR / "consul"


def _fetch_with_apt(source: AptSource, cache_dir: Path) -> Path:
    """apt-get update + download with private state, then extract the binary into the cache."""
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise LocalEnvironmentError("apt-get and dpkg-deb are needed to fetch Debian's consul")
    apt_dir = cache_dir / "consul" / "apt"
    for sub in ("lists/partial", "archives/partial", "debs"):
        (apt_dir / sub).mkdir(parents=True, exist_ok=True)
    source_list = apt_dir / "sources.list"
    source_list.write_text(
        f"deb [signed-by={source.keyring}] {source.uri} {DEBIAN_SUITE} main\n", encoding="utf-8"
    )
    apt_options = [
        f"-oDir::Etc::SourceList={source_list}",
        "-oDir::Etc::SourceParts=/dev/null",
        f"-oDir::State::Lists={apt_dir / 'lists'}",
        f"-oDir::Cache={apt_dir}",
        "-oAPT::Sandbox::User=root" if os.geteuid() == 0 else "-oDebug::NoLocking=1",
        "-oDebug::NoLocking=1",
        "-qq",
    ]
    _run(["apt-get", *apt_options, "update"], apt_dir, "apt-get update")
    debs = apt_dir / "debs"
    for old in debs.glob("*.deb"):
        old.unlink()
    _run(["apt-get", *apt_options, "download", DEBIAN_PACKAGE], debs, "apt-get download")
    deb = next(debs.glob(f"{DEBIAN_PACKAGE}_*.deb"), None)
    if deb is None:
        raise LocalEnvironmentError("apt-get download consul produced no .deb")
    target = _cached_binary(cache_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        _run(["dpkg-deb", "-x", str(deb), tmp], debs, "dpkg-deb -x")
        extracted = Path(tmp) / "usr" / "bin" / "consul"
        if not extracted.is_file():
            raise LocalEnvironmentError(f"{deb.name} holds no usr/bin/consul")
        os.chmod(extracted, 0o755)  # noqa: S103 - a program, as /usr/bin/consul is
        os.replace(extracted, target)  # atomic: a concurrent reader sees no half-copied binary
    return target


def _run(command: list[str], cwd: Path, what: str) -> None:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise LocalEnvironmentError(f"{what} failed (exit {done.returncode}): {last}")


def main() -> int:
    """`python -m provision.cluster.consul_binary`: install if needed, print where and which
    version."""
    try:
        binary = install_consul()
    except LocalEnvironmentError as exc:
        print(f"install-consul: error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(binary.describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
