"""`lockctl worker-config --kubernetes` (issue 23, item 7): golden manifests per set of agentless
workers, each document checked against Kubernetes' own schema (kubernetes-validate's bundled
OpenAPI schemas, strict: an unknown field is an error; nothing is fetched), what they promise
(replicas, the projected token's audience, probes, the termination grace above the kill grace,
each pod's config), and every refusal, with nothing written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from provision import __version__
from provision.cli import app
from provision.spec import load_spec, parse_spec
from provision.workers.config import config_record
from provision.workers.kubernetes import BEARER_FILE

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "kubernetes"
SPEC = GOLDEN / "locks.hcl"
KUBERNETES = "1.37.0"  # the newest schema kubernetes-validate carries (1.37.0 of the package)
FLAGS = ["--image", "registry.example/app:1.2.3", "--namespace", "prod"]
TLS = ["--tls-dir", "/etc/consul/tls"]


def _render(tmp_path: Path, *extra: str, spec: Path = SPEC) -> tuple[int, str, Path]:
    out = tmp_path / "k8s"
    argv = ["worker-config", "--kubernetes", "--spec", str(spec), "--out", str(out), *extra]
    result = CliRunner().invoke(app, argv)
    return result.exit_code, result.output, out


def _docs(path: Path) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all(path.read_text()))


def test_the_manifests_are_the_golden_ones(tmp_path: Path) -> None:
    code, output, out = _render(tmp_path, "--all", *FLAGS, *TLS)
    assert code == 0, output
    assert sorted(p.name for p in out.iterdir()) == ["ingest.yaml", "report.yaml"]
    for path in out.iterdir():
        assert path.read_text() == (GOLDEN / path.name).read_text(), path.name


@pytest.mark.parametrize("name", ["ingest.yaml", "report.yaml"])
def test_every_document_passes_kubernetes_own_schema_strictly(name: str) -> None:
    docs = _docs(GOLDEN / name)
    assert [d["kind"] for d in docs] == ["ServiceAccount", "ConfigMap", "StatefulSet"]
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_the_validator_does_refuse_a_field_kubernetes_does_not_know() -> None:
    stateful = _docs(GOLDEN / "report.yaml")[2]
    stateful["spec"]["template"]["spec"]["terminationGracePeriod"] = 40
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(stateful, KUBERNETES, strict=True)


def test_what_the_stateful_set_promises() -> None:
    spec = load_spec(SPEC)
    account, config_map, stateful = _docs(GOLDEN / "report.yaml")
    pod = stateful["spec"]["template"]["spec"]
    assert stateful["spec"]["replicas"] == 3 and account["metadata"]["name"] == "report"
    assert pod["serviceAccountName"] == "report" and pod["automountServiceAccountToken"] is False
    graces = [job.timings.kill_grace for job in spec.jobs_for("report-0")]
    assert pod["terminationGracePeriodSeconds"] > max(graces)
    (container,) = pod["containers"]
    # the image's entry point runs lockctl (lockctl's own image: tini, then lockctl)
    assert "command" not in container
    assert container["args"][:3] == ["schedule", "--config", "/etc/lockctl/$(POD_NAME).json"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    (projected,) = [v for v in pod["volumes"] if "projected" in v]
    (source,) = projected["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == "consul"  # the auth method's
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert f"{mounts['consul-login']}/{source['serviceAccountToken']['path']}" == BEARER_FILE
    assert sorted(config_map["data"]) == ["report-0.json", "report-1.json", "report-2.json"]


@pytest.mark.parametrize("worker", ["report-0", "report-1", "report-2"])
def test_each_pod_s_config_is_its_worker_s_with_a_login_instead_of_a_token_file(
    worker: str,
) -> None:
    spec = load_spec(SPEC)
    config = json.loads(_docs(GOLDEN / "report.yaml")[1]["data"][f"{worker}.json"])
    expected = config_record(spec, worker, Path("unused"), _tls(worker))
    login = {"auth_method": "k8s", "bearer_token_file": BEARER_FILE}
    expected["consul"] = {
        **{k: v for k, v in expected["consul"].items() if k != "token_file"},
        "login": login,
    }
    assert config == expected and config["agentless"] is True


def test_by_default_the_image_is_the_one_make_image_builds(tmp_path: Path) -> None:
    code, output, out = _render(tmp_path, "--all")
    assert code == 0, output
    (container,) = _docs(out / "report.yaml")[2]["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"localhost/lockctl:{__version__}"
    assert "command" not in container and container["args"][0] == "schedule"


def test_a_given_lockctl_program_replaces_the_entry_point(tmp_path: Path) -> None:
    code, output, out = _render(tmp_path, "--all", "--lockctl", "/usr/local/bin/lockctl")
    assert code == 0, output
    stateful = _docs(out / "report.yaml")[2]
    (container,) = stateful["spec"]["template"]["spec"]["containers"]
    assert container["command"][:2] == ["/usr/local/bin/lockctl", "schedule"]
    assert "args" not in container
    kubernetes_validate.validate(stateful, KUBERNETES, strict=True)


def _tls(worker: str) -> Any:
    from provision.workers.config import WorkerTLS

    return WorkerTLS.in_folder(Path("/etc/consul/tls"), worker)


def test_the_order_of_the_spec_does_not_change_the_manifests(tmp_path: Path) -> None:
    text = SPEC.read_text()
    blocks = text.split('\nworker "')
    reordered = blocks[0] + "".join('\nworker "' + b for b in reversed(blocks[1:-1]))
    reordered += '\nworker "' + blocks[-1]
    spec = tmp_path / "locks.hcl"
    keys = str(GOLDEN.parent / "identity" / "issuer.pem")
    spec.write_text(reordered.replace("../identity/issuer.pem", keys))
    names = [w.name for w in parse_spec(reordered, "x").workers]
    assert reordered != text and names == [w.name for w in load_spec(SPEC).workers]
    code, output, out = _render(tmp_path, "--all", *FLAGS, *TLS, spec=spec)
    assert code == 0, output
    assert (out / "report.yaml").read_text() == (GOLDEN / "report.yaml").read_text()


@pytest.mark.parametrize(
    ("change", "extra", "message"),
    [
        (None, ["--worker", "vm-1"], "worker vm-1: not agentless"),
        (None, ["--worker", "report-1"], "workers report-*: no report-0"),
        (
            ("report-2", "report-x"),
            ["--all"],
            "worker report-x: a pod's name must be <statefulset>-",
        ),
        (
            ('workers  = ["report-0", "report-1", "report-2"]', 'workers = ["report-0"]'),
            ["--all"],
            "report-1 runs other jobs than report-0",
        ),
        (('bound_audiences              = ["consul"]\n', ""), ["--all"], "has no bound_audiences"),
        (None, ["--all", "--image", "a b"], "--image 'a b': not an image reference"),
        (None, ["--all", "--namespace", "Prod"], "--namespace 'Prod': a Kubernetes namespace"),
        (None, ["--all", "--lockctl", "../lockctl"], "--lockctl '../lockctl': an absolute path"),
    ],
)
def test_refusals_are_one_line_exit_2_and_write_nothing(
    tmp_path: Path, change: tuple[str, str] | None, extra: list[str], message: str
) -> None:
    text = SPEC.read_text().replace("../identity/", str(GOLDEN.parent / "identity") + "/")
    if change is not None:
        assert change[0] in text
        text = text.replace(change[0], change[1])
    spec = tmp_path / "locks.hcl"
    spec.write_text(text)
    code, output, out = _render(tmp_path, *extra, spec=spec)
    assert code == 2 and message in output, output
    assert not out.exists() or not any(out.iterdir())


def test_a_worker_without_an_identity_has_no_token_to_log_in_with(tmp_path: Path) -> None:
    text = SPEC.read_text().replace("../identity/", str(GOLDEN.parent / "identity") + "/")
    start = text.index("  identity {", text.index('worker "ingest-0"'))
    end = text.index("\n  }\n", start) + len("\n  }\n")
    spec = tmp_path / "locks.hcl"
    spec.write_text(text[:start] + text[end:])
    code, output, _ = _render(tmp_path, "--worker", "ingest-0", spec=spec)
    assert code == 2 and "worker ingest-0: no identity block" in output, output
