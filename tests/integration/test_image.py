"""The OCI image (image/build, docs/image.md) on the real cluster: built once for the module, it
runs `lockctl schedule` in two containers, two replicas on two workers (host network, root file
system read-only, each worker's config, token and certificates mounted read-only, as UID 10001),
and every tick of their `@every 2s` job that the ledger records ran once, on the replica that
claimed it, never twice; the image itself runs as no root, has no compiler, apt lists, pip or pip
cache, and none of the secrets the test minted (nor the cluster's keys and tokens) is in any of
its layers, its config or its history."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from workers_lab import minted_workers, spec_text

from provision.ledger.records import TickOutcome, TickRecord, tick_name
from provision.ledger.store import Ledger
from tests.lockctl_process import run_lockctl, wait_until

if TYPE_CHECKING:
    from conftest import LiveCluster


REPO = Path(__file__).resolve().parents[2]
PODMAN = [str(REPO / "image" / "podman")]
WORKERS = ("worker-1", "worker-2")
EVERY = 2
TICKS = 5  # succeeded ticks the ledger must show before the replicas are stopped
BUILD_TIMEOUT = 1800.0  # a cold build on a loaded 2-core machine: mmdebstrap, pip wheel
WAIT = 180.0  # for TICKS ticks of 2 s: generous, the containers start in a few seconds
MOUNT = "/etc/lockctl"  # where a worker's files are in its container
# what a compiler, apt, its state or pip would leave in a layer (paths as a layer's tar names them)
FORBIDDEN_PREFIXES = ("usr/bin/gcc", "usr/bin/cc", "usr/bin/c++", "usr/bin/x86_64-linux-gnu-gcc")
FORBIDDEN_PREFIXES += ("usr/bin/apt",)
FORBIDDEN_PARTS = (".cache/pip", "var/cache/apt/archives/", "opt/lockctl/bin/pip", "/wheelhouse")


@dataclass(frozen=True)
class Image:
    ref: str
    uid: int


@dataclass(frozen=True)
class Lab:
    tmp: Path
    cluster: LiveCluster
    uid: str
    lock_key: str
    mounts: dict[str, Path]  # worker -> the folder its container mounts at MOUNT
    secrets: list[str] = field(repr=False)  # the workers' tokens: never printed


def podman(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PODMAN, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def image() -> Image:
    """`image/build` (cached: a second build of an unchanged checkout takes seconds)."""
    version = run_lockctl("--version").stdout.split()[-1]
    built = subprocess.run(
        [str(REPO / "image" / "build")],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    ref = f"localhost/lockctl:{version}"
    user = podman("image", "inspect", "--format", "{{.Config.User}}", ref)
    assert user.returncode == 0, user.stderr
    return Image(ref, int(user.stdout.strip().split(":")[0]))


@pytest.fixture(scope="module")
def lab(
    live_cluster: LiveCluster, image: Image, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("image")
    uid = uuid.uuid4().hex[:8]
    prefix = f"test/image-{uid}/"
    command = ["/bin/sh", "-c", 'echo "tick $LOCKCTL_TICK on $LOCKCTL_WORKER"']
    job = {"prefix": json.dumps(prefix), "schedule": f'"@every {EVERY}s"'}
    jobs = {f"image-{uid}": {**job, "command": json.dumps(command)}}
    spec_path = tmp / "locks.hcl"
    spec_path.write_text(spec_text(live_cluster, WORKERS, jobs))
    with minted_workers(live_cluster, spec_path, WORKERS, tmp, uid, prefix) as made:
        mounts = {w: _mount_folder(made.configs[w], tmp / f"mount-{w}", image.uid) for w in WORKERS}
        yield Lab(tmp, live_cluster, uid, f"{prefix}.lock", mounts, made.secrets)


def _mount_folder(config: Path, folder: Path, owner: int) -> Path:
    """The worker's config, token and TLS files in one folder the container's user owns (0600
    for the secrets), the config's paths rewritten to where the container sees them."""
    folder.mkdir(mode=0o700)
    raw = json.loads(config.read_text())
    consul = raw["consul"]
    names = {"token_file": "worker.token", "ca_file": "ca.pem", "cert_file": "client.pem"}
    names["key_file"] = "client-key.pem"
    for key, name in names.items():
        if key in consul:
            shutil.copyfile(consul[key], folder / name)
            consul[key] = f"{MOUNT}/{name}"
    (folder / "lockctl.json").write_text(json.dumps(raw, indent=2))
    for path in [folder, *folder.iterdir()]:
        os.chown(path, owner, owner)
        if path != folder:
            path.chmod(0o600)
    return folder


@pytest.fixture
def containers() -> Iterator[list[str]]:
    """The names of the containers a test starts: removed (stopped first) at the end, by name."""
    started: list[str] = []
    yield started
    for name in started:
        podman("rm", "--force", "--time", "10", name)


def _start_replica(image: Image, lab: Lab, worker: str, containers: list[str]) -> str:
    name = f"lockctl-test-{lab.uid}-{worker}"
    containers.append(name)  # first: a container made but not started is removed too
    started = podman(
        "run",
        "--detach",
        "--name",
        name,
        "--network=host",
        "--read-only",
        "--cap-drop=all",
        "--security-opt=no-new-privileges",
        "--volume",
        f"{lab.mounts[worker]}:{MOUNT}:ro",
        image.ref,
        "schedule",
        "--config",
        f"{MOUNT}/lockctl.json",
    )
    assert started.returncode == 0, started.stderr
    return name


def _lines(name: str) -> list[str]:
    logs = podman("logs", name)
    return (logs.stdout + logs.stderr).splitlines()


def _events(name: str) -> list[dict[str, Any]]:
    lines = _lines(name)
    assert not any("Traceback" in line for line in lines), "\n".join(lines)
    return [json.loads(line) for line in lines if line.startswith("{")]


def _running(name: str) -> bool:
    return podman("inspect", "--format", "{{.State.Running}}", name).stdout.strip() == "true"


def test_two_containers_run_each_tick_once(image: Image, lab: Lab, containers: list[str]) -> None:
    names = {worker: _start_replica(image, lab, worker, containers) for worker in WORKERS}
    ledger = Ledger(lab.cluster.management(), lab.lock_key)

    def succeeded() -> list[TickRecord]:
        return [r for r in ledger.records() if r.outcome is TickOutcome.SUCCEEDED]

    def done_or_dead() -> bool:
        return len(succeeded()) >= TICKS or not all(_running(n) for n in containers)

    wait_until(done_or_dead, WAIT, pause=0.5)
    for name in containers:
        assert _running(name), (name, _lines(name))
    assert len(succeeded()) >= TICKS, [_lines(n) for n in containers]
    for name in containers:
        stopped = podman("stop", "--time", "30", name, timeout=90)
        assert stopped.returncode == 0, stopped.stderr
        code = podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
        assert code == "0", (name, _lines(name))

    claimed: list[tuple[str, str]] = []  # (tick, worker) of every `acquired` event
    containment: set[str | None] = set()
    for worker, name in names.items():
        events = _events(name)
        assert {e["worker"] for e in events if "worker" in e} == {worker}, events
        acquired = [e for e in events if e["event"] == "acquired"]
        claimed += [(e["tick"], worker) for e in acquired]
        containment |= {e.get("containment") for e in acquired}
        assert [e for e in events if e["event"] == "stopped"], events
        # why the container has no PID namespace for the job: one event, no raw line, no repeats
        told = [e for e in events if e["event"] == "containment"]
        assert len(told) == min(1, len(acquired)), told
        raw = [line for line in _lines(name) if not line.startswith(("{", "tick "))]
        assert raw == [], raw
    ticks = [tick for tick, _ in claimed]
    assert len(ticks) == len(set(ticks)), sorted(claimed)  # never twice
    by_tick = dict(claimed)
    records = ledger.records()
    for record in records:
        if record.outcome is TickOutcome.SUCCEEDED:  # ran once, by the replica that claimed it
            tick = tick_name(record.tick)
            assert by_tick.get(tick) == record.worker, (record, claimed)
            assert f"tick {tick} on {record.worker}" in (record.stdout or ""), record
    recorded = {tick_name(r.tick): r.worker for r in records}
    assert all(recorded.get(tick) == worker for tick, worker in claimed), (recorded, claimed)
    shares = {w: sum(1 for _, by in claimed if by == w) for w in WORKERS}
    print(f"ticks run in the containers: {shares}, job containment {containment}")


def test_the_image_holds_no_secret_and_no_build_tools(image: Image, lab: Lab) -> None:
    """Every layer's files (the tar streams, byte for byte), the image's config and history: no
    token minted for the workers, no management token, no line of a TLS or gossip key; no
    compiler, apt lists or caches, pip, pip cache or wheelhouse; the user is not root."""
    oci = lab.tmp / "oci"
    saved = podman("save", "--format", "oci-dir", "--output", str(oci), image.ref, timeout=600)
    assert saved.returncode == 0, saved.stderr
    secrets = [*lab.secrets, lab.cluster.management_token.reveal(), *_cluster_keys(lab.cluster)]
    secrets += _checkout_secrets()
    assert len(lab.secrets) == len(WORKERS)
    index = json.loads((oci / "index.json").read_text())
    manifest = json.loads(_blob(oci, index["manifests"][0]["digest"]))
    blobs = [_blob(oci, manifest["config"]["digest"])]
    blobs.append(podman("history", "--no-trunc", "--format", "json", image.ref).stdout.encode())
    blobs.append(podman("image", "inspect", image.ref).stdout.encode())
    names: list[str] = []
    for layer in manifest["layers"]:
        data = _blob(oci, layer["digest"])
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        blobs.append(data)
        names += _layer_names(lab.tmp / "layer.tar", data)
    # the search sees the files' contents: the image's own /etc/passwd line is found
    assert any(b"lockctl:x:10001:10001:" in blob for blob in blobs[3:])
    # where, never what: 0 the config, 1 the history, 2 the inspection, 3... the layers
    found = [i for secret in secrets for i, blob in enumerate(blobs) if secret.encode() in blob]
    assert not found, f"a secret of the test is in the image: in blobs {found}"

    bad = [n for n in names if n.startswith(FORBIDDEN_PREFIXES)]
    bad += [n for n in names if any(part in f"/{n}" for part in FORBIDDEN_PARTS)]
    bad += [n for n in names if n.startswith("var/lib/apt/lists/") and "/partial" not in n]
    bad = [n for n in bad if not n.endswith(("/lock", "archives/partial"))]
    assert not bad, bad
    assert "etc/apt/sources.list" not in names  # the build host's mirror
    config = json.loads(blobs[0])["config"]
    assert config["User"] == "10001:10001" and image.uid != 0
    whoami = podman("run", "--rm", "--network=none", "--entrypoint", "id", image.ref, "-u")
    assert whoami.stdout.strip() == str(image.uid), whoami.stderr


def _blob(oci: Path, digest: str) -> bytes:
    return (oci / "blobs" / "sha256" / digest.split(":", 1)[1]).read_bytes()


def _layer_names(scratch: Path, data: bytes) -> list[str]:
    scratch.write_bytes(data)
    try:
        with tarfile.open(scratch) as layer:
            members = layer.getmembers()
        assert all(  # the build host's own files are bind-mount targets there, empty
            m.size == 0 for m in members if m.name in ("etc/resolv.conf", "etc/hostname")
        )
        return [m.name.removeprefix("./") for m in members]
    finally:
        scratch.unlink()


def _cluster_keys(cluster: LiveCluster) -> list[str]:
    """Each base64 line of the cluster's TLS private keys and its gossip key."""
    layout = cluster.layout
    paths = [p for p in layout.tls_files() if p.name.endswith("-key.pem")]
    paths += [layout.gossip_key_file] if layout.gossip_key_file.exists() else []
    return [line for p in paths for line in _secret_lines(p)]


def _checkout_secrets() -> list[str]:
    """Tokens and keys a developer's cluster or tour left in the checkout (.lockctl/): a build
    that packed the checkout whole would carry them."""
    state = REPO / ".lockctl"
    if not state.is_dir():
        return []
    paths = [*state.rglob("*.token"), *state.rglob("*-key.pem")]
    return [line for p in paths if p.is_file() for line in _secret_lines(p)]


def _secret_lines(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return [line.strip() for line in lines if len(line.strip()) >= 16 and "-----" not in line]
