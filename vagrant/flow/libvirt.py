"""The run's own network namespace with libvirt inside it, and the undo of each part.

Pushed in the order made, so undone in reverse: the namespace (deleted last, after a look for any
process still in it), /dev/kvm's mode, virtlogd and libvirtd (stopped by their pidfiles, only
while the PID still names that pidfile), the pool's folder, and the pool with every domain,
network and volume of this run (removed first, with whatever `vagrant destroy` left).
"""

from __future__ import annotations

import grp
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

from flow.commands import Shell, output_of, succeeds
from flow.settings import Settings
from flow.teardown import UndoStack
from provision.system.deadline import Deadline, wait_until
from provision.system.processes import stop_pidfile

LIBVIRT_READY = 20.0  # seconds for libvirtd to answer `virsh version`
DAEMON_GRACE = 10.0
QEMU_LOGS = Path("/var/log/libvirt/qemu")


def start(settings: Settings, shell: Shell, stack: UndoStack) -> None:
    """Namespace, daemons and pool of this run, each undo on the stack as soon as it is made."""
    make_namespace(settings, shell, stack)
    open_kvm(stack)
    for daemon in ("virtlogd", "libvirtd"):
        start_daemon(settings, shell, stack, daemon)
    wait_for_libvirt(settings, shell)
    virsh = _virsh(shell)
    # libvirt's stock NAT network must not run here (host-packages turns its autostart off).
    if "default" in output_of(virsh("net-list", "--name")).split():
        shell.run(virsh("net-destroy", "default"), "virsh net-destroy default")
    settings.pool_dir.mkdir(parents=True, exist_ok=True)
    stack.push("remove the pool's folder", lambda: _remove_tree(settings.pool_dir))
    stack.push(
        "remove this run's domains, networks, volumes, pool",
        lambda: remove_objects(settings, shell),
    )
    shell.run(
        virsh("pool-define-as", settings.pool, "dir", "--target", str(settings.pool_dir)),
        "virsh pool-define-as",
    )
    shell.run(virsh("pool-start", settings.pool), "virsh pool-start")
    links = [line.split()[0] for line in output_of(shell.ns(["ip", "-brief", "link"])).splitlines()]
    print(
        f"namespace {settings.namespace}: {' '.join(links)} (no uplink, no routes out)", flush=True
    )


def make_namespace(settings: Settings, shell: Shell, stack: UndoStack) -> None:
    shell.run(["ip", "netns", "add", settings.namespace], "ip netns add")
    stack.push("delete the namespace", lambda: delete_namespace(settings.namespace))
    shell.run(shell.ns(["ip", "link", "set", "lo", "up"]), "ip link set lo up")


def delete_namespace(namespace: str) -> str | None:
    pids = output_of(["ip", "netns", "pids", namespace]).split()
    succeeds(["ip", "netns", "del", namespace])
    return f"processes in {namespace}: {' '.join(pids)}" if pids else None


def open_kvm(stack: UndoStack, device: Path = Path("/dev/kvm")) -> None:
    """Without udev /dev/kvm is root-only and libvirt re-probes QEMU every 2 s: group kvm, 0660,
    restored at the teardown."""
    if not device.exists() or not stat.S_ISCHR(device.stat().st_mode):
        return
    before = device.stat()

    def restore() -> None:
        os.chown(device, before.st_uid, before.st_gid)
        os.chmod(device, stat.S_IMODE(before.st_mode))

    stack.push("restore /dev/kvm's mode", restore)
    os.chown(device, -1, grp.getgrnam("kvm").gr_gid)
    os.chmod(device, 0o660)


def start_daemon(settings: Settings, shell: Shell, stack: UndoStack, daemon: str) -> None:
    """Pushed before the start: a daemon that fails after writing its pidfile is still stopped."""
    pidfile = settings.run / f"{daemon}.pid"
    stack.push(f"stop {daemon}", lambda: _stop(pidfile))
    shell.run(shell.ns([f"/usr/sbin/{daemon}", "--daemon", "--pid-file", str(pidfile)]), daemon)


def _stop(pidfile: Path) -> None:
    stop_pidfile(pidfile, marker=str(pidfile), grace=DAEMON_GRACE)


def wait_for_libvirt(settings: Settings, shell: Shell) -> None:
    version = shell.ns(["virsh", "version"])
    wait_until(Deadline(LIBVIRT_READY), lambda: succeeds(version, timeout=10), 0.2)
    text = output_of(version)
    (settings.logs / "libvirt-version.txt").write_text(text, encoding="utf-8")
    hypervisor = [line for line in text.splitlines() if "running hypervisor" in line.lower()]
    print("\n".join(hypervisor) or text, flush=True)


def remove_objects(settings: Settings, shell: Shell) -> str | None:
    """Every domain, network and volume of this run, then its pool; QEMU's logs kept. What is
    left of its domains, if any."""
    virsh = _virsh(shell)
    remove_machines(settings, shell)
    if succeeds(virsh("pool-info", settings.pool)):
        for volume in output_of(virsh("vol-list", settings.pool, "--name")).split():
            succeeds(virsh("vol-delete", volume, "--pool", settings.pool))
        succeeds(virsh("pool-destroy", settings.pool))
        succeeds(virsh("pool-undefine", settings.pool))
    left = _named(settings, output_of(virsh("list", "--all", "--name")))
    for log in QEMU_LOGS.glob(f"{settings.prefix}*.log"):
        shutil.move(str(log), settings.logs / log.name)
    return f"domains {' '.join(left)}" if left else None


def remove_machines(settings: Settings, shell: Shell) -> None:
    """Every domain (with its disks) and network of this run; the pool and the box's volume stay."""
    virsh = _virsh(shell)
    for domain in _named(settings, output_of(virsh("list", "--all", "--name"))):
        succeeds(virsh("destroy", domain))
        succeeds(virsh("undefine", domain, "--remove-all-storage"))
    for network in _named(settings, output_of(virsh("net-list", "--all", "--name"))):
        succeeds(virsh("net-destroy", network))
        succeeds(virsh("net-undefine", network))


def _named(settings: Settings, listing: str) -> list[str]:
    return [name for name in listing.split() if name.startswith(settings.prefix)]


def _virsh(shell: Shell) -> Callable[..., list[str]]:
    return lambda *args: shell.ns(["virsh", *args])


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
