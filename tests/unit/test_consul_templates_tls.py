"""TLS layout and material without a cluster: addresses, records, and `consul keygen` / `consul
tls` failures (a fake binary), whose output never reaches a message."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from provision.cluster.consul_binary import ConsulBinary
from provision.cluster.layout import (
    LAYOUT_FILE,
    default_layout,
    load_layout,
    remove_cluster_files,
    save_layout,
)
from provision.cluster.tls import consul_settings, ensure_tls_material, tls_exports
from provision.errors import LocalEnvironmentError

LEAKED = "c2VjcmV0LWtleWdlbi1vdXRwdXQtbmV2ZXItc2hvd24="  # what the fake keygen prints


def test_a_tls_agent_serves_https_on_8501(tmp_path: Path) -> None:
    layout = default_layout(tmp_path, "127.0.9", 1, tls=True)
    assert layout.servers[0].http_address == "https://127.0.9.11:8501"
    assert layout.tls
    assert not default_layout(tmp_path, "127.0.9", 1).tls


def test_an_old_record_without_tls_loads_as_plain(tmp_path: Path) -> None:
    save_layout(default_layout(tmp_path, "127.0.9", 1))
    record = json.loads((tmp_path / LAYOUT_FILE).read_text())
    for agent in record["agents"]:
        del agent["tls"]  # a cluster.json written before --tls existed
    (tmp_path / LAYOUT_FILE).write_text(json.dumps(record))
    loaded = load_layout(tmp_path)
    assert loaded is not None and not loaded.tls


def test_settings_and_exports_name_the_ca_and_lockctls_pair(tmp_path: Path) -> None:
    layout = default_layout(tmp_path, "127.0.9", 1, tls=True)
    with pytest.raises(
        LocalEnvironmentError, match=r"ca\.pem, lockctl\.pem, lockctl-key\.pem missing"
    ):
        consul_settings(layout)
    layout.tls_dir.mkdir()
    for path in (layout.ca_cert_file, layout.cert_file("lockctl"), layout.key_file("lockctl")):
        path.write_text("x")
    settings = consul_settings(layout, address=layout.servers[0].http_address)
    assert settings.ca_cert == tmp_path / "tls" / "ca.pem"
    assert settings.client_cert == tmp_path / "tls" / "lockctl.pem"
    assert settings.client_key == tmp_path / "tls" / "lockctl-key.pem"
    assert dict(tls_exports(layout)) == {
        "CONSUL_CACERT": str(settings.ca_cert),
        "CONSUL_CLIENT_CERT": str(settings.client_cert),
        "CONSUL_CLIENT_KEY": str(settings.client_key),
    }
    plain = default_layout(tmp_path, "127.0.9", 1)
    assert consul_settings(plain).ca_cert is None and tls_exports(plain) == ()


def _fake_consul(tmp_path: Path, keygen: str, tls_exit: int = 0) -> ConsulBinary:
    """A `consul` whose `tls` subcommands write fake files (or fail) and whose keygen prints
    `keygen` and exits 1."""
    script = tmp_path / "bin" / "consul"
    script.parent.mkdir()
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = keygen ]; then echo "{keygen}"; exit 1; fi\n'
        f'if [ {tls_exit} != 0 ]; then echo "bad flag -x" >&2; exit {tls_exit}; fi\n'
        'if [ "$2" = ca ]; then n=consul-agent-ca; else n=dc1-x-consul-0; fi\n'
        'echo cert > "$n.pem"; echo key > "$n-key.pem"\n'
    )
    script.chmod(0o755)
    return ConsulBinary(script, "1.8.7", "CONSUL_BIN")


def test_a_failing_keygen_never_shows_its_output(tmp_path: Path) -> None:
    layout = default_layout(tmp_path / "state", "127.0.9", 1, tls=True)
    layout.state_dir.mkdir(mode=0o700)
    with pytest.raises(LocalEnvironmentError) as caught:
        ensure_tls_material(layout, _fake_consul(tmp_path, LEAKED))
    assert "consul keygen failed (exit 1)" in str(caught.value)
    assert LEAKED not in str(caught.value)
    assert not layout.gossip_key_file.exists()
    # What was made before the failure: keys 0600, certificates 0644, no staging folder left.
    for name in ("server-1", "worker-1", "lockctl"):
        assert stat.S_IMODE(layout.key_file(name).stat().st_mode) == 0o600
        assert stat.S_IMODE(layout.cert_file(name).stat().st_mode) == 0o644
    assert stat.S_IMODE(layout.tls_dir.stat().st_mode) == 0o700
    assert not list(layout.tls_dir.glob(".staging-*"))
    remove_cluster_files(layout)
    assert not layout.tls_dir.exists()


def test_a_failing_consul_tls_is_one_line_naming_the_command(tmp_path: Path) -> None:
    layout = default_layout(tmp_path / "state", "127.0.9", 1, tls=True)
    layout.state_dir.mkdir(mode=0o700)
    with pytest.raises(LocalEnvironmentError, match=r"^consul tls ca create failed: bad flag -x$"):
        ensure_tls_material(layout, _fake_consul(tmp_path, LEAKED, tls_exit=2))
    assert not list(layout.tls_dir.iterdir())
