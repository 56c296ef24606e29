"""What the flow puts into the VMs itself, never through Vagrant's file provisioner: every file
that holds a secret (an agent's config with the gossip key, a certificate's private key, a token).

Each VM gets one tar stream through one SSH session, unpacked by `sudo tar -xpf - -C /`: built in
memory from the stage, files owned by root with their modes set in the archive (keys, tokens and
agent configs 0600), so a secret touches no other file on the host or in the guest, nor argv,
nor a log. Each VM gets only its own pair and the CA's certificate, never another's key.

- `agent_files_tar` (every VM, before `vagrant provision`): /etc/consul.d/agent.hcl and
  /etc/consul.d/tls/{ca.pem,NODE.pem,NODE-key.pem}; provision-consul.sh gives them to the consul
  user the agent runs as.
- `worker_files_tar` (workers, after `lockctl apply`): lockctl's config, env file, units, token
  and its TLS files in /etc/lockctl/tls (the worker's pair again, root's: the runner runs as root,
  `worker-config --tls-dir` names them).
"""

from __future__ import annotations

import io
import tarfile
import time
from pathlib import Path

from flow.settings import Settings

GUEST_AGENT_CONFIG = "etc/consul.d/agent.hcl"
GUEST_AGENT_TLS = "etc/consul.d/tls"
GUEST_LOCKCTL_TLS = "etc/lockctl/tls"  # `lockctl worker-config --tls-dir /etc/lockctl/tls`
SECRET = 0o600
PUBLIC = 0o644

# A member: the host file, its name in the archive (relative to /), its mode.
Member = tuple[Path, str, int]


def tls_members(settings: Settings, node: str, folder: str) -> list[Member]:
    """The CA's certificate and `node`'s own pair, into `folder` of the guest."""
    tls = settings.tls_dir
    return [
        (tls / "ca.pem", f"{folder}/ca.pem", PUBLIC),
        (tls / f"{node}.pem", f"{folder}/{node}.pem", PUBLIC),
        (tls / f"{node}-key.pem", f"{folder}/{node}-key.pem", SECRET),
    ]


def agent_files_tar(settings: Settings, node: str) -> bytes:
    """The node's agent config and TLS files, with their folders (ours alone: /etc/consul.d
    0755, its tls/ 0700)."""
    members = [
        (settings.stage / "agents" / f"{node}.hcl", GUEST_AGENT_CONFIG, SECRET),
        *tls_members(settings, node, GUEST_AGENT_TLS),
    ]
    folders = [("etc/consul.d", 0o755), (GUEST_AGENT_TLS, 0o700)]
    return root_owned_tar(members, folders)


def worker_files_tar(settings: Settings, worker: str) -> bytes:
    """The worker's config, env file, units, token and lockctl's TLS files as a tar of files only
    (no directory entries: /etc and /etc/lockctl keep their modes in the guest)."""
    made = settings.run / "workers" / worker
    members = [
        (settings.secrets / f"{worker}.token", f"etc/lockctl/{worker}.token", SECRET),
        (made / "lockctl.json", "etc/lockctl/lockctl.json", PUBLIC),
        (made / "lockctl.env", "etc/lockctl/lockctl.env", PUBLIC),
        *tls_members(settings, worker, GUEST_LOCKCTL_TLS),
        *[
            (unit, f"etc/systemd/system/{unit.name}", PUBLIC)
            for unit in sorted((made / "systemd").iterdir())
        ],
    ]
    return root_owned_tar(members)


def root_owned_tar(members: list[Member], folders: list[tuple[str, int]] | None = None) -> bytes:
    """An uncompressed tar in memory: `folders` first, then the files, all root's."""
    stream = io.BytesIO()
    now = int(time.time())
    with tarfile.open(fileobj=stream, mode="w") as tar:
        for name, mode in folders or []:
            tar.addfile(_root_info(name, mode, now, tarfile.DIRTYPE))
        for source, name, mode in members:
            data = source.read_bytes()
            info = _root_info(name, mode, now, tarfile.REGTYPE)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return stream.getvalue()


def _root_info(name: str, mode: int, mtime: int, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = kind, mode, mtime
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info
