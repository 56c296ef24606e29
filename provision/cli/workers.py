"""`lockctl worker-config`: each worker's runner config, env file and systemd units."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from provision import __version__
from provision.cli import options
from provision.errors import InputError

DEFAULT_IMAGE = f"localhost/lockctl:{__version__}"  # what `make image` builds and tags

if TYPE_CHECKING:
    from provision.spec import Spec

OldTokenDir = Annotated[
    Path | None,
    typer.Option(
        "--token-dir",
        hidden=True,  # the old name of --secrets-dir; kept so existing units and scripts work
        help="Deprecated: use --secrets-dir.",
        show_default=False,
    ),
]


Out = Annotated[Path, typer.Option("--out", help="Folder: one sub-folder per worker.")]
Workers = Annotated[list[str] | None, typer.Option("--worker", "-w", help="A worker (repeatable).")]
AllWorkers = Annotated[bool, typer.Option("--all", help="Every worker in the spec.")]
ConfigDir = Annotated[
    Path | None,
    typer.Option(
        "--config-dir",
        help="Where lockctl.json lives on the worker \\[default: the output folder itself].",
    ),
]
LockctlProgram = Annotated[
    str, typer.Option("--lockctl", help="The lockctl program the systemd units run.")
]
TlsDir = Annotated[
    Path | None,
    typer.Option(
        "--tls-dir",
        envvar="LOCKCTL_TLS_DIR",
        help="Folder of the TLS files ON THE WORKER: ca.pem, <worker>.pem, <worker>-key.pem "
        "(for agents that speak https://).",
    ),
]
BearerTokenFile = Annotated[
    Path | None,
    typer.Option(
        "--bearer-token-file",
        help="Where a worker with an identity in the spec finds its JWT ON THE WORKER (it "
        "logs in with it, no token file) \\[default: /var/run/secrets/tokens/consul].",
        show_default=False,
    ),
]
Kubernetes = Annotated[
    bool,
    typer.Option(
        "--kubernetes",
        help="Instead: per set of agentless workers <set>-0..N-1, <set>.yaml with a "
        "StatefulSet of `lockctl schedule`, its ServiceAccount and ConfigMap.",
    ),
]
Image = Annotated[
    str,
    typer.Option(
        "--image",
        help="With --kubernetes: the image that has lockctl \\[default: the one `make image` "
        "builds, localhost/lockctl:VERSION].",
        show_default=False,
    ),
]
Namespace = Annotated[
    str, typer.Option("--namespace", help="With --kubernetes: the pods' namespace.")
]


@dataclass(frozen=True)
class WorkerConfigFlags:
    """worker-config's flags (their order is --help's): where the files go, for which workers,
    from which spec; where things are ON THE WORKER; with --kubernetes, what the pods run."""

    out: Out
    worker: Workers = None
    all_workers: AllWorkers = False
    spec_file: options.SpecFile = options.DEFAULT_SPEC
    secrets_dir: options.SecretsDir = options.DEFAULT_SECRETS_DIR
    token_dir: OldTokenDir = None
    config_dir: ConfigDir = None
    lockctl_bin: LockctlProgram = "/usr/local/bin/lockctl"
    tls_dir: TlsDir = None
    bearer_token_file: BearerTokenFile = None
    templates_dir: options.TemplatesDir = None
    kubernetes: Kubernetes = False
    image: Image = DEFAULT_IMAGE
    namespace: Namespace = "default"


@options.flags_command(WorkerConfigFlags)
def worker_config(flags: WorkerConfigFlags, ctx: typer.Context) -> None:
    """Write each worker's runner config, env file and systemd units (no secrets).

    --secrets-dir, --config-dir and --tls-dir say where the token file, lockctl.json and the
    TLS files will be ON THE WORKER; the files are written under --out.
    """
    from provision.spec import load_spec
    from provision.system.files import require_writable_folders
    from provision.system.templates import find_templates_dir
    from provision.workers.files import Placement, write_worker_files

    on_worker = _secrets_dir_on_worker(ctx, flags.secrets_dir, flags.token_dir)
    spec = load_spec(flags.spec_file)
    if flags.all_workers == bool(flags.worker):
        raise InputError("give --worker NAME (repeatable) or --all, not both or neither")
    if flags.kubernetes:
        _kubernetes(spec, flags, _typed(ctx, "lockctl_bin"))
        return
    names = [w.name for w in spec.workers] if flags.all_workers else list(flags.worker or [])
    tls_dir = flags.tls_dir.absolute() if flags.tls_dir else None
    placement = Placement(flags.config_dir, on_worker.absolute(), flags.lockctl_bin, tls_dir)
    if flags.bearer_token_file is not None:  # checked as an absolute path with the other flags
        placement = replace(placement, bearer_token_file=flags.bearer_token_file)
    # Every folder a worker's files go into, checked before the first file is written.
    out = flags.out
    folders = [out, *(out / name for name in names), *(out / name / "systemd" for name in names)]
    require_writable_folders("--out", folders)
    for result in write_worker_files(
        spec, names, out, find_templates_dir(flags.templates_dir), placement
    ):
        typer.echo(f"{result.worker}: {len(result.files)} files in {out / result.worker}")
        if result.jobs_without_unit:
            jobs = ", ".join(result.jobs_without_unit)
            typer.echo(f"  no systemd unit for {jobs} (needs both schedule and command)")


def _typed(ctx: typer.Context, name: str) -> bool:
    """Whether the flag of parameter `name` was given on the command line (not env, default)."""
    source = ctx.get_parameter_source(name)  # click's ParameterSource
    return source is not None and source.name == "COMMANDLINE"


def _secrets_dir_on_worker(ctx: typer.Context, secrets_dir: Path, token_dir: Path | None) -> Path:
    """--secrets-dir, or its old name --token-dir, which wins over LOCKCTL_SECRETS_DIR as it did
    before the rename; both on one command line is a mistake unless they agree."""
    if token_dir is None:
        return secrets_dir
    if _typed(ctx, "secrets_dir") and secrets_dir != token_dir:
        raise InputError(f"--secrets-dir {secrets_dir} and --token-dir {token_dir}: give one")
    typer.echo("lockctl: warning: --token-dir is deprecated: use --secrets-dir", err=True)
    return token_dir


def _kubernetes(spec: Spec, flags: WorkerConfigFlags, lockctl_typed: bool) -> None:
    """--kubernetes: the manifests of the chosen workers' sets (--all: every agentless one).
    The image's own entry point runs lockctl, unless --lockctl names the program to run."""
    from provision.system.files import require_writable_folders
    from provision.system.templates import find_templates_dir
    from provision.workers.kubernetes import Pods, write_kubernetes

    names = list(flags.worker or []) or [w.name for w in spec.workers if w.agentless]
    known = {w.name for w in spec.workers}
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        what = f"--worker {unknown[0]}: not a worker" if unknown else "no agentless worker"
        raise InputError(f"{what} in {spec.path}")
    require_writable_folders("--out", [flags.out])
    pods = Pods(
        image=flags.image,
        namespace=flags.namespace,
        lockctl=flags.lockctl_bin if lockctl_typed else None,
        tls_dir=flags.tls_dir.absolute() if flags.tls_dir else None,
    )
    templates = find_templates_dir(flags.templates_dir)
    for path in write_kubernetes(spec, names, flags.out, templates, pods):
        typer.echo(f"wrote {path}")
