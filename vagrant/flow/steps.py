"""The flow's phases, in order: host packages, stage, box, libvirt, VMs, the agents' secret files
into every VM (delivery.py), provisioning, lockctl's bootstrap and apply, delivery to the workers,
verify, one warm-up run per worker and the timers, the ticks (tick_run.py), the scheduler
service (sched_run.py), report.

The VMs' cluster runs TLS (HTTPS only on 8501, certificates verified both ways) with encrypted
gossip; every host-side lockctl call presents lockctl's -cli pair (Settings.tls_environment).

Everything that talks to the VMs runs inside the run's namespace (`self.shell.ns`, `self.ssh`);
host-side steps (packages, stage, box build, worker-config, the tick check) need no network of it.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from flow import libvirt, sched_run, tick_run
from flow.commands import (
    Child,
    FlowFailed,
    Shell,
    output_of,
    succeeds,
    tail,
    tail_of_failure,
)
from flow.delivery import agent_files_tar, worker_files_tar
from flow.phases import PhaseTimer
from flow.settings import BOX_NAME, JOB, SCHED_JOB, Settings
from flow.teardown import UndoStack
from provision.cluster.layout import HTTPS_PORT

UP_TIMEOUT = 1500.0
UP_ATTEMPTS = 2
PROVISION_TIMEOUT = 1200.0
DESTROY_TIMEOUT = 600.0
_CLIENT_ADDR = re.compile(r'^client_addr *= *"(.*)"', re.MULTILINE)
_PROVISION_LINE = re.compile(r"provision-(consul|lockctl):")
SHOW_MODES = "sudo stat -c '{node}: %n %a %U'"  # what a delivery prints: path, mode, owner
_LOG_PREFIX = re.compile(r"^[0-9:]* *[^:]*: ")  # "12:00:01     server-1: " of a stamped log


class Flow:
    def __init__(self, settings: Settings, timer: PhaseTimer, stack: UndoStack) -> None:
        self.s = settings
        self.timer = timer
        self.stack = stack
        self.shell = Shell(settings.namespace, stack)
        self.timers_started = 0.0

    def run(self) -> None:
        refuse_shared_libvirt()
        phases = [
            ("package install", self.host_packages),
            ("stage", self.stage),
            ("box build", self.box_build),
            ("libvirt start", lambda: libvirt.start(self.s, self.shell, self.stack)),
            ("box add", self.box_add),
            ("vagrant up", self.vagrant_up),
            ("deliver agent files", self.deliver_agent_files),
            ("provisioning", self.provision),
            ("bootstrap + apply", self.bootstrap_and_apply),
            ("deliver to workers", self.deliver_worker_files),
        ]
        for name, step in phases:
            self.timer.start(name)
            step()
        self.timer.start("verify")  # before the timers: its load is not the ticks' to bear
        verified = self.verify()
        self.timer.start("warm-up + timers")
        tick_run.warm_up(self)
        tick_run.start_timers(self)
        self.timer.start("ticks")
        ticked = tick_run.run_ticks(self)
        self.timer.start("scheduler")
        try:
            scheduled = sched_run.run_scheduler(self)
        except FlowFailed as failure:  # verify's and the ticks' results still go in the report
            sched_run.note_failure(self.s, str(failure))
            scheduled = False
        self.write_report()
        if not (verified and ticked and scheduled):
            raise FlowFailed(
                "verify, the tick check or the scheduler check failed (see report.txt)"
            )

    # ------------------------------------------------------------------ host side ----
    def host_packages(self) -> None:
        self.shell.run([str(self.s.repo / "vagrant" / "host-packages")], "vagrant/host-packages")
        if not Path(self.s.bin("lockctl")).is_file():
            raise FlowFailed("run 'make' set-up first (.venv)", status=6)

    def stage(self) -> None:
        self.shell.run([self.s.bin("python"), str(self.s.repo / "vagrant" / "prepare")], "prepare")

    def box_build(self) -> None:
        box, key = self.s.box_file, Path(f"{self.s.box_file}.key")
        if box.is_file() and key.is_file() and not self.s.rebuild_box:
            size = output_of(["du", "-h", str(box)]).split("\t")[0]
            print(f"box: cached {box} ({size}); LOCKCTL_VAGRANT_REBUILD_BOX=1 rebuilds it")
            return
        self.shell.run([str(self.s.repo / "vagrant" / "build-box"), str(box)], "build-box")
        if self.s.box_file_given:
            return
        for old in sorted(box.parent.glob("lockctl-bookworm*.box*")):
            if old not in (box, key):  # made by an older build-box: never used again
                old.unlink()
                print(f"box: removed {old.relative_to(self.s.repo)} (made by an older build-box)")

    # ------------------------------------------------------------ in the namespace ----
    def vagrant(self, *args: str) -> list[str]:
        return self.shell.ns(["vagrant", *args])

    def ssh(self, node: str, command: str) -> list[str]:
        config = str(self.s.run / "ssh_config")
        return self.shell.ns(["ssh", "-F", config, "-o", "LogLevel=ERROR", node, command])

    def box_add(self) -> None:
        log = self.s.logs / "box-add.log"
        added = self.shell.run(
            self.vagrant("box", "add", "--name", BOX_NAME, str(self.s.box_file)),
            "vagrant box add",
            log=log,
            check=False,
        )
        if added != 0:
            tail(log, 10_000)
            raise FlowFailed("vagrant box add failed")
        print(f"box {BOX_NAME} added to this run's VAGRANT_HOME")

    def vagrant_up(self) -> None:
        # Pushed before the start: a `vagrant up` that fails halfway has made some VMs.
        self.stack.push("vagrant destroy", self.destroy)
        for attempt in range(1, UP_ATTEMPTS + 1):
            log = self.s.logs / ("up.log" if attempt == 1 else f"up-{attempt}.log")
            up = self.shell.start(
                self.vagrant("up", "--no-provision"), "vagrant up", log=log, stamp=True
            )
            if self.shell.wait(up, UP_TIMEOUT) == 0:
                break
            tail_of_failure(log, 40)
            if attempt == UP_ATTEMPTS:
                raise FlowFailed(f"vagrant up failed {attempt} times")
            # Once on CI, `vagrant up` failed 5 s in, after the domains were made, with code that
            # had passed there before: a second try from nothing costs a minute, a red run more.
            print(f"vagrant up failed (logs/{log.name}); removing its VMs and trying again")
            self.destroy()
            libvirt.remove_machines(self.s, self.shell)
        status = output_of(self.vagrant("status"))
        print("\n".join(ln for ln in status.splitlines() if re.match(r"^(server|worker)-", ln)))
        config = output_of(self.vagrant("ssh-config", *self.s.nodes))
        (self.s.run / "ssh_config").write_text(config, encoding="utf-8")
        self.boot_analysis()

    def boot_analysis(self) -> None:
        """How each VM spent its boot (kernel, initrd, userspace; the slowest units)."""
        logs = {node: self.s.logs / f"boot-{node}.txt" for node in self.s.nodes}
        command = "sudo systemd-analyze; sudo systemd-analyze blame | head -n 12"
        children = [
            self.shell.start(self.ssh(n, command), f"boot analysis of {n}", log=log)
            for n, log in logs.items()
        ]
        with contextlib.suppress(FlowFailed):  # diagnostics only: slow or failed is no failure
            self.shell.wait_all(children, timeout=120)
        for node, log in logs.items():
            text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
            first = text.split("\n", 1)[0]
            print(f"{node}: {first}")

    def destroy(self) -> None:
        """The undo of `vagrant up`: whatever it leaves, `libvirt.remove_objects` removes next."""
        if not Path(self.s.run / "dotvagrant").is_dir():
            return
        with (self.s.logs / "destroy.log").open("w", encoding="utf-8") as log:
            done = subprocess.run(
                self.vagrant("destroy", "-f"),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=DESTROY_TIMEOUT,
                check=False,
            )
        if done.returncode != 0:
            print("vagrant destroy failed (see logs/destroy.log); removing what is left directly")

    def deliver(self, nodes: list[str], tar_of: Callable[[str], bytes], then: str) -> None:
        """Each node's tar stream (delivery.py) through one SSH session, the nodes in parallel,
        unpacked as root; then the command `then` (its `{node}` filled in), which shows the
        secret files' modes and owners as the guest has them."""
        deliveries: list[Child] = []
        for node in nodes:
            command = f"sudo tar -xpf - -C / && {then.format(node=node)}"
            child = self.shell.start(
                self.ssh(node, command), f"delivery to {node}", stdin=subprocess.PIPE
            )
            assert child.popen.stdin is not None
            with contextlib.suppress(BrokenPipeError):  # ssh gave up: its exit status says so
                child.popen.stdin.write(tar_of(node))
                child.popen.stdin.close()
            deliveries.append(child)
        statuses = self.shell.wait_all(deliveries, timeout=300)
        failed = [node for node, status in zip(nodes, statuses, strict=True) if status != 0]
        if failed:
            raise FlowFailed(f"delivering to {', '.join(failed)} failed")

    def deliver_agent_files(self) -> None:
        """Every agent's config (the gossip key in it), ca.pem and its own pair, before
        `vagrant provision` starts the agents: root's 0600 until provision-consul.sh hands them
        to the consul user."""
        self.deliver(
            self.s.nodes,
            lambda node: agent_files_tar(self.s, node),
            f"{SHOW_MODES} /etc/consul.d/agent.hcl /etc/consul.d/tls/{{node}}-key.pem",
        )

    def provision(self) -> None:
        """One `vagrant provision` per VM, in parallel (Vagrant locks each machine, not the
        project)."""
        logs = {node: self.s.logs / f"provision-{node}.log" for node in self.s.nodes}
        children = [
            self.shell.start(
                self.vagrant("provision", node), f"vagrant provision {node}", log=log, stamp=True
            )
            for node, log in logs.items()
        ]
        failed = False
        for (node, log), status in zip(
            logs.items(), self.shell.wait_all(children, PROVISION_TIMEOUT), strict=True
        ):
            if status == 0:
                for line in log.read_text(encoding="utf-8").splitlines():
                    if _PROVISION_LINE.search(line):
                        print(_LOG_PREFIX.sub("", line, count=1))
            else:
                print(f"provisioning {node} failed:")
                tail_of_failure(log, 20)
                failed = True
        if failed:
            raise FlowFailed("provisioning failed")

    def bootstrap_and_apply(self) -> None:
        s, mgmt = self.s, str(self.s.management_token)
        ready = [s.bin("python"), str(s.repo / "vagrant" / "cluster-ready")]
        self.shell.run(self.shell.ns([*ready, "leader", s.server1]), "cluster-ready leader")
        agents: list[str] = []
        for node in s.nodes:
            found = _CLIENT_ADDR.search((s.stage / "agents" / f"{node}.hcl").read_text("utf-8"))
            if not found:
                raise FlowFailed(f"stage/agents/{node}.hcl: no client_addr")
            agents += ["--agent", f"{node}=https://{found.group(1)}:{HTTPS_PORT}"]
        self.shell.run(
            self.shell.ns(
                [
                    s.bin("lockctl"),
                    "bootstrap",
                    "--address",
                    s.server1,
                    "--management-token-file",
                    mgmt,
                    *agents,
                ]
            ),
            "lockctl bootstrap",
        )
        self.shell.run(
            self.shell.ns([*ready, "healthy", s.server1, mgmt, *s.nodes]), "cluster-ready healthy"
        )
        self.shell.run(
            self.shell.ns(
                [
                    s.bin("lockctl"),
                    "apply",
                    "--spec",
                    str(s.stage / "locks.hcl"),
                    "--secrets-dir",
                    str(s.secrets),
                    "--address",
                    s.server1,
                    "--token-file",
                    mgmt,
                ]
            ),
            "lockctl apply",
        )
        self.shell.run(
            [
                s.bin("lockctl"),
                "worker-config",
                "--all",
                "--spec",
                str(s.stage / "locks.hcl"),
                "--out",
                str(s.run / "workers"),
                "--secrets-dir",
                "/etc/lockctl",
                "--config-dir",
                "/etc/lockctl",
                "--lockctl",
                "/usr/local/bin/lockctl",
                "--tls-dir",
                "/etc/lockctl/tls",
            ],
            "lockctl worker-config",
        )

    def deliver_worker_files(self) -> None:
        """Each worker's files as one tar stream through one SSH session, the workers in
        parallel (tick_run.py starts their timers)."""
        self.deliver(
            self.s.worker_names,
            lambda worker: worker_files_tar(self.s, worker),
            "sudo systemctl daemon-reload && "
            f"{SHOW_MODES} /etc/lockctl/{{node}}.token /etc/lockctl/tls/{{node}}-key.pem",
        )

    def verify(self) -> bool:
        s = self.s
        return (
            self.shell.run(
                self.shell.ns(
                    [
                        s.bin("lockctl"),
                        "verify",
                        "--spec",
                        str(s.stage / "locks.hcl"),
                        "--secrets-dir",
                        str(s.secrets),
                        "--inventory",
                        str(s.stage / "inventory.json"),
                        "--address",
                        s.server1,
                        "--token-file",
                        str(s.management_token),
                        "--junit",
                        str(s.art / "verify.xml"),
                    ]
                ),
                "lockctl verify",
                log=s.art / "verify.txt",
                echo=True,
                check=False,
            )
            == 0
        )

    def write_report(self) -> None:
        s = self.s
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        text = [
            f"lockctl Vagrant flow: {s.servers} servers + {s.workers} workers, {when}",
            "",
            "lockctl verify --inventory (sessions on the workers' own agents):",
            (s.art / "verify.txt").read_text(encoding="utf-8").rstrip("\n"),
            "",
            f"tick check (job {JOB} every {s.period} s on every worker):",
            (s.art / "ticks.txt").read_text(encoding="utf-8").rstrip("\n"),
            "",
            f"scheduler check ({sched_run.UNIT} on every worker, job {SCHED_JOB} every "
            f"{s.sched_period} s):",
            (s.art / "scheduler.txt").read_text(encoding="utf-8").rstrip("\n"),
        ]
        (s.art / "report.txt").write_text("\n".join(text) + "\n", encoding="utf-8")


def refuse_shared_libvirt() -> None:
    """This flow starts its own libvirtd inside its namespace and never shares the machine's."""
    socket = Path("/run/libvirt/libvirt-sock")
    version = ["virsh", "-c", "qemu:///system", "version"]
    if socket.is_socket() and shutil.which("virsh") and succeeds(version, timeout=30):
        raise FlowFailed(
            "a libvirtd is already running on this machine; this flow starts its own inside"
            " a network namespace and will not share it",
            status=6,
        )
