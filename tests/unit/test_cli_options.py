"""The shared flags: every command that talks to Consul has all seven connection flags and they
reach its settings; worker-config's --secrets-dir and its old name --token-dir; verify's
--templates-dir; the JSON records the core results carry."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from provision.acl.agent_tokens import AgentTokenResult
from provision.acl.bootstrap import BootstrapResult
from provision.acl.render import render_policies
from provision.acl.rotate import RotateResult
from provision.cli import app, options
from provision.consul import ConsulSettings, resolve_settings
from provision.consul.errors import ConsulUnavailable
from provision.runner.status import LockState
from provision.spec import load_spec
from provision.spec.names import DEFAULT_OWNER, managed_description
from provision.system.templates import CHECKOUT_TEMPLATES

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "policies" / "locks.hcl"
runner = CliRunner()

CONNECTION_FLAGS = {
    "--address",
    "--token-file",
    "--timeout",
    "--ca-cert",
    "--client-cert",
    "--client-key",
    "--tls-skip-verify",
}
CONSUL_COMMANDS = ["bootstrap", "plan", "apply", "rotate", "status", "verify"]
# The least each command needs before it reaches Consul (the spec, a writable secrets folder).
REQUIRED: dict[str, list[str]] = {
    "bootstrap": ["--management-token-file", "{tmp}/management.token"],
    "plan": ["--spec", str(EXAMPLE), "--secrets-dir", "{tmp}/secrets"],
    "apply": ["--spec", str(EXAMPLE), "--secrets-dir", "{tmp}/secrets"],
    "rotate": ["--worker", "worker-1", "--secrets-dir", "{tmp}/secrets"],
    "status": ["--spec", str(EXAMPLE)],
    "verify": ["--spec", str(EXAMPLE), "--secrets-dir", "{tmp}/secrets"],
}


@pytest.fixture(autouse=True)
def _no_consul_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's shell may point at a real cluster: these tests must not see it."""
    for name in (
        "CONSUL_HTTP_ADDR",
        "CONSUL_HTTP_TOKEN",
        "CONSUL_HTTP_TOKEN_FILE",
        "CONSUL_HTTP_SSL",
        "CONSUL_HTTP_SSL_VERIFY",
        "CONSUL_CACERT",
        "CONSUL_CLIENT_CERT",
        "CONSUL_CLIENT_KEY",
        "LOCKCTL_SECRETS_DIR",
        "LOCKCTL_TEMPLATES_DIR",
        "LOCKCTL_SPEC",
    ):
        monkeypatch.delenv(name, raising=False)


def _flags(command: str) -> set[str]:
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    params = group.commands[command].params
    return {opt for param in params for opt in param.opts}


def _args(command: str, tmp_path: Path) -> list[str]:
    return [command, *(arg.format(tmp=tmp_path) for arg in REQUIRED[command])]


@pytest.mark.parametrize("command", CONSUL_COMMANDS)
def test_every_consul_command_has_all_seven_connection_flags(command: str) -> None:
    assert _flags(command) >= CONNECTION_FLAGS


def test_run_reads_its_worker_config_not_connection_flags() -> None:
    assert not _flags("run") & (CONNECTION_FLAGS - {"--timeout"})  # its --timeout is --wait's


def test_status_has_ca_cert() -> None:
    result = runner.invoke(app, ["status", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "--ca-cert" in result.output


@pytest.mark.parametrize("command", CONSUL_COMMANDS)
def test_every_consul_command_passes_its_ca_cert_to_the_settings(
    command: str, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-ca.pem"
    result = runner.invoke(app, [*_args(command, tmp_path), "--ca-cert", str(missing)])
    assert result.exit_code == 2, result.output
    assert f"--ca-cert {missing}: no such file or folder" in result.output


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[ConsulSettings]:
    """What each command would connect with; the connection then fails as if Consul were down."""
    seen: list[ConsulSettings] = []

    def connect(settings: ConsulSettings) -> Any:
        seen.append(settings)
        raise ConsulUnavailable("consul: test: not connecting")

    monkeypatch.setattr(options, "connect", connect)
    return seen


@pytest.mark.parametrize("command", [c for c in CONSUL_COMMANDS if c != "verify"])
def test_all_seven_flags_reach_the_settings(
    command: str, tmp_path: Path, captured: list[ConsulSettings]
) -> None:
    # The token file is named *.token, as scripts/scan-secrets expects of files that hold a
    # (here placeholder) secret; the PEM files hold no secret-like text.
    files = {name: tmp_path / name for name in ("ca.pem", "cert.pem", "key.pem")}
    files["token"] = tmp_path / "test.token"
    for name, path in files.items():
        path.write_text("test-placeholder\n" if name == "token" else "not a pem\n")
    flags = ["--address", "127.0.4.99:8501", "--token-file", str(files["token"])]
    flags += ["--timeout", "2.5", "--ca-cert", str(files["ca.pem"]), "--tls-skip-verify"]
    flags += ["--client-cert", str(files["cert.pem"]), "--client-key", str(files["key.pem"])]
    result = runner.invoke(app, [*_args(command, tmp_path), *flags])
    assert result.exit_code == 3, result.output
    (settings,) = captured
    assert settings.address == "http://127.0.4.99:8501"
    assert settings.token is not None and settings.token.reveal() == "test-placeholder"
    assert settings.timeout == 2.5
    assert (settings.ca_cert, settings.client_cert, settings.client_key) == (
        files["ca.pem"],
        files["cert.pem"],
        files["key.pem"],
    )
    assert settings.verify_tls is False


def test_token_help_names_the_order_the_code_follows(tmp_path: Path) -> None:
    help_text = runner.invoke(app, ["status", "--help"], env={"COLUMNS": "250"}).output
    line = next(line for line in help_text.splitlines() if "--token-file" in line)
    assert line.index("CONSUL_HTTP_TOKEN_FILE") < line.index("CONSUL_HTTP_TOKEN]")
    token_file = tmp_path / "from-file"
    token_file.write_text("from-the-file\n")
    env = {"CONSUL_HTTP_TOKEN_FILE": str(token_file), "CONSUL_HTTP_TOKEN": "from-the-variable"}
    token = resolve_settings(env=env).token
    assert token is not None and token.reveal() == "from-the-file"


# --- worker-config: --secrets-dir, and --token-dir its old name -------------------------------


def _tree(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def _worker_config(out: Path, *flags: str) -> Any:
    args = ["worker-config", "--all", "--spec", str(EXAMPLE), "--out", str(out)]
    args += ["--config-dir", "/etc/lockctl", *flags]  # else the files name the --out folder
    return runner.invoke(app, args)


def test_worker_config_secrets_dir_and_token_dir_write_the_same_files(tmp_path: Path) -> None:
    on_worker = "/etc/lockctl/secrets"
    new = _worker_config(tmp_path / "new", "--secrets-dir", on_worker)
    old = _worker_config(tmp_path / "old", "--token-dir", on_worker)
    assert new.exit_code == 0, new.output
    assert old.exit_code == 0, old.output
    assert _tree(tmp_path / "new") == _tree(tmp_path / "old")
    assert f"{on_worker}/worker-1.token" in (tmp_path / "new/worker-1/lockctl.json").read_text()
    assert new.stdout.replace("/new/", "/old/") == old.stdout
    assert "--token-dir is deprecated: use --secrets-dir" in old.stderr
    assert "deprecated" not in new.stderr


def test_worker_config_token_dir_wins_over_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCKCTL_SECRETS_DIR", str(tmp_path / "admin-secrets"))
    result = _worker_config(tmp_path / "out", "--token-dir", "/etc/lockctl")
    assert result.exit_code == 0, result.output
    assert "/etc/lockctl/worker-1.token" in (tmp_path / "out/worker-1/lockctl.json").read_text()


def test_worker_config_refuses_two_different_folders(tmp_path: Path) -> None:
    result = _worker_config(tmp_path, "--secrets-dir", "/a", "--token-dir", "/b")
    assert result.exit_code == 2
    assert "--secrets-dir /a and --token-dir /b: give one" in result.stderr


def test_worker_config_help_shows_only_the_new_name() -> None:
    help_text = runner.invoke(app, ["worker-config", "--help"], env={"COLUMNS": "200"}).output
    assert "--secrets-dir" in help_text and "--token-dir" not in help_text


# --- verify --templates-dir ---------------------------------------------------------------------


class _LivePolicies:
    """A management client whose Consul holds `rules` (policy name -> rules)."""

    def __init__(self, rules: dict[str, str], owner: str = DEFAULT_OWNER) -> None:
        self.acl = self
        self.status = self  # verify asks every agent for its leader before the checks
        self._rules = rules
        self._owner = owner  # the owner every policy's marker names

    def leader(self) -> str:
        return "127.0.0.1:8300"

    def list_policies(self) -> list[SimpleNamespace]:
        return [
            SimpleNamespace(name=name, id=name, description=managed_description(name, self._owner))
            for name in self._rules
        ]

    def read_policy(self, policy_id: str) -> SimpleNamespace:
        return SimpleNamespace(rules=self._rules[policy_id])


@pytest.fixture
def own_templates(tmp_path: Path) -> Path:
    """A copy of lockctl's templates whose lock policy also denies one key under the prefix."""
    folder = tmp_path / "templates"
    for source in CHECKOUT_TEMPLATES.rglob("*.j2"):
        target = folder / source.relative_to(CHECKOUT_TEMPLATES)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(source.read_text())
    lock = folder / "policies" / "lock.hcl.j2"
    lock.write_text(lock.read_text() + 'key "{{ job.prefix }}readme" {\n  policy = "deny"\n}\n')
    return folder


def test_verify_lints_the_live_policies_against_the_given_templates(
    own_templates: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    live = render_policies(load_spec(EXAMPLE), own_templates)  # what apply wrote with them
    fake = _LivePolicies({policy.name: policy.rules for policy in live.policies})
    monkeypatch.setattr("provision.verify.context.Consul", lambda settings: fake)
    token = tmp_path / "management.token"
    token.write_text("test-placeholder\n")
    args = ["verify", "--spec", str(EXAMPLE), "--secrets-dir", str(tmp_path / "none")]
    args += ["--token-file", str(token), "--only", "live-policies-lint", "--json"]
    own = runner.invoke(app, [*args, "--templates-dir", str(own_templates)])
    packaged = runner.invoke(app, args)
    assert own.exit_code == 0, own.output
    assert json.loads(own.stdout)["checks"][0]["status"] == "pass"
    assert packaged.exit_code == 1, packaged.output
    (check,) = json.loads(packaged.stdout)["checks"]
    assert "in Consul differs from the rendered one" in check["summary"]


def test_verify_fails_a_policy_another_owner_manages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example's policies, as they are rendered, but marked as another spec owner's."""
    live = render_policies(load_spec(EXAMPLE), CHECKOUT_TEMPLATES)
    fake = _LivePolicies({policy.name: policy.rules for policy in live.policies}, "billing")
    monkeypatch.setattr("provision.verify.context.Consul", lambda settings: fake)
    token = tmp_path / "management.token"
    token.write_text("test-placeholder\n")
    args = ["verify", "--spec", str(EXAMPLE), "--secrets-dir", str(tmp_path / "none")]
    args += ["--token-file", str(token), "--only", "live-policies-lint", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    (check,) = json.loads(result.stdout)["checks"]
    assert check["status"] == "fail"
    assert (
        'policy lock-hourly-report in Consul is managed by owner "billing", not by this '
        'spec\'s owner "default"'
    ) in check["summary"]


def test_verify_templates_dir_must_be_a_folder(tmp_path: Path) -> None:
    args = ["verify", "--spec", str(EXAMPLE), "--templates-dir", str(tmp_path / "none")]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert f"--templates-dir {tmp_path / 'none'}: not a folder" in result.output


# --- the JSON records of core results -------------------------------------------------------------


def test_lock_state_record_is_every_field() -> None:
    claims = {"worker": "worker-1", "acquired_at": "t"}
    state = LockState("j", "locks/j/.lock", True, "s-1", "worker-1", claims, True, 3, 9)
    # `datacenter` only in a spec that names datacenters: the record is as it was without
    left_out = ("datacenter", "keys_seen", "keys_seen_count")  # only when they say something
    assert state.to_record() == {k: v for k, v in asdict(state).items() if k not in left_out}
    keyed = replace(state, keys_seen=("tenant-1",), keys_seen_count=1)
    assert (
        keyed.to_record()["keys_seen"] == ("tenant-1",)
        and keyed.to_record()["keys_seen_count"] == 1
    )
    in_dc2 = replace(state, datacenter="dc2")
    assert in_dc2.to_record() == {
        k: v for k, v in asdict(in_dc2).items() if k not in ("keys_seen", "keys_seen_count")
    }
    assert list(state.to_record()) == [
        "job",
        "key",
        "held",
        "session",
        "node",  # Consul's word
        "claims",  # the holder's record, as written
        "claim_matches_node",
        "lock_index",
        "modify_index",
        "last_tick",  # jobs with a schedule: the ledger's newest tick
        "next_tick",
        "suspect_ticks",  # records dated in the future: never the last tick
        "paused",  # who paused the job, when, why (None: not paused)
        "trigger_pending",  # who asked, when, why (None: no trigger waits for a replica)
        "backfill_pending",  # ticks left, who asked, when, why (None: no backfill waits)
    ]


def test_bootstrap_record_names_the_file_never_the_secret() -> None:
    from provision.system.secrets import Secret

    agent = AgentTokenResult("worker-1", "a-1", created=True)
    result = BootstrapResult(True, Path("m.token"), "m-1", (agent,), Secret("not-in-record"))
    assert result.to_record() == {
        "bootstrapped": True,
        "management_token_file": "m.token",
        "accessor_id": "m-1",
        "agents": [{"node": "worker-1", "accessor_id": "a-1", "created": True}],
    }
    assert BootstrapResult(False, None, None, ()).to_record()["management_token_file"] is None


def test_rotate_record() -> None:
    result = RotateResult("worker-1", "new-1", Path("s/worker-1.token"), ("old-1",))
    assert result.to_record() == {
        "worker": "worker-1",
        "accessor_id": "new-1",
        "file": "s/worker-1.token",
        "revoked": ["old-1"],
    }
