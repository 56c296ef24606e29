"""TLS and gossip encryption for a local cluster (`cluster up --tls`).

A CA, one certificate per agent (server certificates for the servers, client certificates for
the client agents) and one for lockctl itself, all made with Consul's own `consul tls`, and a
gossip key from `consul keygen`, in the cluster's 0700 `tls/` folder, every key 0600.

Consul 1.8.7 writes its files into the current folder, under names it picks by counting, with the
caller's umask (keys 0644 under umask 022, measured). So each command runs with umask 077 in a
fresh 0700 staging folder inside `tls/`, and its files are renamed into place (atomic, mode set
first). Nothing secret passes through argv: certificate commands are given paths, and the gossip
key arrives on keygen's stdout, a pipe, and goes straight into its 0600 file (and into the agents'
0600 config files, where `consul agent` reads it), never into a message.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from provision.cluster.consul_binary import ConsulBinary
from provision.cluster.layout import CLI_CERT_NAME, AgentSpec, ClusterLayout
from provision.consul import ConsulSettings
from provision.errors import LocalEnvironmentError
from provision.system.files import (
    PUBLIC_MODE,
    SECRET_MODE,
    UnreadableFile,
    read_regular_file,
    write_atomically,
)
from provision.system.secrets import Secret
from provision.system.text import printable

CONSUL_TLS_TIMEOUT = 30.0  # seconds for one `consul tls` or `consul keygen` run
GOSSIP_KEY_SIZES = (16, 24, 32)  # AES-128/192/256: what `encrypt` accepts; keygen makes 32
MAX_GOSSIP_KEY_FILE_BYTES = 256
STAGING_PREFIX = ".staging-"
STAGING_SUFFIX = ".tmp"
ERROR_LIMIT = 300


def ensure_tls_material(layout: ClusterLayout, binary: ConsulBinary) -> tuple[str, ...]:
    """Make whatever of the CA, the certificates and the gossip key is missing; returns what was
    made. A new CA invalidates every certificate, so they are all made anew with it."""
    folder = layout.tls_dir
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)
    made: list[str] = []
    if not (layout.ca_cert_file.is_file() and layout.ca_key_file.is_file()):
        _make_ca(layout, binary)
        for name in [agent.name for agent in layout.agents] + [CLI_CERT_NAME]:
            layout.cert_file(name).unlink(missing_ok=True)
        made.append("CA")
    for agent in layout.agents:
        if not _pair_exists(layout, agent.name):
            _make_cert(layout, binary, agent.name, _cert_args(layout, agent))
            made.append(agent.name)
    if not _pair_exists(layout, CLI_CERT_NAME):
        _make_cert(layout, binary, CLI_CERT_NAME, ["-cli", f"-dc={layout.datacenter}"])
        made.append(CLI_CERT_NAME)
    if not layout.gossip_key_file.is_file():
        write_atomically(layout.gossip_key_file, _keygen(binary).reveal() + "\n", mode=SECRET_MODE)
        made.append("gossip key")
    return tuple(made)


def read_gossip_key(layout: ClusterLayout) -> Secret:
    """The cluster's gossip key, checked to be one (base64 of 16, 24 or 32 bytes)."""
    path = layout.gossip_key_file
    try:
        raw = read_regular_file(path, MAX_GOSSIP_KEY_FILE_BYTES)
    except UnreadableFile as exc:
        raise LocalEnvironmentError(f"{path}: cannot read the gossip key: {exc}") from None
    key = _gossip_key(raw.decode("utf-8", errors="replace").strip())
    if key is None:
        raise LocalEnvironmentError(
            f"{path}: not a gossip key (base64 of 16, 24 or 32 bytes); run `lockctl cluster "
            "down` and `up` again"
        )
    return key


def consul_settings(layout: ClusterLayout, **fields: Any) -> ConsulSettings:
    """Settings for lockctl's own calls to this cluster: on a TLS cluster with its CA and
    lockctl's client certificate (the agents refuse a client without one)."""
    if layout.tls:
        files = (
            layout.ca_cert_file,
            layout.cert_file(CLI_CERT_NAME),
            layout.key_file(CLI_CERT_NAME),
        )
        missing = [path.name for path in files if not path.is_file()]
        if missing:  # requests would raise a bare OSError for a missing file
            raise LocalEnvironmentError(
                f"{layout.tls_dir}: {', '.join(missing)} missing; run `lockctl cluster up` to "
                "make what is missing"
            )
        fields.setdefault("ca_cert", files[0])
        fields.setdefault("client_cert", files[1])
        fields.setdefault("client_key", files[2])
    return ConsulSettings(**fields)


def tls_exports(layout: ClusterLayout) -> tuple[tuple[str, str], ...]:
    """The `consul` CLI's own variables for this cluster's CA and lockctl's certificate pair."""
    if not layout.tls:
        return ()
    return (
        ("CONSUL_CACERT", str(layout.ca_cert_file)),
        ("CONSUL_CLIENT_CERT", str(layout.cert_file(CLI_CERT_NAME))),
        ("CONSUL_CLIENT_KEY", str(layout.key_file(CLI_CERT_NAME))),
    )


def _cert_args(layout: ClusterLayout, agent: AgentSpec) -> list[str]:
    """A server certificate names `server.<dc>.consul` (what verify_server_hostname checks) and
    the node; every agent's names its own address, which its HTTPS API is reached at."""
    kind = ["-server", f"-node={agent.name}"] if agent.server else ["-client"]
    return [*kind, f"-dc={layout.datacenter}", f"-additional-ipaddress={agent.address}"]


def _pair_exists(layout: ClusterLayout, name: str) -> bool:
    return layout.cert_file(name).is_file() and layout.key_file(name).is_file()


def _make_ca(layout: ClusterLayout, binary: ConsulBinary) -> None:
    with _staging(layout.tls_dir) as staging:
        _run(binary, ["tls", "ca", "create"], staging)
        key, cert = _made_pair(staging)
        _install(key, layout.ca_key_file, SECRET_MODE)  # the key first: a pair is its cert
        _install(cert, layout.ca_cert_file, PUBLIC_MODE)


def _make_cert(layout: ClusterLayout, binary: ConsulBinary, name: str, args: list[str]) -> None:
    signed_by = [f"-ca={layout.ca_cert_file}", f"-key={layout.ca_key_file}"]
    with _staging(layout.tls_dir) as staging:
        _run(binary, ["tls", "cert", "create", *args, *signed_by], staging)
        key, cert = _made_pair(staging)
        _install(key, layout.key_file(name), SECRET_MODE)
        _install(cert, layout.cert_file(name), PUBLIC_MODE)


def _made_pair(staging: Path) -> tuple[Path, Path]:
    """The key and the certificate a `consul tls ... create` left in `staging`."""
    keys = sorted(staging.glob("*-key.pem"))
    certs = sorted(p for p in staging.glob("*.pem") if p not in keys)
    if len(keys) != 1 or len(certs) != 1:
        found = ", ".join(sorted(p.name for p in staging.iterdir())) or "nothing"
        raise LocalEnvironmentError(f"consul tls made {found}, not one certificate and its key")
    return keys[0], certs[0]


def _install(made: Path, target: Path, mode: int) -> None:
    """Move a file Consul wrote into place: synced, its mode set, then renamed (atomic)."""
    with made.open("rb") as handle:
        os.fsync(handle.fileno())
    made.chmod(mode)
    os.replace(made, target)


@contextlib.contextmanager
def _staging(folder: Path) -> Iterator[Path]:
    staging = Path(tempfile.mkdtemp(dir=folder, prefix=STAGING_PREFIX, suffix=STAGING_SUFFIX))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _run(binary: ConsulBinary, args: list[str], cwd: Path) -> None:
    done = _consul(binary, args, cwd)
    if done.returncode != 0:
        detail = printable(done.stderr.strip() or done.stdout.strip(), ERROR_LIMIT)
        raise LocalEnvironmentError(f"consul {' '.join(args[:3])} failed: {detail or 'no output'}")


def _keygen(binary: ConsulBinary) -> Secret:
    """A new gossip key from `consul keygen`; its output is never shown, even when wrong."""
    done = _consul(binary, ["keygen"], Path(binary.path).parent)
    key = _gossip_key(done.stdout.strip()) if done.returncode == 0 else None
    if key is None:
        raise LocalEnvironmentError(
            f"consul keygen failed (exit {done.returncode}) or printed no gossip key"
        )
    return key


def _consul(binary: ConsulBinary, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [str(binary.path), *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=CONSUL_TLS_TIMEOUT,
            check=False,
            umask=0o077,  # Consul writes keys with the caller's umask
        )
    except subprocess.TimeoutExpired:
        raise LocalEnvironmentError(
            f"consul {args[0]} gave no answer within {CONSUL_TLS_TIMEOUT:.0f} s"
        ) from None
    except OSError as exc:
        raise LocalEnvironmentError(f"{binary.path}: cannot run: {exc.strerror}") from None


def _gossip_key(text: str) -> Secret | None:
    try:
        decoded = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    return Secret(text) if len(decoded) in GOSSIP_KEY_SIZES else None
