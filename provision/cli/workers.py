"""`lockctl worker-config`: each worker's runner config, env file and systemd units."""

from __future__ import annotations

from dataclasses import replace
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


def worker_config(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", help="Folder: one sub-folder per worker.")],
    worker: Annotated[
        list[str] | None, typer.Option("--worker", "-w", help="A worker (repeatable).")
    ] = None,
    all_workers: Annotated[bool, typer.Option("--all", help="Every worker in the spec.")] = False,
    spec_file: options.SpecFile = options.DEFAULT_SPEC,
    secrets_dir: options.SecretsDir = options.DEFAULT_SECRETS_DIR,
    token_dir: OldTokenDir = None,
    config_dir: Annotated[
        Path | None,
        typer.Option(
            "--config-dir",
            help="Where lockctl.json lives on the worker \\[default: the output folder itself].",
        ),
    ] = None,
    lockctl_bin: Annotated[
        str, typer.Option("--lockctl", help="The lockctl program the systemd units run.")
    ] = "/usr/local/bin/lockctl",
    tls_dir: Annotated[
        Path | None,
        typer.Option(
            "--tls-dir",
            envvar="LOCKCTL_TLS_DIR",
            help="Folder of the TLS files ON THE WORKER: ca.pem, <worker>.pem, <worker>-key.pem "
            "(for agents that speak https://).",
        ),
    ] = None,
    bearer_token_file: Annotated[
        Path | None,
        typer.Option(
            "--bearer-token-file",
            help="Where a worker with an identity in the spec finds its JWT ON THE WORKER (it "
            "logs in with it, no token file) \\[default: /var/run/secrets/tokens/consul].",
            show_default=False,
        ),
    ] = None,
    templates_dir: options.TemplatesDir = None,
    kubernetes: Annotated[
        bool,
        typer.Option(
            "--kubernetes",
            help="Instead: per set of agentless workers <set>-0..N-1, <set>.yaml with a "
            "StatefulSet of `lockctl schedule`, its ServiceAccount and ConfigMap.",
        ),
    ] = False,
    image: Annotated[
        str,
        typer.Option(
            "--image",
            help="With --kubernetes: the image that has lockctl \\[default: the one `make image` "
            "builds, localhost/lockctl:VERSION].",
            show_default=False,
        ),
    ] = DEFAULT_IMAGE,
    namespace: Annotated[
        str, typer.Option("--namespace", help="With --kubernetes: the pods' namespace.")
    ] = "default",
) -> None:
    """Write each worker's runner config, env file and systemd units (no secrets).

    --secrets-dir, --config-dir and --tls-dir say where the token file, lockctl.json and the
    TLS files will be ON THE WORKER; the files are written under --out.
    """
    from provision.spec import load_spec
    from provision.system.files import require_writable_folders
    from provision.system.templates import find_templates_dir
    from provision.workers.files import Placement, write_worker_files

    on_worker = _secrets_dir_on_worker(ctx, secrets_dir, token_dir)
    spec = load_spec(spec_file)
    if all_workers == bool(worker):
        raise InputError("give --worker NAME (repeatable) or --all, not both or neither")
    if kubernetes:
        chosen = list(worker or [])
        # The image's own entry point runs lockctl, unless --lockctl names the program to run
        typed = ctx.get_parameter_source("lockctl_bin")
        program = lockctl_bin if typed is not None and typed.name == "COMMANDLINE" else None
        _kubernetes(spec, chosen, out, (image, namespace, program), tls_dir, templates_dir)
        return
    names = [w.name for w in spec.workers] if all_workers else list(worker or [])
    placement = Placement(
        config_dir, on_worker.absolute(), lockctl_bin, tls_dir.absolute() if tls_dir else None
    )
    if bearer_token_file is not None:  # checked as an absolute path with the other flags
        placement = replace(placement, bearer_token_file=bearer_token_file)
    # Every folder a worker's files go into, checked before the first file is written.
    folders = [out, *(out / name for name in names), *(out / name / "systemd" for name in names)]
    require_writable_folders("--out", folders)
    for result in write_worker_files(
        spec, names, out, find_templates_dir(templates_dir), placement
    ):
        typer.echo(f"{result.worker}: {len(result.files)} files in {out / result.worker}")
        if result.jobs_without_unit:
            jobs = ", ".join(result.jobs_without_unit)
            typer.echo(f"  no systemd unit for {jobs} (needs both schedule and command)")


def _secrets_dir_on_worker(ctx: typer.Context, secrets_dir: Path, token_dir: Path | None) -> Path:
    """--secrets-dir, or its old name --token-dir, which wins over LOCKCTL_SECRETS_DIR as it did
    before the rename; both on one command line is a mistake unless they agree."""
    if token_dir is None:
        return secrets_dir
    source = ctx.get_parameter_source("secrets_dir")  # click's ParameterSource
    typed = source is not None and source.name == "COMMANDLINE"
    if typed and secrets_dir != token_dir:
        raise InputError(f"--secrets-dir {secrets_dir} and --token-dir {token_dir}: give one")
    typer.echo("lockctl: warning: --token-dir is deprecated: use --secrets-dir", err=True)
    return token_dir


def _kubernetes(
    spec: Spec,
    chosen: list[str],
    out: Path,
    pod: tuple[str, str, str | None],  # --image, --namespace, --lockctl (None: the entry point)
    tls_dir: Path | None,
    templates_dir: Path | None,
) -> None:
    """--kubernetes: the manifests of the chosen workers' sets (--all: every agentless one)."""
    from provision.system.files import require_writable_folders
    from provision.system.templates import find_templates_dir
    from provision.workers.kubernetes import write_kubernetes

    names = chosen or [w.name for w in spec.workers if w.agentless]
    known = {w.name for w in spec.workers}
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        what = f"--worker {unknown[0]}: not a worker" if unknown else "no agentless worker"
        raise InputError(f"{what} in {spec.path}")
    require_writable_folders("--out", [out])
    tls = tls_dir.absolute() if tls_dir else None
    image, namespace, lockctl = pod
    for path in write_kubernetes(
        spec,
        names,
        out,
        find_templates_dir(templates_dir),
        image=image,
        namespace=namespace,
        tls_dir=tls,
        lockctl=lockctl,
    ):
        typer.echo(f"wrote {path}")
