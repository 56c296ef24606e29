"""`lockctl worker-config --kubernetes` in every shape its flags give (the image's entry point or
`--lockctl`, with or without `--tls-dir`, a given image and namespace, every set or one), each
document validated strictly against the schemas of one named Kubernetes version, offline
(kubernetes-validate ships them); and the validator shown to refuse broken manifests, so a pass
means something. tests/unit/test_kubernetes.py checks the golden files against the newest schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import all_versions
from typer.testing import CliRunner

from provision import __version__
from provision.cli import app
from provision.workers.kubernetes import FS_GROUP

# Older than the golden files' schema (1.37, test_kubernetes.py): a field that only a later
# Kubernetes knows fails here.
KUBERNETES_VERSION = "1.29.0"
SPEC = Path(__file__).resolve().parents[1] / "golden" / "kubernetes" / "locks.hcl"
KINDS = ["ServiceAccount", "ConfigMap", "StatefulSet"]
TLS_DIR = "/etc/consul/tls"
IMAGE = ["--image", "registry.example/app:1.2.3"]


class Shape(NamedTuple):
    flags: list[str]  # after --spec and --out
    sets: list[str]  # the files written, <set>.yaml
    lockctl: bool  # --lockctl given: the container's command, not the image's entry point
    tls: bool  # --tls-dir given: the Secret <set>-tls mounted


SHAPES = {
    "entry-point": Shape(["--all"], ["ingest", "report"], lockctl=False, tls=False),
    "entry-point-tls-image-namespace": Shape(
        ["--all", "--tls-dir", TLS_DIR, *IMAGE, "--namespace", "prod"],
        ["ingest", "report"],
        lockctl=False,
        tls=True,
    ),
    "lockctl-path-tls": Shape(
        ["--all", "--lockctl", "/usr/local/bin/lockctl", "--tls-dir", TLS_DIR],
        ["ingest", "report"],
        lockctl=True,
        tls=True,
    ),
    "lockctl-name-one-set": Shape(
        ["--worker", "ingest-0", "--lockctl", "lockctl", "--namespace", "jobs"],
        ["ingest"],
        lockctl=True,
        tls=False,
    ),
}
Manifests = dict[str, list[dict[str, Any]]]  # a set's documents by its name


def _render(tmp_path: Path, flags: list[str]) -> Manifests:
    """The manifests `worker-config --kubernetes` writes with these flags: documents by set."""
    out = tmp_path / "k8s"
    argv = ["worker-config", "--kubernetes", "--spec", str(SPEC), "--out", str(out), *flags]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    return {path.stem: list(yaml.safe_load_all(path.read_text())) for path in out.iterdir()}


def _pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The pod template of a set's StatefulSet (its third document)."""
    return docs[2]["spec"]["template"]["spec"]  # type: ignore[no-any-return]


@pytest.fixture(params=sorted(SHAPES), scope="module")
def shape(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Manifests, Shape]:
    flags = SHAPES[request.param].flags
    return _render(tmp_path_factory.mktemp(request.param), flags), SHAPES[request.param]


def test_the_named_version_s_own_schemas_are_there() -> None:
    # kubernetes-validate falls back to an older schema for a version it lacks: not here
    assert KUBERNETES_VERSION in all_versions()


def test_every_document_of_every_shape_passes_the_schema_strictly(
    shape: tuple[Manifests, Shape],
) -> None:
    manifests, asked = shape
    assert sorted(manifests) == asked.sets
    for docs in manifests.values():
        assert [doc["kind"] for doc in docs] == KINDS
        for doc in docs:
            used = kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
            assert KUBERNETES_VERSION.startswith(f"{used}."), f"{doc['kind']}: against {used}"


def test_each_shape_is_the_one_its_flags_ask_for(shape: tuple[Manifests, Shape]) -> None:
    manifests, asked = shape
    for docs in manifests.values():
        pod = _pod(docs)
        (container,) = pod["containers"]
        assert ("command" in container) is asked.lockctl
        assert ("args" in container) is not asked.lockctl
        volumes = {volume["name"] for volume in pod["volumes"]}
        assert ("consul-tls" in volumes) is asked.tls and "consul-login" in volumes


def test_the_image_s_user_can_read_the_mounted_secret_and_token(
    shape: tuple[Manifests, Shape],
) -> None:
    # Secret and projected-token files belong to root (the Secret's are 0400); the pod's
    # fsGroup is what lets a container that does not run as root (the image's: 10001) read them.
    manifests, _ = shape
    for docs in manifests.values():
        assert _pod(docs)["securityContext"] == {"fsGroup": FS_GROUP}


def test_without_image_the_pods_run_the_one_make_image_builds(tmp_path: Path) -> None:
    docs = _render(tmp_path, ["--all"])["report"]
    (container,) = _pod(docs)["containers"]
    assert container["image"] == f"localhost/lockctl:{__version__}"
    assert {doc["metadata"]["namespace"] for doc in docs} == {"default"}


def _unknown_pod_field(stateful: dict[str, Any]) -> None:
    stateful["spec"]["template"]["spec"]["terminationGracePeriod"] = 40  # ...Seconds


def _misspelt_token_field(stateful: dict[str, Any]) -> None:
    volumes = stateful["spec"]["template"]["spec"]["volumes"]
    (login,) = [v for v in volumes if v["name"] == "consul-login"]
    token = login["projected"]["sources"][0]["serviceAccountToken"]
    token["audiences"] = [token.pop("audience")]


def _replicas_as_text(stateful: dict[str, Any]) -> None:
    stateful["spec"]["replicas"] = str(stateful["spec"]["replicas"])


def _container_without_name(stateful: dict[str, Any]) -> None:
    del stateful["spec"]["template"]["spec"]["containers"][0]["name"]


def _no_selector(stateful: dict[str, Any]) -> None:
    del stateful["spec"]["selector"]


@pytest.mark.parametrize(
    ("breakage", "only_strict"),
    [
        (_unknown_pod_field, True),
        (_misspelt_token_field, True),
        (_replicas_as_text, False),
        (_container_without_name, False),
        (_no_selector, False),
    ],
)
def test_a_broken_stateful_set_is_refused(tmp_path: Path, breakage: Any, only_strict: bool) -> None:
    stateful = _render(tmp_path, ["--all", "--tls-dir", TLS_DIR])["report"][2]
    kubernetes_validate.validate(stateful, KUBERNETES_VERSION, strict=True)  # whole, it passes
    breakage(stateful)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(stateful, KUBERNETES_VERSION, strict=True)
    if only_strict:  # an unknown field passes the lax schema: strict is what catches a typo
        kubernetes_validate.validate(stateful, KUBERNETES_VERSION, strict=False)


def test_a_kind_under_an_api_version_kubernetes_does_not_serve_is_refused(
    tmp_path: Path,
) -> None:
    stateful = _render(tmp_path, ["--all"])["report"][2]
    stateful["apiVersion"] = "apps/v1beta1"  # StatefulSet's, removed in Kubernetes 1.16
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(stateful, KUBERNETES_VERSION, strict=True)
