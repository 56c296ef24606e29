"""`lockctl render` and `lockctl lint`: ACL policies from the spec, and checks on policy files."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from provision.cli import options
from provision.errors import EXIT_FAILED

if TYPE_CHECKING:  # the core is imported lazily: `lockctl run` must start fast
    from provision.acl.lint import Finding

DEFAULT_OUT = Path("policies")

OutDir = Annotated[Path, typer.Option("--out", help="Folder for the rendered policies.")]
Check = Annotated[
    bool, typer.Option("--check", help="Write nothing; exit 1 and show the diff when stale.")
]
LintFiles = Annotated[list[Path], typer.Argument(help="ACL policy files (HCL rules).")]
LintSpec = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--spec",
        envvar="LOCKCTL_SPEC",
        help=f"Check session rules and lockctl's policies against this spec "
        f"(default: {options.DEFAULT_SPEC} when it exists).",
    ),
]
Nodes = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option("--node", help="A worker node name session rules may name (repeatable)."),
]


def render(
    spec: options.SpecFile = options.DEFAULT_SPEC,
    out: OutDir = DEFAULT_OUT,
    templates_dir: options.TemplatesDir = None,
    check: Check = False,
) -> None:
    """Render one ACL policy per job and per worker, plus manifest.json."""
    from provision.acl.render import check_rendered, render_policies, write_rendered
    from provision.spec import load_spec
    from provision.system.files import require_writable_folders
    from provision.system.templates import find_templates_dir

    result = render_policies(load_spec(spec), find_templates_dir(templates_dir))
    if check:
        diff = check_rendered(result, out)
        if diff:
            typer.echo(diff, nl=False)
            typer.echo(f"lockctl: {out} is stale: run `lockctl render`", err=True)
            raise typer.Exit(EXIT_FAILED)
        typer.echo(f"{out}: up to date ({len(result.policies)} policies)")
        return
    require_writable_folders("--out", [out])  # before any file is written
    report = write_rendered(result, out)
    for name in report.written:
        typer.echo(f"wrote {out / name}")
    for name in report.removed:
        typer.echo(f"removed {out / name}")
    typer.echo(f"{out}: {len(result.policies)} policies, {len(report.unchanged)} files unchanged")


def lint(
    files: LintFiles,
    spec: LintSpec = None,
    node: Nodes = None,
    errors_only: Annotated[
        bool, typer.Option("--errors-only", help="Exit 1 only for errors, not for warnings.")
    ] = False,
) -> None:
    """Check ACL policy files and the spec's identities; exit 1 on findings.

    Policy rules that grant nothing or too much; with --spec, binding rules matching more than
    one worker.
    """
    from provision.acl.identity_lint import lint_identities
    from provision.acl.lint import has_errors, lint_file
    from provision.spec import load_spec

    default = options.DEFAULT_SPEC
    loaded = load_spec(spec) if spec else load_spec(default) if default.is_file() else None
    findings: list[Finding] = lint_identities(loaded) if loaded else []
    for finding in findings:
        typer.echo(finding.describe(loaded.path if loaded else ""))
    for path in files:
        if loaded and path.resolve() == Path(loaded.path).resolve():
            typer.echo(f"{path}: skipped: it is the spec, not a policy", err=True)
            continue
        found = lint_file(path, declared_nodes=node, spec=loaded)
        findings += found
        for finding in found:
            typer.echo(finding.describe(str(path)))
    if loaded:  # the spec's own settings that have no effect, or reach further than meant
        from provision.acl.lint import catchup_findings, overlap_findings, target_findings

        now = datetime.now(timezone.utc)
        found = catchup_findings(loaded, now) + overlap_findings(loaded, now)
        found += target_findings(loaded)
        findings += found
        for finding in found:
            typer.echo(finding.describe(loaded.path))
    typer.echo(_lint_summary(findings, len(files)), err=bool(findings))
    if has_errors(findings) or (findings and not errors_only):
        raise typer.Exit(EXIT_FAILED)


def _lint_summary(findings: list[Finding], files: int) -> str:
    errors = sum(1 for finding in findings if finding.severity == "error")
    warnings = len(findings) - errors
    plural = "" if files == 1 else "s"
    return f"lockctl lint: {files} file{plural}, {errors} errors, {warnings} warnings"
