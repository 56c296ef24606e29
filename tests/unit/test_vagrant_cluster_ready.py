"""vagrant/cluster-ready, the host-side wait for the VMs' cluster, builds lockctl's own client:
loaded here as the flow runs it, so a change of the client's API that it missed fails in the
unit lane, not after the VMs' six minutes of boot."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[2] / "vagrant" / "cluster-ready"


def _script() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("cluster_ready", str(SCRIPT))
    spec = importlib.util.spec_from_loader("cluster_ready", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_its_client_names_the_address_and_bounds_each_call(tmp_path: Path) -> None:
    script = _script()
    token = tmp_path / "token"
    token.write_text("00000000-0000-0000-0000-000000000000\n")
    token.chmod(0o600)
    consul = script.client("https://192.0.2.11:8501", str(token))
    assert consul.settings.address == "https://192.0.2.11:8501"
    assert consul.settings.timeout == script.CALL_TIMEOUT
    assert consul.settings.token is not None
