"""Network namespaces for the local cluster's namespace mode (root only): one host per agent.

    [driver ns] eth0 10.77.0.2  --veth--+
    [server-1 ns] eth0 10.77.0.11 --veth--+--> bridge `br0` in a namespace of its own
    [worker-1 ns] eth0 10.77.0.21 --veth--+     (bridge-side ends: v-driver, v-server-1, ...)

Every address exists only inside these namespaces; the root namespace gets no device, address or
route. The driver namespace is where lockctl itself talks to the agents from (`entered`). A host
is cut off by setting its bridge-side veth down (packets vanish, calls hang as on a real
partition) and healed by setting it up. Every namespace is recorded in the state folder BEFORE it
is created, so `destroy_network` removes exactly what was created, also after a crash half-way.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from provision.errors import LocalEnvironmentError
from provision.system.files import PUBLIC_MODE, write_atomically

NETNS_RUN_DIR = Path("/run/netns")  # where `ip netns add` mounts named namespaces
RECORD_FILE = "netns.json"
BRIDGE = "br0"
HOST_DEVICE = "eth0"
DRIVER_HOST = 2  # the driver namespace's address: <subnet>.2
IP_TIMEOUT = 10.0
_CLONE_NEWNET = 0x40000000


@dataclass(frozen=True)
class Host:
    """One namespace on the bridge: its name, its address and its veth's bridge-side name."""

    netns: str
    address: str
    veth: str  # in the bridge namespace; at most 15 characters (IFNAMSIZ)


def netns_prefix(state_dir: Path) -> str:
    """A short name prefix unique to this state folder, so two clusters never share a namespace."""
    digest = hashlib.sha256(str(state_dir.absolute()).encode()).hexdigest()[:6]
    return f"lkc-{digest}"


def bridge_netns(prefix: str) -> str:
    return f"{prefix}-bridge"


def driver_netns(prefix: str) -> str:
    return f"{prefix}-driver"


def agent_netns(prefix: str, agent_name: str) -> str:
    return f"{prefix}-{agent_name}"


def exec_argv(netns: str, argv: list[str]) -> list[str]:
    """`argv` run inside `netns`. `ip netns exec` execs the program: the PID stays the same."""
    return [_ip(), "netns", "exec", netns, *argv]


def require_root() -> None:
    if os.geteuid() != 0:
        raise LocalEnvironmentError(
            "--netns needs root (it creates network namespaces and veth pairs); run as root, "
            "or use the loopback mode without --netns"
        )


def ensure_iproute2() -> None:
    """Install iproute2 (the `ip` command) with apt if it is missing."""
    if shutil.which("ip") or Path("/usr/sbin/ip").exists() or Path("/sbin/ip").exists():
        return
    if shutil.which("apt-get") is None:
        raise LocalEnvironmentError(
            "--netns needs the `ip` command (iproute2) and apt-get is absent"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", "iproute2"]
    if subprocess.run(install, env=env, capture_output=True, check=False).returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, check=False)
        done = subprocess.run(install, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise LocalEnvironmentError(f"apt-get install iproute2 failed: {done.stderr.strip()}")


def create_network(state_dir: Path, prefix: str, subnet: str, hosts: list[Host]) -> None:
    """Make (or complete) the bridge namespace, the driver namespace and one namespace per host.

    Idempotent: what exists is kept, so `up` can recover a half-made network.
    """
    bridge = bridge_netns(prefix)
    _add_netns(state_dir, bridge)
    if not _link_exists(bridge, BRIDGE):
        _ip_run("-n", bridge, "link", "add", BRIDGE, "type", "bridge")
    _ip_run("-n", bridge, "link", "set", BRIDGE, "up")
    driver = Host(driver_netns(prefix), f"{subnet}.{DRIVER_HOST}", "v-driver")
    for host in [driver, *hosts]:
        _add_netns(state_dir, host.netns)
        _ip_run("-n", host.netns, "link", "set", "lo", "up")
        if not _link_exists(bridge, host.veth):
            if _link_exists(host.netns, HOST_DEVICE):  # half-made: its peer is gone, start over
                _ip_run("-n", host.netns, "link", "del", HOST_DEVICE)
            _ip_run(
                "-n", bridge, "link", "add", host.veth, "type", "veth",
                "peer", "name", HOST_DEVICE, "netns", host.netns,
            )  # fmt: skip
            _ip_run("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", HOST_DEVICE)
        _ip_run("-n", bridge, "link", "set", host.veth, "master", BRIDGE, "up")
        _ip_run("-n", host.netns, "link", "set", HOST_DEVICE, "up")


def destroy_network(state_dir: Path) -> tuple[str, ...]:
    """Delete every namespace this state folder recorded (their veths and bridge go with them)."""
    removed = []
    for name in reversed(recorded_namespaces(state_dir)):
        if (NETNS_RUN_DIR / name).exists():
            _ip_run("netns", "del", name)
            removed.append(name)
    (state_dir / RECORD_FILE).unlink(missing_ok=True)
    return tuple(removed)


def recorded_namespaces(state_dir: Path) -> list[str]:
    path = state_dir / RECORD_FILE
    if not path.is_file():
        return []
    try:
        names = json.loads(path.read_text(encoding="utf-8"))["created"]
    except (ValueError, KeyError, TypeError) as exc:
        raise LocalEnvironmentError(f"{path}: unreadable namespace record ({exc})") from None
    return [str(name) for name in names]


def cut(prefix: str, host: Host) -> None:
    """Cut `host` off: its bridge-side veth goes down, so its packets vanish without an error."""
    _ip_run("-n", bridge_netns(prefix), "link", "set", host.veth, "down")


def heal(prefix: str, host: Host) -> None:
    """Reconnect a host cut off with `cut`."""
    _ip_run("-n", bridge_netns(prefix), "link", "set", host.veth, "up")


@contextlib.contextmanager
def entered(netns: str | None) -> Iterator[None]:
    """Run the block with the CALLING THREAD in `netns` (None: stay where we are).

    Sockets keep the namespace they were created in, so connections opened inside the block only
    work from inside it; threads started inside inherit it. setns(2) through ctypes: os.setns
    exists only from Python 3.12.
    """
    if netns is None:
        yield
        return
    libc = ctypes.CDLL(None, use_errno=True)
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        try:
            target = os.open(NETNS_RUN_DIR / netns, os.O_RDONLY)
        except OSError as exc:
            raise LocalEnvironmentError(f"network namespace {netns}: {exc.strerror}") from None
        try:
            _setns(libc, target, netns)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(libc, own, "the original namespace")
    finally:
        os.close(own)


def _setns(libc: ctypes.CDLL, fd: int, what: str) -> None:
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        error = ctypes.get_errno()
        raise LocalEnvironmentError(f"cannot enter {what}: {os.strerror(error)}")


def _add_netns(state_dir: Path, name: str) -> None:
    if (NETNS_RUN_DIR / name).exists():
        if name not in recorded_namespaces(state_dir):
            raise LocalEnvironmentError(
                f"network namespace {name} exists but this cluster did not create it; remove it "
                f"(ip netns del {name}) or use another --state-dir"
            )
        return
    _record(state_dir, name)  # first: a crash right after must not leak the namespace
    _ip_run("netns", "add", name)


def _record(state_dir: Path, name: str) -> None:
    names = recorded_namespaces(state_dir)
    if name in names:
        return
    record = json.dumps({"created": [*names, name]}, indent=2) + "\n"
    write_atomically(state_dir / RECORD_FILE, record, mode=PUBLIC_MODE)


def _link_exists(netns: str, device: str) -> bool:
    probe = [_ip(), "-n", netns, "link", "show", "dev", device]
    return (
        subprocess.run(probe, capture_output=True, check=False, timeout=IP_TIMEOUT).returncode == 0
    )


def _ip_run(*args: str) -> None:
    done = subprocess.run(
        [_ip(), *args], capture_output=True, text=True, check=False, timeout=IP_TIMEOUT
    )
    if done.returncode != 0:
        raise LocalEnvironmentError(f"ip {' '.join(args)}: {done.stderr.strip() or 'failed'}")


def _ip() -> str:
    for candidate in (shutil.which("ip"), "/usr/sbin/ip", "/sbin/ip"):
        if candidate and Path(candidate).exists():
            return candidate
    raise LocalEnvironmentError("the `ip` command (iproute2) is missing")
