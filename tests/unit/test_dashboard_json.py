"""dashboards/lockctl.json: what dashboards/build.py builds now (`make dashboard` after a change),
valid for grafana-foundation-sdk's own models (there is no Grafana server here), every query
PromQL that Prometheus's promtool parses, on the `$job` variable, never padded with vector(0);
and every panel said in docs/dashboard.md. tests/integration/test_dashboard.py runs the queries
on a real Prometheus that scrapes real schedulers."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.cog.runtime import Runtime
from grafana_foundation_sdk.models import prometheus
from grafana_foundation_sdk.models.dashboard import Dashboard

ROOT = Path(__file__).resolve().parents[2]
BUILDER = ROOT / "dashboards" / "build.py"
COMMITTED = ROOT / "dashboards" / "lockctl.json"
DOCS = ROOT / "docs" / "dashboard.md"


def _builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lockctl_dashboard_build", BUILDER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _committed() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(COMMITTED.read_text())
    return loaded


def _panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [panel for panel in board["panels"] if panel["type"] != "row"]


def _exprs(board: dict[str, Any]) -> list[str]:
    return [target["expr"] for panel in _panels(board) for target in panel["targets"]]


def test_the_committed_dashboard_is_what_the_builder_makes_now() -> None:
    assert COMMITTED.read_text() == _builder().dashboard_json(), (
        "dashboards/lockctl.json is stale: run `make dashboard` and commit it"
    )


def _missing(original: Any, decoded: Any, where: str = "") -> list[str]:
    """Where `decoded` lacks or changed what `original` holds (decoded may add defaults)."""
    if isinstance(original, dict):
        if not isinstance(decoded, dict):
            return [where or "/"]
        return [
            problem
            for key, value in original.items()
            for problem in (
                _missing(value, decoded[key], f"{where}/{key}")
                if key in decoded
                else [f"{where}/{key}"]
            )
        ]
    if isinstance(original, list):
        if not isinstance(decoded, list) or len(decoded) != len(original):
            return [where]
        return [p for i, v in enumerate(original) for p in _missing(v, decoded[i], f"{where}/{i}")]
    return [] if original == decoded else [where]


def _decoded(board: dict[str, Any]) -> tuple[Dashboard, dict[str, Any]]:
    """The dashboard through the SDK's models (its panel and query plugins registered), and
    that model encoded again: a key the models do not know is dropped on the way."""
    register_default_plugins()
    model = Dashboard.from_json(board)
    return model, json.loads(json.dumps(model, cls=JSONEncoder))


def test_the_dashboard_is_valid_for_the_sdks_models() -> None:
    board = _committed()
    model, again = _decoded(board)
    assert _missing(board, again) == []
    panels = [p for p in model.panels or () if getattr(p, "type_val", None) != "row"]
    assert len(panels) == len(_panels(board))
    known = set(Runtime().panelcfg_variants)
    for panel in panels:
        assert panel.type_val in known, panel.title
        assert panel.targets, panel.title
        assert all(isinstance(t, prometheus.Dataquery) for t in panel.targets), panel.title


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda b: b.update(refreshh="30s"), "/refreshh"),  # a typo'd key
        (lambda b: b["panels"][1].update(gridPoss={}), "/panels/1/gridPoss"),
        (lambda b: b["panels"][1]["targets"][0].update(exprr="up"), "/panels/1/targets/0/exprr"),
    ],
)
def test_the_validation_finds_a_key_the_models_do_not_know(change: Any, where: str) -> None:
    board = _committed()
    change(board)
    assert _missing(board, _decoded(board)[1]) == [where]


def test_every_query_reads_the_job_variable_and_is_never_padded() -> None:
    board = _committed()
    exprs = _exprs(board)
    assert exprs
    for expr in exprs:
        selectors = re.findall(r"lockctl_\w+\{([^}]*)\}", expr)
        assert selectors and all('job=~"$job"' in s for s in selectors), expr
        assert "vector(" not in expr and " or " not in expr, expr
    for panel in _panels(board):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert all(t["datasource"] == panel["datasource"] for t in panel["targets"])
    names = [variable["name"] for variable in board["templating"]["list"]]
    assert names == ["datasource", "job"]


def test_every_query_parses_as_promql() -> None:
    """Through Prometheus's own parser: promtool checks them as recording rules."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: scripts/install-test-packages installs it (root)"
    exprs = [
        e.replace("$job", "a|b").replace("$__rate_interval", "1m") for e in _exprs(_committed())
    ]
    rules = [{"record": f"dashboard:query_{n}", "expr": e} for n, e in enumerate(exprs)]
    checked = _promtool_check(promtool, {"groups": [{"name": "dashboard", "rules": rules}]})
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in checked.stdout
    broken = [*rules, {"record": "dashboard:broken", "expr": "sum by (job (up)"}]
    failed = _promtool_check(promtool, {"groups": [{"name": "dashboard", "rules": broken}]})
    assert failed.returncode != 0, failed.stdout  # the check can fail


def _promtool_check(promtool: str, rules: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, "check", "rules", "/dev/stdin"],
        input=json.dumps(rules),  # JSON is YAML
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_panels_tile_the_grid_without_overlap() -> None:
    taken: set[tuple[int, int]] = set()
    ids = []
    for panel in _committed()["panels"]:
        ids.append(panel["id"])
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & taken, panel["title"]
        taken |= cells
    assert len(ids) == len(set(ids))


def test_every_panel_is_said_in_the_docs() -> None:
    said = DOCS.read_text()
    for panel in _committed()["panels"]:
        assert f"**{panel['title']}**" in said, panel["title"]
