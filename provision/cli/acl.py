"""`lockctl bootstrap`, `plan`, `apply` and `rotate`: ACL policies and worker tokens in Consul.

`plan` exits 0 when nothing would change and 2 when changes are pending (terraform's
-detailed-exitcode). 2 is also the input-error code: an input error prints `lockctl: error:` on
stderr and nothing on stdout, a pending plan prints the plan on stdout (with --json, a document
with "changes_pending": true). Scripts that must not guess use --no-detailed-exitcode: then a
computed plan always exits 0 and 2 means only bad input.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Concatenate, ParamSpec, TypeVar

import typer

from provision.acl.concurrency import DEFAULT_CONCURRENCY, MAX_CONCURRENCY
from provision.cli import options
from provision.errors import InputError
from provision.system.text import printable

if TYPE_CHECKING:  # the core is imported lazily: `lockctl run` must start fast
    from provision.acl.apply import ApplyTarget
    from provision.acl.plan import Desired, Plan
    from provision.consul import Consul
    from provision.runner.stop import StopRequest

EXIT_CHANGES_PENDING = 2
DEFAULT_LOCK_WAIT = 60.0  # the same as acl.serialize's, not imported: the CLI starts lean
MAX_LOCK_WAIT = 3600.0
P = ParamSpec("P")
R = TypeVar("R")
Prune = Annotated[
    bool,
    typer.Option(
        "--prune",
        help="Delete the spec owner's lockctl-managed objects that are no longer in the spec.",
    ),
]
Concurrency = Annotated[
    int,
    typer.Option("--concurrency", "-c", help=f"Calls in flight (1..{MAX_CONCURRENCY})."),
]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
LockWait = Annotated[
    float,
    typer.Option(
        "--lock-wait",
        help="Seconds to wait for another apply or rotate to finish (lockctl's own lock).",
    ),
]
ShowSecret = Annotated[
    bool, typer.Option("--show-secret", help="Also print the secret on stdout (avoid this).")
]


@options.consul_command
def bootstrap(
    connection: options.Connection,
    management_token_file: Annotated[
        Path,
        typer.Option("--management-token-file", help="Write the management token here (0600)."),
    ],
    agent: Annotated[
        list[str] | None,
        typer.Option("--agent", help="NODE=ADDRESS: give this agent a token (repeatable)."),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace an existing token file.")
    ] = False,
    show_secret: ShowSecret = False,
    templates_dir: options.TemplatesDir = None,
    as_json: AsJson = False,
) -> None:
    """Bootstrap Consul's ACLs once; on a bootstrapped cluster, change nothing.

    On a cluster already bootstrapped it says so and exits 0.
    """
    from provision.acl.bootstrap import bootstrap_cluster, parse_agent_target
    from provision.system.templates import find_templates_dir

    targets = [parse_agent_target(text) for text in agent or ()]
    consul = connection.connect()
    templates = find_templates_dir(templates_dir) if targets else None
    result = bootstrap_cluster(
        consul,
        management_token_file,
        agents=targets,
        templates_dir=templates,
        overwrite=overwrite,
    )
    revealed = result.secret.reveal() if show_secret and result.secret is not None else None
    if as_json:
        record = result.to_record()
        if revealed is not None:
            record["secret_id"] = revealed
        typer.echo(json.dumps(record, indent=2))
        return
    if result.bootstrapped:
        typer.echo(f"ACLs bootstrapped: management token {result.accessor_id}")
        typer.echo(f"secret written to {result.token_file} (mode 0600, not printed)")
    else:
        typer.echo("ACLs were already bootstrapped: nothing changed")
    for one in result.agents:
        state = "created" if one.created else "already there, set again"
        typer.echo(f"agent token for {one.node}: {state} ({one.accessor_id})")
    if revealed is not None:
        typer.echo(f"secret: {revealed}")


@dataclass(frozen=True)
class PlanFlags:
    """The flags plan and apply share: what to plan from, where the token files are, --prune."""

    spec: options.SpecFile = options.DEFAULT_SPEC
    templates_dir: options.TemplatesDir = None
    secrets_dir: options.SecretsDir = options.DEFAULT_SECRETS_DIR
    prune: Prune = False

    def plan(
        self, connection: options.Connection, workers: int, *, for_apply: bool = False
    ) -> tuple[Consul, ApplyTarget, Plan]:
        """Every input checked first (for apply, the secrets folder too), then Consul read."""
        from provision.acl.apply import ApplyTarget, check_secrets_dir

        target = ApplyTarget(_desired(self.spec, self.templates_dir), self.secrets_dir, self.prune)
        if for_apply:
            check_secrets_dir(self.secrets_dir)
        consul = connection.connect().with_pool(workers)
        return consul, target, target.plan(consul, workers)


def plan_command(
    command: Callable[Concatenate[options.Connection, PlanFlags, P], R],
) -> Callable[P, R]:
    """A Consul command that also takes the PlanFlags (first in --help, as they always were)."""
    return options.with_flags(PlanFlags, options.consul_command(command), first=True)


@plan_command
def plan(
    connection: options.Connection,
    flags: PlanFlags,
    detailed_exitcode: Annotated[
        bool,
        typer.Option(
            "--detailed-exitcode/--no-detailed-exitcode",
            help="Exit 2 when changes are pending (default); with --no-..., 0 whenever a plan "
            "was computed, so 2 means only bad input.",
        ),
    ] = True,
    concurrency: Concurrency = DEFAULT_CONCURRENCY,
    as_json: AsJson = False,
) -> None:
    """Show what apply would create, update or delete; exit 2: changes pending.

    Exit 0: nothing to do; 2: changes pending (--no-detailed-exitcode: 0 then too).
    """
    _, _, computed = flags.plan(connection, _concurrency(concurrency))
    if as_json:
        typer.echo(json.dumps(computed.to_record(), indent=2))
    else:
        _print_plan(computed)
    if computed.has_changes and detailed_exitcode:
        raise typer.Exit(EXIT_CHANGES_PENDING)


@plan_command
def apply(
    connection: options.Connection,
    flags: PlanFlags,
    concurrency: Concurrency = DEFAULT_CONCURRENCY,
    lock_wait: LockWait = DEFAULT_LOCK_WAIT,
    as_json: AsJson = False,
) -> None:
    """Create or update the spec's policies and worker tokens (secrets to files).

    Each worker's token secret goes only to its 0600 file in --secrets-dir, never to the output.
    """
    from provision.cli.signals import stop_signals

    # First of all: a stop signal from here on is a request that apply heeds at its safe
    # points (the lock always released), never a death by signal with lockctl's lock held.
    with stop_signals() as stop:
        _apply(connection, flags, concurrency, lock_wait, as_json, stop)


def _apply(
    connection: options.Connection,
    flags: PlanFlags,
    concurrency: int,
    lock_wait: float,
    as_json: bool,
    stop: StopRequest,
) -> None:
    from provision.acl.apply import apply_spec

    workers = _concurrency(concurrency)
    consul, target, planned = flags.plan(connection, workers, for_apply=True)
    with _progress(enabled=not as_json and planned.has_changes) as tick:
        result = apply_spec(
            consul,
            target,
            planned,
            concurrency=workers,
            progress=tick,
            lock_wait=_lock_wait(lock_wait),
            stop=stop,
        )
    computed = result.plan  # planned again under the lock when there was anything to do
    requests_sent = consul.requests_sent
    if as_json:
        record = computed.to_record()
        record.update(
            applied=result.applied,
            secrets_written=[str(p) for p in result.secrets_written],
            seconds=round(result.seconds, 3),
            requests=requests_sent,
        )
        typer.echo(json.dumps(record, indent=2))
        return
    if not computed.has_changes:
        typer.echo(f"No changes: Consul matches {flags.spec} ({requests_sent} requests).")
        _print_not_pruned(computed)
        return
    _print_changes(computed, done=True)
    for path in result.secrets_written:
        typer.echo(f"wrote {path} (mode 0600)")
    typer.echo(
        f"Applied {result.applied} changes in {result.seconds:.2f} s "
        f"({requests_sent} requests, concurrency {workers})."
    )
    _print_not_pruned(computed)


@options.consul_command
def rotate(
    connection: options.Connection,
    worker: Annotated[
        list[str], typer.Option("--worker", "-w", help="Worker whose token to rotate (repeatable).")
    ],
    spec: options.SpecFile = options.DEFAULT_SPEC,
    secrets_dir: options.SecretsDir = options.DEFAULT_SECRETS_DIR,
    lock_wait: LockWait = DEFAULT_LOCK_WAIT,
    as_json: AsJson = False,
) -> None:
    """Mint a worker's new token, write and read it back, then revoke the old one."""
    from provision.cli.signals import stop_signals

    with stop_signals() as stop:  # first of all, as in apply
        _rotate(connection, worker, spec, secrets_dir, lock_wait, as_json, stop)


def _rotate(
    connection: options.Connection,
    worker: list[str],
    spec: Path,
    secrets_dir: Path,
    lock_wait: float,
    as_json: bool,
    stop: StopRequest,
) -> None:
    from provision.acl.apply import check_secrets_dir
    from provision.acl.rotate import rotate_worker_token

    names, owner = _spec_workers(spec, worker)
    wait = _lock_wait(lock_wait)
    check_secrets_dir(secrets_dir)
    consul = connection.connect()
    results = [
        rotate_worker_token(consul, name, secrets_dir, lock_wait=wait, stop=stop, owner=owner)
        for name in names
    ]
    if as_json:
        typer.echo(json.dumps([r.to_record() for r in results], indent=2))
        return
    for r in results:
        revoked = ", ".join(r.revoked) or "none"
        typer.echo(f"{r.worker}: new token {r.accessor_id} in {r.path} (0600); revoked {revoked}")


# --- helpers --------------------------------------------------------------------------------


def _desired(spec: Path, templates_dir: Path | None) -> Desired:
    """Load, validate, render and lint: every input problem is found before Consul is touched."""
    from provision.acl.plan import desired_from_render
    from provision.acl.render import render_policies
    from provision.spec import load_spec
    from provision.system.templates import find_templates_dir

    loaded = load_spec(spec)  # a SpecError lists every problem (the CLI boundary prints them)
    return desired_from_render(render_policies(loaded, find_templates_dir(templates_dir)))


def _spec_workers(spec: Path, names: list[str]) -> tuple[list[str], str]:
    """`names` if each is a worker of the spec, and the spec's owner (whose token to rotate);
    checked before anything is read or written (a name is part of a file path: `../x` would
    write outside the secrets folder)."""
    from provision.spec import load_spec
    from provision.spec.names import NAME_RULE, is_valid_name

    for name in names:
        if not is_valid_name(name):
            raise InputError(f"--worker {name!r}: not a valid worker name ({NAME_RULE})")
    loaded = load_spec(spec)
    declared = {w.name for w in loaded.workers}
    for name in names:
        if name not in declared:
            raise InputError(f"--worker {name}: not a worker of {spec}")
    return names, loaded.owner


def _lock_wait(value: float) -> float:
    if not 0 <= value <= MAX_LOCK_WAIT:
        raise InputError(f"--lock-wait {value:g}: must be 0..{MAX_LOCK_WAIT:g} seconds")
    return value


def _concurrency(value: int) -> int:
    if not 1 <= value <= MAX_CONCURRENCY:
        raise InputError(f"--concurrency {value}: must be 1..{MAX_CONCURRENCY}")
    return value


@contextmanager
def _progress(*, enabled: bool) -> Iterator[Any]:
    """A progress bar on stderr, only on a terminal (never in pipes or with --json)."""
    if not (enabled and sys.stderr.isatty()):
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(
        TextColumn("applying"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    task = bar.add_task("apply", total=None)
    with bar:

        def tick(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield tick


def _print_plan(computed: Plan) -> None:
    if not computed.has_changes:
        identity = f" and {computed.unchanged_identity} identity objects" * bool(
            computed.unchanged_identity
        )
        typer.echo(
            f"No changes: {computed.unchanged_policies} policies and "
            f"{computed.unchanged_tokens} tokens{identity} match the spec."
        )
    else:
        _print_changes(computed, done=False)
        typer.echo(
            f"Plan: {computed.count('create')} to create, {computed.count('update')} to update, "
            f"{computed.count('delete')} to delete, {computed.count('write-secret')} token files "
            f"to write; {_unchanged(computed)} unchanged."
        )
    _print_not_pruned(computed)


def _unchanged(computed: Plan) -> int:
    return computed.unchanged_policies + computed.unchanged_tokens + computed.unchanged_identity


_PAST = {"create": "created", "update": "updated", "delete": "deleted", "write-secret": "wrote"}


def _print_changes(computed: Plan, *, done: bool) -> None:
    for p in computed.policies:
        verb = _PAST[p.action] if done else p.action
        typer.echo(f"policy {printable(p.name)}: {verb} ({printable(p.reason)})")
    for t in computed.tokens:
        verb = _PAST[t.action] if done else t.action
        # Names, descriptions and IDs of live objects come from Consul: shown escaped.
        who = printable(t.worker or t.description)
        listed = ", ".join(printable(name) for name in t.policies)
        extra = f" [{listed}]" if t.action in ("create", "update") else ""
        ident = f" {printable(t.accessor_id)}" if t.accessor_id else ""
        typer.echo(f"token {who}{ident}: {verb} ({printable(t.reason)}){extra}")
    for c in computed.identity:
        verb = _PAST[c.action] if done else c.action
        typer.echo(f"{c.kind} {printable(c.name)}: {verb} ({printable(c.reason)})")


def _print_not_pruned(computed: Plan) -> None:
    if computed.not_pruned:
        typer.echo(
            f"{len(computed.not_pruned)} lockctl-managed objects are no longer in the spec "
            f"(kept; --prune deletes them): {', '.join(map(printable, computed.not_pruned))}",
            err=True,
        )
