"""`lockctl worker-config --kubernetes`: one StatefulSet per set of agentless workers.

A set is the spec's agentless workers named `<set>-0` .. `<set>-<N-1>` (a StatefulSet's pod
names), all running the same jobs: one worker class. Per set, `<set>.yaml` holds its
ServiceAccount, a ConfigMap with each pod's worker config (by pod name), and the StatefulSet of
N replicas of `lockctl schedule`, each logging in with its projected service-account token
(the audience of its auth method) through `consul.login` (docs/identity.md), with `/healthz`
probes and a termination grace above the longest kill grace. Rendered from templates/kubernetes/,
deterministic (sorted), all sets or nothing.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provision.errors import InputError
from provision.spec import Spec
from provision.system.files import PUBLIC_MODE, write_all_or_none
from provision.system.templates import make_environment, render_template
from provision.workers.config import WorkerTLS, config_record
from provision.workers.files import SCHEDULER_STOP_MARGIN

CONFIG_DIR = "/etc/lockctl"
BEARER_DIR = "/var/run/secrets/lockctl"
BEARER_NAME = "token"
BEARER_FILE = f"{BEARER_DIR}/{BEARER_NAME}"  # consul.login.bearer_token_file in each config
TOKEN_SECONDS = 3600  # the projected token's life; the kubelet renews it at 80 % of that
PORT = 9464  # /metrics and /healthz (lockctl schedule --listen)
# The pod's fsGroup, the image's group (docs/image.md): the kubelet makes the mounted Secret and
# token files, root's, readable by it, so a container that does not run as root can read them.
FS_GROUP = 10001
TEMPLATES = ("serviceaccount.yaml.j2", "configmap.yaml.j2", "statefulset.yaml.j2")
_MEMBER = re.compile(r"^(?P<set>[a-z0-9]([a-z0-9-]*[a-z0-9])?)-(?P<ordinal>0|[1-9][0-9]*)$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_PROGRAM = re.compile(r"^(/[A-Za-z0-9._+-]+)+$|^[A-Za-z0-9._+-]+$")
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}$")


@dataclass(frozen=True)
class WorkerSet:
    """Agentless workers `<name>-0` .. `<name>-<replicas-1>`: one StatefulSet."""

    name: str
    workers: tuple[str, ...]  # in ordinal order

    @property
    def replicas(self) -> int:
        return len(self.workers)


def worker_sets(spec: Spec, names: list[str]) -> list[WorkerSet]:
    """Group the named agentless workers into sets by name; InputError for a worker that
    cannot be a pod of one (not agentless, not `<set>-<ordinal>`, a gap in the ordinals, jobs
    that differ from the set's, no identity to log in with)."""
    members: dict[str, dict[int, str]] = {}
    for name in names:
        worker = spec.worker(name)
        where = f"{spec.path}:{worker.line}: worker {name}"
        if not worker.agentless:
            raise InputError(
                f"{where}: not agentless (a pod has no Consul agent): set agentless = true"
            )
        if worker.identity is None:
            raise InputError(f"{where}: no identity block: a pod logs in with its projected token")
        found = _MEMBER.match(name)
        if found is None or len(found["set"]) > 52:  # the pod name gets -<ordinal> and more
            raise InputError(
                f"{where}: a pod's name must be <statefulset>-<ordinal>, like report-0"
            )
        members.setdefault(found["set"], {})[int(found["ordinal"])] = name
    sets = []
    for set_name in sorted(members):
        by_ordinal = members[set_name]
        missing = [i for i in range(len(by_ordinal)) if i not in by_ordinal]
        if missing:
            raise InputError(
                f"workers {set_name}-*: no {set_name}-{missing[0]}: ordinals go 0..N-1"
            )
        workers = tuple(by_ordinal[i] for i in range(len(by_ordinal)))
        _same_jobs(spec, set_name, workers)
        sets.append(WorkerSet(set_name, workers))
    return sets


def _same_jobs(spec: Spec, set_name: str, workers: tuple[str, ...]) -> None:
    first = [job.name for job in spec.jobs_for(workers[0])]
    for worker in workers[1:]:
        if [job.name for job in spec.jobs_for(worker)] != first:
            raise InputError(
                f"workers {set_name}-*: {worker} runs other jobs than {workers[0]}: the pods of "
                "one StatefulSet are one class of worker"
            )
    if not any(job.schedule and job.command for job in spec.jobs_for(workers[0])):
        raise InputError(f"workers {set_name}-*: no job with a schedule and a command to run")


def pod_config(spec: Spec, worker: str, tls_dir: Path | None) -> dict[str, Any]:
    """The worker config of one pod: `consul.login` (the auth method and the projected token's
    path, the names `lockctl run` and `schedule` read) in place of a token file."""
    tls = WorkerTLS.in_folder(tls_dir, worker) if tls_dir else WorkerTLS()
    assert spec.worker(worker).identity is not None  # worker_sets refused the others
    return config_record(spec, worker, Path(BEARER_FILE), tls, Path(BEARER_FILE))


def render_set(
    spec: Spec,
    worker_set: WorkerSet,
    env: Any,
    *,
    image: str,
    namespace: str,
    tls_dir: Path | None,
    lockctl: str | None = None,
) -> str:
    """The set's ServiceAccount, ConfigMap and StatefulSet, one YAML stream."""
    first = spec.worker(worker_set.workers[0])
    assert first.identity is not None
    method = next(m for m in spec.auth_methods if m.name == first.identity.auth_method)
    if not method.bound_audiences:
        raise InputError(
            f"{spec.path}:{method.line}: auth_method {method.name!r} has no bound_audiences: a "
            "projected token is issued for one audience (give it one)"
        )
    jobs = [job for job in spec.jobs_for(worker_set.workers[0]) if job.schedule and job.command]
    longest = max(jobs, key=lambda job: job.timings.kill_grace)
    selector = {"app.kubernetes.io/name": "lockctl", "app.kubernetes.io/instance": worker_set.name}
    labels = {**selector, "app.kubernetes.io/managed-by": "lockctl"}
    context = {
        "set": worker_set,
        "namespace": namespace,
        "image": image,
        "lockctl": lockctl,
        "labels": _yaml_map(labels),
        "selector": _yaml_map(selector),
        "configs": [(w, pod_config(spec, w, tls_dir)) for w in worker_set.workers],
        "audience": method.bound_audiences[0],
        "config_dir": CONFIG_DIR,
        "bearer_dir": BEARER_DIR,
        "bearer_name": BEARER_NAME,
        "token_seconds": TOKEN_SECONDS,
        "tls_dir": str(tls_dir) if tls_dir else None,
        "port": PORT,
        "fs_group": FS_GROUP,
        "longest_grace_job": longest.name,
        "longest_grace": math.ceil(longest.timings.kill_grace),
        "stop_margin": SCHEDULER_STOP_MARGIN,
        "stop_timeout": math.ceil(longest.timings.kill_grace) + SCHEDULER_STOP_MARGIN,
    }
    parts = [render_template(env, f"kubernetes/{name}", context) for name in TEMPLATES]
    return "---\n".join(parts)


def _yaml_map(values: dict[str, str]) -> str:
    """A flat map as YAML lines, keys and values as JSON strings (valid YAML scalars)."""
    return "\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(values.items()))


def check_flags(image: str, namespace: str, lockctl: str | None) -> None:
    if lockctl is not None and (not _PROGRAM.match(lockctl) or ".." in lockctl.split("/")):
        raise InputError(f"--lockctl {lockctl!r}: an absolute path or a program name in the image")
    if not _IMAGE.match(image):
        raise InputError(f"--image {image!r}: not an image reference (like registry/app:1.2.3)")
    if not _DNS_LABEL.match(namespace):
        raise InputError(
            f"--namespace {namespace!r}: a Kubernetes namespace is 1-63 lowercase letters, "
            "digits and '-', starting and ending with a letter or digit"
        )


@dataclass(frozen=True)
class Pods:
    """What every pod of the sets runs: the image that has lockctl, the namespace, the program
    (None: the image's entry point) and the folder of the TLS files in the pod."""

    image: str
    namespace: str
    lockctl: str | None = None
    tls_dir: Path | None = None


def write_kubernetes(
    spec: Spec, names: list[str], out_dir: Path, templates_dir: Path, pods: Pods
) -> list[Path]:
    """Write `<set>.yaml` for every set the named workers form: all of them, or none."""
    check_flags(pods.image, pods.namespace, pods.lockctl)
    sets = worker_sets(spec, names)
    env = make_environment(templates_dir)
    files = {
        Path(f"{s.name}.yaml"): render_set(
            spec,
            s,
            env,
            image=pods.image,
            namespace=pods.namespace,
            tls_dir=pods.tls_dir,
            lockctl=pods.lockctl,
        )
        for s in sets
    }
    try:
        return write_all_or_none(out_dir, files, mode=PUBLIC_MODE)
    except OSError as exc:
        raise InputError(f"--out {out_dir}: cannot write the manifests: {exc.strerror}") from None
