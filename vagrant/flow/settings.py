"""What one run of the flow is: its sizes, its paths, the names of what it creates, its environment.

Read once from the environment (the Vagrantfile's VAGRANT_* settings and the flow's LOCKCTL_*
ones); the defaults are exported again, so the Vagrantfile and vagrant/prepare see the same values.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from provision.cluster.layout import CLI_CERT_NAME, HTTPS_PORT

BOX_NAME = "lockctl/bookworm-local"
JOB = "vagrant-tick"  # the timers' job
SCHED_JOB = "vagrant-sched"  # the scheduler service's short job (it runs JOB as well)
DEFAULTS = {
    "VAGRANT_SERVERS": "3",
    "VAGRANT_WORKERS": "2",
    "VAGRANT_MEMORY": "512",
    "VAGRANT_CPUS": "1",
    "VAGRANT_SUBNET": "192.168.56",
    "VAGRANT_LIBVIRT_EMULATION": "1",
    "LOCKCTL_TICK_PERIOD": "30",
    "LOCKCTL_SCHED_PERIOD": "5",
}


class SettingsError(ValueError):
    """A setting the flow cannot run with."""


@dataclass(frozen=True)
class Settings:
    repo: Path
    run_id: str
    servers: int
    workers: int
    memory: int
    cpus: int
    subnet: str
    period: int
    ticks: int
    sched_period: int  # SCHED_JOB's `@every`
    sched_window: int  # seconds both schedulers run together before they are stopped
    box_file: Path
    box_file_given: bool  # LOCKCTL_VAGRANT_BOX_FILE: then older boxes are not cleaned up
    rebuild_box: bool

    @classmethod
    def from_environment(
        cls, repo: Path, environ: Mapping[str, str], run_id: str | None = None
    ) -> Settings:
        env = {**DEFAULTS, **environ}
        given_box = environ.get("LOCKCTL_VAGRANT_BOX_FILE", "")
        return cls(
            repo=repo,
            run_id=run_id or os.urandom(3).hex(),
            servers=_whole(env, "VAGRANT_SERVERS"),
            workers=_whole(env, "VAGRANT_WORKERS"),
            memory=_whole(env, "VAGRANT_MEMORY"),
            cpus=_whole(env, "VAGRANT_CPUS"),
            subnet=env["VAGRANT_SUBNET"],
            period=_whole(env, "LOCKCTL_TICK_PERIOD"),
            ticks=_whole({"LOCKCTL_VAGRANT_TICKS": "6", **environ}, "LOCKCTL_VAGRANT_TICKS"),
            sched_period=_whole(env, "LOCKCTL_SCHED_PERIOD"),
            sched_window=_whole(
                {"LOCKCTL_VAGRANT_SCHED_WINDOW": "30", **environ}, "LOCKCTL_VAGRANT_SCHED_WINDOW"
            ),
            box_file=Path(given_box) if given_box else default_box_file(repo),
            box_file_given=bool(given_box),
            rebuild_box=env.get("LOCKCTL_VAGRANT_REBUILD_BOX", "0") == "1",
        )

    @property
    def art(self) -> Path:
        return self.repo / ".lockctl" / "vagrant"

    @property
    def run(self) -> Path:
        """The run's private state (secrets, SSH config, VAGRANT_HOME): 0700, removed at the end."""
        return self.art / "run"

    @property
    def stage(self) -> Path:
        return self.art / "stage"

    @property
    def logs(self) -> Path:
        return self.art / "logs"

    @property
    def secrets(self) -> Path:
        return self.run / "secrets"

    @property
    def management_token(self) -> Path:
        return self.secrets / "management.token"

    @property
    def namespace(self) -> str:
        return f"lockctl-vg-{self.run_id}"

    @property
    def pool(self) -> str:
        return f"lockctl-vg-{self.run_id}"

    @property
    def pool_dir(self) -> Path:
        return Path("/var/lib/libvirt/images") / self.pool

    @property
    def prefix(self) -> str:
        """Of every libvirt domain and network of this run."""
        return f"lockctl-{self.run_id}-"

    @property
    def tls_dir(self) -> Path:
        """The CA, every agent's pair, lockctl's own and the gossip key (vagrant/prepare)."""
        return self.stage / "tls"

    @property
    def server1(self) -> str:
        """server-1's API: HTTPS only, on 8501 (the VMs' agents serve no plain HTTP)."""
        return f"https://{self.subnet}.11:{HTTPS_PORT}"

    def tls_environment(self) -> dict[str, str]:
        """The `consul` CLI's own variables for lockctl's -cli pair: every host-side lockctl
        call (bootstrap, apply, verify, cluster-ready, the ledger reads) presents it."""
        return {
            "CONSUL_CACERT": str(self.tls_dir / "ca.pem"),
            "CONSUL_CLIENT_CERT": str(self.tls_dir / f"{CLI_CERT_NAME}.pem"),
            "CONSUL_CLIENT_KEY": str(self.tls_dir / f"{CLI_CERT_NAME}-key.pem"),
        }

    @property
    def server_names(self) -> list[str]:
        return [f"server-{n}" for n in range(1, self.servers + 1)]

    @property
    def worker_names(self) -> list[str]:
        return [f"worker-{n}" for n in range(1, self.workers + 1)]

    @property
    def nodes(self) -> list[str]:
        return self.server_names + self.worker_names

    def bin(self, name: str) -> str:
        """A program of the checkout's .venv."""
        return str(self.repo / ".venv" / "bin" / name)

    def export(self, environ: MutableMapping[str, str]) -> None:
        """What every child sees: Vagrant's settings for this run, its checks off, libvirt's URI."""
        for name, value in DEFAULTS.items():
            environ.setdefault(name, value)
        environ.update(
            VAGRANT_HOME=str(self.run / "vagrant.d"),
            VAGRANT_DOTFILE_PATH=str(self.run / "dotvagrant"),
            VAGRANT_CWD=str(self.repo / "vagrant"),
            VAGRANT_CHECKPOINT_DISABLE="1",
            VAGRANT_BOX_UPDATE_CHECK_DISABLE="1",
            VAGRANT_DEFAULT_PROVIDER="libvirt",
            VAGRANT_BOX=BOX_NAME,
            VAGRANT_LIBVIRT_POOL=self.pool,
            VAGRANT_LIBVIRT_PREFIX=self.prefix,
            VAGRANT_STAGE=str(self.stage),
            VAGRANT_SSH_PRIVATE_KEY=f"{self.box_file}.key",
            VAGRANT_NO_COLOR="1",
            LIBVIRT_DEFAULT_URI="qemu:///system",
        )
        environ.update(self.tls_environment())
        for name in ("CONSUL_HTTP_ADDR", "CONSUL_HTTP_TOKEN", "CONSUL_HTTP_TOKEN_FILE"):
            environ.pop(name, None)  # the flow names its address and token file every time


def default_box_file(repo: Path) -> Path:
    """The cached box is named after the script that builds it: a changed build-box builds anew."""
    digest = hashlib.sha256((repo / "vagrant" / "build-box").read_bytes()).hexdigest()[:12]
    return repo / ".cache" / "vagrant" / f"lockctl-bookworm-{digest}.box"


def _whole(env: Mapping[str, str], name: str) -> int:
    text = env[name]
    if not text.isdigit():
        raise SettingsError(f"{name}={text!r}: expected a whole number")
    return int(text)
