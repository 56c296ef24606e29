"""The Vagrant flow's pure parts (vagrant/flow/), without VMs: the undo stack's order on success,
failure and a signal, the phase timer, the summary, the secret check (tokens, TLS private keys,
the gossip key), log stamping, settings, what is delivered into each VM."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import io
import json
import os
import re
import signal
import ssl
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "vagrant"))

from flow import artifacts, delivery, main, steps  # noqa: E402
from flow.commands import FlowFailed, stamp_line, without_backtraces  # noqa: E402
from flow.phases import PhaseTimer, parse_phases, phase_table  # noqa: E402
from flow.settings import Settings, SettingsError  # noqa: E402
from flow.teardown import Interrupted, SignalGuard, UndoStack  # noqa: E402


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def recording_stack(done: list[str]) -> UndoStack:
    stack = UndoStack(say=done.append)
    for name in ("namespace", "libvirtd", "pool", "vms"):
        stack.push(name, lambda name=name: done.append(name))  # type: ignore[misc]
    return stack


def test_undo_stack_unwinds_newest_first() -> None:
    done: list[str] = []
    assert recording_stack(done).unwind() == []
    assert done == ["vms", "pool", "libvirtd", "namespace"]


def test_a_failing_undo_is_reported_and_the_others_still_run() -> None:
    done: list[str] = []
    stack = recording_stack(done)

    def broken() -> None:
        raise OSError("device busy")

    stack.push("restore /dev/kvm", broken)
    stack.push("stop a child", lambda: "child 42 still running")
    left = stack.unwind()
    assert left == ["child 42 still running", "restore /dev/kvm failed (OSError: device busy)"]
    assert done[-4:] == ["vms", "pool", "libvirtd", "namespace"]
    assert len(stack) == 0  # unwound once: a second unwind does nothing
    assert stack.unwind() == []


def test_undo_stack_unwinds_after_a_failed_step() -> None:
    done: list[str] = []
    stack = recording_stack(done)
    with pytest.raises(FlowFailed):
        try:
            raise FlowFailed("vagrant up failed")
        finally:
            stack.unwind()
    assert done == ["vms", "pool", "libvirtd", "namespace"]


def test_sigterm_raises_interrupted_once_then_is_only_noted() -> None:
    said: list[str] = []
    guard = SignalGuard(say=said.append)
    with guard.installed():
        with pytest.raises(Interrupted) as stopped, guard.raise_within():
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0)  # let the handler run
            pytest.fail("no Interrupted")
        assert stopped.value.signum == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGTERM)  # during the teardown: noted, not raised
    assert said == ["vagrant-verify: SIGTERM: tearing down first"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_run_and_tear_down_unwinds_on_failure_and_interrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings(tmp_path)
    main.fresh_artifacts(settings)
    order: list[str] = []

    class FakeFlow:
        def __init__(self, s: Settings, timer: PhaseTimer, stack: UndoStack) -> None:
            self.timer, self.stack = timer, stack

        def run(self) -> None:
            self.timer.start("libvirt start")
            self.stack.push("namespace", lambda: order.append("namespace"))
            self.stack.push("daemon", lambda: order.append("daemon"))
            (settings.secrets).mkdir()
            (settings.secrets / "worker-1.token").write_text("s3cr3t-not-logged\n")
            raise behaviour.pop(0)

    behaviour: list[BaseException] = [FlowFailed("box add failed"), Interrupted(signal.SIGINT)]
    monkeypatch.setattr(main, "Flow", FakeFlow)
    assert main.run_and_tear_down(settings, SignalGuard()) == 1
    assert order == ["daemon", "namespace"]
    assert not settings.run.exists()  # the run's state went last, after the secret check
    report = (settings.art / "report.txt").read_text()
    assert (
        "none of the 1 token secrets, 0 TLS private keys (0 lines) is in the artifacts or the"
        " output" in report
    )
    summary = json.loads((settings.art / "summary.json").read_text())
    assert summary["exit_status"] == 1
    assert list(summary["phases_s"]) == ["libvirt start", "teardown"]

    main.fresh_artifacts(settings)
    order.clear()
    assert main.run_and_tear_down(settings, SignalGuard()) == 130
    assert order == ["daemon", "namespace"]


def test_a_leaked_secret_fails_a_run_that_passed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings(tmp_path)
    main.fresh_artifacts(settings)

    class LeakyFlow:
        def __init__(self, *args: object) -> None:
            pass

        def run(self) -> None:
            settings.secrets.mkdir()
            (settings.secrets / "management.token").write_text("abc-123\n")
            (settings.logs / "up.log").write_text("token abc-123 in a log\n")

    monkeypatch.setattr(main, "Flow", LeakyFlow)
    assert main.run_and_tear_down(settings, SignalGuard()) == 1
    report = (settings.art / "report.txt").read_text()
    assert "teardown: SECRET FOUND in: logs/up.log" in report


def test_phase_timer_writes_one_line_per_phase_and_the_table_totals(tmp_path: Path) -> None:
    clock, said = FakeClock(), []
    timer = PhaseTimer(tmp_path / "phases.txt", clock=clock, say=said.append)
    timer.start("stage")
    clock.now += 2.54
    timer.start("box build")
    clock.now += 70.0
    timer.end()
    timer.end()  # nothing running: no line
    text = timer.text()
    assert text == "stage                      2.5 s\nbox build                 70.0 s\n"
    assert said == ["\n== stage", "\n== box build"]
    assert parse_phases(text) == {"stage": 2.5, "box build": 70.0}
    assert phase_table(text)[-1] == "total                     72.5 s"


def test_summary(tmp_path: Path) -> None:
    (tmp_path / "verify.xml").write_text("<testsuite/>")
    (tmp_path / "ticks.json").write_text(json.dumps({"passed": True}))
    (tmp_path / "scheduler.json").write_text(json.dumps({"passed": False}))
    phases = "stage                      2.5 s\nbootstrap + apply          3.4 s\n"
    summary = artifacts.build_summary(0, 3, 2, phases, tmp_path)
    assert summary == {
        "exit_status": 0,
        "servers": 3,
        "workers": 2,
        "verify_junit": "verify.xml",
        "tick_check_passed": True,
        "scheduler_check_passed": False,
        "phases_s": {"stage": 2.5, "bootstrap + apply": 3.4},
        "total_s": 5.9,
    }
    (tmp_path / "verify.xml").unlink()
    (tmp_path / "ticks.json").unlink()
    (tmp_path / "scheduler.json").unlink()
    early = artifacts.build_summary(1, 1, 2, "", tmp_path)
    assert early["verify_junit"] is None and early["tick_check_passed"] is None
    assert early["scheduler_check_passed"] is None
    assert early["total_s"] == 0


EC_KEY = (
    b"-----BEGIN EC PRIVATE KEY-----\n"
    b"MHcCAQEEIFakeFakeFakeFakeFakeFakeFakeFakeFakeFakeFakeoAoGCCqGSM49\n"
    b"AwEHoUQDQgAEsecondLineOfTheFakeKeyBodyxxxxxxxxxxxxxxxxxxxxxxxxxx\n"
    b"Zg==\n"
    b"-----END EC PRIVATE KEY-----\n"
)


def test_private_key_lines_are_the_body_without_armour_or_short_tails() -> None:
    assert artifacts.private_key_lines(EC_KEY) == EC_KEY.splitlines()[1:3]


@pytest.mark.parametrize(
    ("leaked", "found"),
    [
        (b"a log: AwEHoUQDQgAEsecondLineOfTheFakeKeyBodyxxxxxxxxxxxxxxxxxxxxxxxxxx", True),
        (b"encrypt = " + b"R29zc2lwS2V5R29zc2lwS2V5R29zc2lwS2V5MTI=", True),
        (b"-----BEGIN EC PRIVATE KEY----- Zg== (armour and a short tail: no secret)", False),
    ],
    ids=["key-line", "gossip-key", "armour"],
)
def test_the_secret_check_finds_a_private_key_line_and_the_gossip_key(
    tmp_path: Path, leaked: bytes, found: bool
) -> None:
    art = tmp_path / "art"
    (art / "run" / "secrets").mkdir(parents=True)
    (art / "run" / "secrets" / "worker-1.token").write_text("11111111-2222-3333-4444-555555555555")
    tls = art / "stage" / "tls"
    tls.mkdir(parents=True)
    (tls / "worker-1-key.pem").write_bytes(EC_KEY)
    (tls / "ca-key.pem").write_bytes(EC_KEY.replace(b"Fake", b"Fcaa"))
    (tls / "gossip.key").write_text("R29zc2lwS2V5R29zc2lwS2V5R29zc2lwS2V5MTI=\n")
    (art / "logs").mkdir()
    (art / "logs" / "provision-worker-1.log").write_bytes(leaked)
    assert artifacts.check_no_secret_kept(art, art / "run" / "secrets", tls) is not found
    report = (art / "report.txt").read_text()
    if found:
        assert report == "teardown: SECRET FOUND in: logs/provision-worker-1.log\n"
    else:
        assert report == (
            "teardown: none of the 1 token secrets, 2 TLS private keys (4 lines) and the gossip"
            " key is in the artifacts or the output\n"
        )


def test_secret_search_skips_the_private_dirs_and_reads_every_kept_file(tmp_path: Path) -> None:
    (tmp_path / "run" / "secrets").mkdir(parents=True)
    (tmp_path / "run" / "secrets" / "w.token").write_bytes(b"tok-1\n\n")
    (tmp_path / "stage").mkdir()
    (tmp_path / "stage" / "copy").write_bytes(b"tok-1")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "qemu.log").write_bytes(b"\x00binary tok-1")
    (tmp_path / "flow.log").write_text("clean")
    secrets = artifacts.minted_secrets(tmp_path / "run" / "secrets")
    assert secrets == [b"tok-1"]
    found = artifacts.files_holding(secrets, artifacts.kept_files(tmp_path))
    assert found == [tmp_path / "logs" / "qemu.log"]


def test_stamp_line_cuts_progress_bars_and_erase_codes() -> None:
    line = "    server-1: Progress: 10%\r    server-1: Progress: 100%\x1b[K done\n"
    assert stamp_line(line, now=0).split(" ", 1)[1] == " done"
    assert stamp_line("plain\n", now=0).endswith(" plain")


def test_settings_defaults_names_and_export(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    assert settings.nodes == ["server-1", "server-2", "server-3", "worker-1", "worker-2"]
    assert settings.namespace == "lockctl-vg-abc123" and settings.prefix == "lockctl-abc123-"
    assert settings.server1 == "https://192.168.56.11:8501"
    assert settings.box_file.name.startswith("lockctl-bookworm-")
    environ: dict[str, str] = {"VAGRANT_SERVERS": "1"}
    settings.export(environ)
    assert environ["VAGRANT_SERVERS"] == "1" and environ["VAGRANT_WORKERS"] == "2"
    assert environ["VAGRANT_CHECKPOINT_DISABLE"] == "1"
    assert environ["VAGRANT_LIBVIRT_POOL"] == "lockctl-vg-abc123"
    # every host-side lockctl call presents lockctl's -cli pair from the stage's tls/
    tls = settings.stage / "tls"
    assert environ["CONSUL_CACERT"] == str(tls / "ca.pem")
    assert environ["CONSUL_CLIENT_CERT"] == str(tls / "lockctl.pem")
    assert environ["CONSUL_CLIENT_KEY"] == str(tls / "lockctl-key.pem")
    with pytest.raises(SettingsError):
        Settings.from_environment(tmp_path, {"VAGRANT_WORKERS": "two"}, run_id="x")


def stage_tls(settings: Settings, names: list[str]) -> None:
    """A stage's tls/ as vagrant/prepare leaves it (fake contents)."""
    tls = settings.tls_dir
    tls.mkdir(parents=True)
    (tls / "ca.pem").write_text("CA CERT")
    for name in names:
        (tls / f"{name}.pem").write_text(f"{name} CERT")
        (tls / f"{name}-key.pem").write_text(f"{name} KEY")


def tar_members(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: m for m in tar.getmembers()}


def test_worker_files_go_as_a_root_owned_tar_with_a_0600_token_and_key(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    made = settings.run / "workers" / "worker-1"
    (made / "systemd").mkdir(parents=True)
    for name in ("lockctl.json", "lockctl.env", "systemd/lockctl-x.timer"):
        (made / name).write_text(name)
    settings.secrets.mkdir(parents=True)
    (settings.secrets / "worker-1.token").write_text("tok")
    stage_tls(settings, ["worker-1", "worker-2", "lockctl"])
    members = tar_members(delivery.worker_files_tar(settings, "worker-1"))
    assert sorted(members) == [
        "etc/lockctl/lockctl.env",
        "etc/lockctl/lockctl.json",
        "etc/lockctl/tls/ca.pem",
        "etc/lockctl/tls/worker-1-key.pem",
        "etc/lockctl/tls/worker-1.pem",
        "etc/lockctl/worker-1.token",
        "etc/systemd/system/lockctl-x.timer",
    ]  # only its own pair: never worker-2's, lockctl's or the CA's key
    assert members["etc/lockctl/worker-1.token"].mode == 0o600
    assert members["etc/lockctl/tls/worker-1-key.pem"].mode == 0o600
    assert members["etc/lockctl/tls/ca.pem"].mode == 0o644
    assert all(m.uid == 0 and m.uname == "root" and m.isfile() for m in members.values())


def test_each_agent_gets_its_config_ca_and_own_pair_root_owned_and_0600(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    stage_tls(settings, ["server-1", "server-2", "lockctl"])
    (settings.stage / "agents").mkdir()
    (settings.stage / "agents" / "server-1.hcl").write_text('encrypt = "gossip"\n')
    data = delivery.agent_files_tar(settings, "server-1")
    members = tar_members(data)
    assert list(members) == [
        "etc/consul.d",
        "etc/consul.d/tls",
        "etc/consul.d/agent.hcl",
        "etc/consul.d/tls/ca.pem",
        "etc/consul.d/tls/server-1.pem",
        "etc/consul.d/tls/server-1-key.pem",
    ]
    modes = {name: (m.mode, m.isdir()) for name, m in members.items()}
    assert modes["etc/consul.d"] == (0o755, True)
    assert modes["etc/consul.d/tls"] == (0o700, True)
    assert modes["etc/consul.d/agent.hcl"] == (0o600, False)  # the gossip key is in it
    assert modes["etc/consul.d/tls/server-1-key.pem"] == (0o600, False)
    assert modes["etc/consul.d/tls/server-1.pem"] == (0o644, False)
    assert all(m.uid == 0 and m.gid == 0 for m in members.values())
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        key = tar.extractfile("etc/consul.d/tls/server-1-key.pem")
        assert key is not None and key.read() == b"server-1 KEY"


def test_the_agent_files_go_in_before_provisioning_and_its_steps_use_https(
    tmp_path: Path,
) -> None:
    phases = (REPO / "vagrant" / "flow" / "steps.py").read_text()
    at = phases.index('("deliver agent files", self.deliver_agent_files)')
    assert at < phases.index('("provisioning", self.provision)')
    vagrantfile = (REPO / "vagrant" / "Vagrantfile").read_text()
    assert 'File.join(STAGE, "agents"' not in vagrantfile  # no config through Vagrant's upload
    provision = (REPO / "vagrant" / "provision-consul.sh").read_text()
    assert "https://$ADDRESS:8501/v1/status/leader" in provision
    assert "chmod 0600 /etc/consul.d/agent.hcl" in provision


def make_settings(tmp_path: Path) -> Settings:
    (tmp_path / "vagrant").mkdir(exist_ok=True)
    (tmp_path / "vagrant" / "build-box").write_text("#!/bin/sh\n")
    return Settings.from_environment(tmp_path, {}, run_id="abc123")


def test_a_failed_vagrant_up_shows_its_message_and_only_the_innermost_frames() -> None:
    frame = "15:13:16 /usr/share/gems/vagrant-libvirt/action/{}.rb:{}:in `call'"
    log = [
        "15:13:15 ==> server-1: Starting domain.",
        "15:13:16 Error while activating network: Call to virNetworkCreate failed.",
        *(frame.format(f"step{n}", n) for n in range(100)),
        "15:13:16 vagrant up: the last line",
    ]
    shown = without_backtraces(log)
    assert shown[:5] == [log[0], log[1], log[2], log[3], log[4]]
    assert shown[5] == "    ... 97 more backtrace frames"
    assert shown[-1] == "15:13:16 vagrant up: the last line"
    assert without_backtraces(log[2:6]) == [
        log[2],
        log[3],
        log[4],
        "    ... 1 more backtrace frames",
    ]


class FakeShell:
    """Stands in for flow.commands.Shell: `vagrant up` exits with the next of `statuses`, and
    the failed attempt's log says so (as Vagrant's did on CI)."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = statuses
        self.started: list[tuple[list[str], str]] = []

    def ns(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", "ns", *argv]

    def start(self, argv: list[str], name: str, *, log: Path, stamp: bool) -> str:
        self.started.append((argv, log.name))
        log.write_text("Error while activating network\n")
        return name

    def wait(self, child: str, timeout: float) -> int:
        return self.statuses.pop(0)


def flow_with_fake_shell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, statuses: list[int], done: list[str]
) -> tuple[steps.Flow, FakeShell]:
    settings = make_settings(tmp_path)
    main.fresh_artifacts(settings)
    flow = steps.Flow(settings, PhaseTimer(settings.art / "phases.txt"), UndoStack())
    shell = FakeShell(statuses)
    flow.shell = shell  # type: ignore[assignment]
    monkeypatch.setattr(flow, "destroy", lambda: done.append("destroy"))
    monkeypatch.setattr(flow, "boot_analysis", lambda: done.append("boot analysis"))
    monkeypatch.setattr(
        steps.libvirt, "remove_machines", lambda s, sh: done.append(f"remove_machines {s.prefix}")
    )
    monkeypatch.setattr(steps, "output_of", lambda argv: "server-1   running (libvirt)\n")
    return flow, shell


def test_a_failed_vagrant_up_is_destroyed_and_tried_once_more_from_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    done: list[str] = []
    flow, shell = flow_with_fake_shell(tmp_path, monkeypatch, [1, 0], done)
    flow.vagrant_up()
    assert [log for _argv, log in shell.started] == ["up.log", "up-2.log"]
    assert all(argv[-2:] == ["up", "--no-provision"] for argv, _log in shell.started)
    # the first try's VMs are gone, through Vagrant and libvirt, before the second starts
    assert done == ["destroy", "remove_machines lockctl-abc123-", "boot analysis"]
    out = capsys.readouterr().out
    assert "Error while activating network" in out  # the failed try's log, shown
    assert "vagrant up failed (logs/up.log); removing its VMs and trying again" in out
    assert len(flow.stack) == 1  # `vagrant destroy`, for the teardown


def test_vagrant_up_failing_twice_fails_the_flow_and_leaves_destroy_on_the_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    done: list[str] = []
    flow, shell = flow_with_fake_shell(tmp_path, monkeypatch, [1, 1], done)
    with pytest.raises(FlowFailed, match="vagrant up failed 2 times"):
        flow.vagrant_up()
    assert len(shell.started) == steps.UP_ATTEMPTS == 2
    assert done == ["destroy", "remove_machines lockctl-abc123-"]  # once, between the tries
    assert flow.stack.unwind() == []  # the teardown destroys what the second try made
    assert done[-1] == "destroy"


def load_prepare() -> ModuleType:
    """vagrant/prepare, a script without a .py suffix, as a module."""
    loader = importlib.machinery.SourceFileLoader("prepare", str(REPO / "vagrant" / "prepare"))
    spec = importlib.util.spec_from_loader("prepare", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_prepare_makes_the_vms_tls_on_the_host_and_renders_https_gossip_encrypted_configs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the real `consul tls`: the CA, each server's certificate naming
    server.dc1.consul, its node and its VM's address, each worker's naming its address,
    lockctl's -cli pair and the gossip key; every key 0600; each agent's config 0600 with HTTPS
    only, verification both ways and the gossip key; the spec and inventory at https://IP:8501."""
    from provision.cluster.agent_config import ConfigDialect
    from provision.cluster.consul_binary import install_consul
    from provision.cluster.tls import read_gossip_key

    binary = install_consul()  # the suite's binary: CONSUL_BIN, PATH or the cache `make` fills
    prepare = load_prepare()
    monkeypatch.delenv("VAGRANT_SUBNET", raising=False)
    agents = prepare.layout()
    stage = tmp_path / "stage"
    stage.mkdir(mode=0o700)
    cluster = prepare.make_tls(stage, agents, binary)
    tls = stage / "tls"
    names = ["server-1", "server-2", "server-3", "worker-1", "worker-2", "lockctl"]
    assert sorted(p.name for p in tls.glob("*-key.pem")) == sorted(
        [f"{n}-key.pem" for n in names] + ["ca-key.pem"]
    )
    for path in tls.iterdir():
        secret = path.name.endswith("-key.pem") or path.name == "gossip.key"
        assert path.stat().st_mode & 0o777 == (0o600 if secret else 0o644), path
    server = ssl._ssl._test_decode_cert(str(tls / "server-2.pem"))  # type: ignore[attr-defined]
    assert {("DNS", "server.dc1.consul"), ("DNS", "server-2.server.dc1.consul")} <= set(
        server["subjectAltName"]
    )
    assert ("IP Address", "192.168.56.12") in server["subjectAltName"]
    worker = ssl._ssl._test_decode_cert(str(tls / "worker-1.pem"))  # type: ignore[attr-defined]
    assert ("IP Address", "192.168.56.21") in worker["subjectAltName"]

    gossip = read_gossip_key(cluster)
    prepare.render_agents(agents, stage / "agents", ConfigDialect.of(binary.version), gossip)
    for agent in agents:
        path = stage / "agents" / f"{agent.name}.hcl"
        assert path.stat().st_mode & 0o777 == 0o600
        text = path.read_text()
        has_gossip_key = f'encrypt = "{gossip.reveal()}"' in text  # never in an assert message
        assert has_gossip_key, agent.name
        assert "http  = -1" in text and "https = 8501" in text
        assert f'key_file               = "/etc/consul.d/tls/{agent.name}-key.pem"' in text
        assert "verify_incoming        = true" in text
        assert "verify_server_hostname = true" in text
    workers = [a for a in agents if not a.server]
    assert 'address = "https://192.168.56.22:8501"' in prepare.vm_spec(workers, 10, 5)


def test_the_flows_own_consul_clients_present_lockctls_pair_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger reads and cluster-ready reach the VMs' HTTPS-only agents with the CA and
    lockctl's client pair the flow exports (Settings.tls_environment), as lockctl's commands do."""
    from flow import ledger_read

    settings = make_settings(tmp_path)
    stage_tls(settings, ["lockctl"])
    token = tmp_path / "management.token"
    token.write_text("11111111-2222-3333-4444-555555555555\n")
    for name, value in settings.tls_environment().items():
        monkeypatch.setenv(name, value)
    consul = ledger_read.consul_at(settings.server1, str(token))
    tls = settings.tls_dir
    assert consul.settings.address == "https://192.168.56.11:8501"
    assert consul.settings.ca_cert == tls / "ca.pem"
    assert consul.settings.client_cert == tls / "lockctl.pem"
    assert consul.settings.client_key == tls / "lockctl-key.pem"


class PipeShell:
    """Stands in for flow.commands.Shell in a delivery: records each SSH command and what was
    written to its stdin; the nodes in `failing` exit 1."""

    def __init__(self, failing: set[str]) -> None:
        self.failing = failing
        self.commands: list[str] = []
        self.fed: dict[str, bytes] = {}

    def ns(self, argv: list[str]) -> list[str]:
        return argv

    def start(self, argv: list[str], name: str, *, stdin: int) -> object:
        shell, node, command = self, argv[-2], argv[-1]
        self.commands.append(command)

        class Stdin(io.BytesIO):
            def close(self) -> None:
                shell.fed[node] = self.getvalue()
                super().close()

        class Popen:
            stdin = Stdin()

        class Started:
            popen = Popen()
            status = 1 if node in self.failing else 0

        return Started()

    def wait_all(self, children: list[object], timeout: float) -> list[int]:
        return [child.status for child in children]  # type: ignore[attr-defined]


def test_a_delivery_feeds_each_node_its_own_tar_and_names_the_nodes_that_failed(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path)
    main.fresh_artifacts(settings)
    flow = steps.Flow(settings, PhaseTimer(settings.art / "phases.txt"), UndoStack())
    shell = PipeShell(failing={"server-2"})
    flow.shell = shell  # type: ignore[assignment]
    nodes = ["server-1", "server-2", "worker-1"]
    with pytest.raises(FlowFailed, match=r"^delivering to server-2 failed$"):
        flow.deliver(
            nodes, lambda node: f"tar of {node}".encode(), f"{steps.SHOW_MODES} /k/{{node}}"
        )
    assert shell.fed == {node: f"tar of {node}".encode() for node in nodes}
    assert (
        shell.commands[0] == "sudo tar -xpf - -C / && sudo stat -c 'server-1: %n %a %U' /k/server-1"
    )


def test_the_workers_warm_import_names_only_modules_that_exist() -> None:
    """The worker's provisioner imports what `lockctl run` and `schedule` load, once, to compile
    it: a module renamed or deleted in provision/ must be renamed there too, or every VM's
    provisioning fails (as it did when the runner's engine was deleted)."""
    script = (REPO / "vagrant" / "provision-lockctl.sh").read_text(encoding="utf-8")
    warm = re.search(r"^WARM='import (.+)'$", script, re.MULTILINE)
    assert warm is not None, "vagrant/provision-lockctl.sh has no WARM import line"
    modules = [name.strip() for name in warm.group(1).split(",")]
    assert "provision.runner.plain" in modules  # what a plain lock's `lockctl run` loads
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    assert missing == [], f"WARM names modules that do not exist: {missing}"
