"""`lockctl verify`: named checks against a live cluster, as a table, JSON or JUnit XML."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from provision.cli import options
from provision.cli.output import cell, console
from provision.errors import EXIT_FAILED, InputError

if TYPE_CHECKING:
    from provision.system.secrets import Secret
    from provision.verify import VerifyReport

SUMMARY_LIMIT = 400  # characters of one check's summary or warning in the table
EVIDENCE_LIMIT = 1000  # characters of one evidence line


Inventory = Annotated[
    Path | None,
    typer.Option("--inventory", help='JSON {"worker": "http://addr:8500"} over the spec.'),
]
Only = Annotated[list[str] | None, typer.Option("--only", help="Run only this check (repeatable).")]
Slow = Annotated[bool, typer.Option("--slow", help="Also run ttl-expiry (~30 s).")]
AsJson = Annotated[bool, typer.Option("--json", help="Print the report as JSON.")]
Evidence = Annotated[
    bool, typer.Option("--evidence", help="Show every check's evidence, not only failures'.")
]
Junit = Annotated[Path | None, typer.Option("--junit", help="Also write JUnit XML.")]
BearerTokenFiles = Annotated[
    list[str] | None,
    typer.Option(
        "--bearer-token-file",
        metavar="WORKER=FILE",
        help="A JWT the worker's identity carries, for the login checks (repeatable); a "
        "name that is no worker: a stranger's JWT, which must be refused.",
    ),
]
OperatorTokenFile = Annotated[
    Path | None,
    typer.Option(
        "--operator-token-file",
        help="The operators' token (pause, trigger, break), for operator-token-break.",
    ),
]


@dataclass(frozen=True)
class VerifyFlags:
    """verify's own flags (their order is --help's): the spec and the workers' token files and
    addresses, which checks, how to report them, and the JWTs for the login checks."""

    spec_file: options.SpecFile = options.DEFAULT_SPEC
    secrets_dir: options.SecretsDir = options.DEFAULT_SECRETS_DIR
    templates_dir: options.TemplatesDir = None
    inventory: Inventory = None
    only: Only = None
    slow: Slow = False
    as_json: AsJson = False
    evidence: Evidence = False
    junit: Junit = None
    bearer_token_files: BearerTokenFiles = None
    operator_token_file: OperatorTokenFile = None


@options.flags_command(VerifyFlags)
@options.consul_command
def verify(connection: options.Connection, flags: VerifyFlags) -> None:
    """Prove the locks and ACLs on a live cluster; exit 1 if any check fails.

    The management token (CONSUL_HTTP_TOKEN_FILE or --token-file) is used only for the checks
    that read agents and policies; the lock checks use each worker's own token and agent.
    """
    from provision.spec import load_spec
    from provision.system.secrets import read_secret_file
    from provision.system.templates import find_templates_dir
    from provision.verify import run_verification, select_checks
    from provision.verify.context import VerifyContext, load_workers
    from provision.verify.report import junit_xml

    spec = load_spec(flags.spec_file)
    checks = select_checks(flags.only or [], flags.slow)
    settings = connection.settings()
    templates = find_templates_dir(flags.templates_dir)  # a wrong folder: bad input, not a FAIL
    workers = load_workers(spec, flags.secrets_dir, flags.inventory)
    context = VerifyContext(spec, settings, workers, templates_dir=templates)
    context.bearer_tokens = _bearer_tokens(flags.bearer_token_files or [])
    if flags.operator_token_file is not None:
        context.operator_token = read_secret_file(flags.operator_token_file)
    report = run_verification(context, checks)
    if flags.junit is not None:
        flags.junit.write_text(junit_xml(report), encoding="utf-8")
    if flags.as_json:
        typer.echo(json.dumps(report.to_record(), indent=2))
    else:
        _print(report, flags.evidence)
    if not report.passed:
        raise typer.Exit(EXIT_FAILED)


def _bearer_tokens(given: list[str]) -> dict[str, Secret]:
    """--bearer-token-file WORKER=FILE, each file read now (bad input names the flag)."""
    from provision.consul.login import read_bearer_token

    found: dict[str, Secret] = {}
    for item in given:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise InputError(f"--bearer-token-file {item!r}: expected WORKER=FILE")
        try:
            found[name] = read_bearer_token(Path(path))
        except InputError as exc:
            raise InputError(f"--bearer-token-file {name}: {exc}") from None
    return found


def _print(report: VerifyReport, evidence: bool) -> None:
    """A table of verdicts; below it the evidence of failed checks (of all with --evidence).

    Summaries and evidence quote Consul (versions, error bodies, live policies): each is shown
    through `cell`, escaped, bounded and never read as markup.
    """
    from rich.table import Table

    marks = {"pass": "[green]PASS[/]", "fail": "[red]FAIL[/]", "skip": "[yellow]SKIP[/]"}
    table = Table("check", "result", "time", "what was seen")
    for result in report.results:
        summary = cell(result.summary, SUMMARY_LIMIT)
        for warning in result.warnings:
            summary.append("\n")  # ours; the warning's own text is escaped like the rest
            summary.append_text(cell(f"warning: {warning}", SUMMARY_LIMIT))
        table.add_row(result.name, marks[result.status], f"{result.seconds:.2f}s", summary)
    out = console()
    out.print(table)
    for result in report.results:
        if result.evidence and (evidence or result.status == "fail"):
            out.print(f"\n[bold]{result.name}[/] evidence:", highlight=False)
            for line in result.evidence:
                out.print(cell(f"  {line}", EVIDENCE_LIMIT), highlight=False)
    failed = [r.name for r in report.results if r.status == "fail"]
    verdict = "all checks passed" if not failed else f"FAILED: {', '.join(failed)}"
    out.print(f"{verdict}  (wall time {report.seconds:.1f} s)", highlight=False)
