"""The flags several commands share, each declared once: the Consul connection, the spec, the
folders of token files and of templates, and their defaults.

The seven Consul connection flags are the fields of `Connection`; `@consul_command` gives a
command all seven and hands it one `Connection`. Each defaults to None so `resolve_settings`
applies Consul's own environment variables (CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN_FILE,
CONSUL_CACERT, ...) and then the defaults: the order is flag > environment > default, in one
place. There is no flag for a token secret itself: argv is visible to every user of the machine.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Concatenate, ParamSpec, TypeVar

import typer

from provision.errors import InputError

if TYPE_CHECKING:  # imported when a command runs: `render` and `lint` need no HTTP stack
    from _typeshed import DataclassInstance

    from provision.consul import Consul, ConsulSettings

DEFAULT_SPEC = Path("policies/locks.hcl")
DEFAULT_SECRETS_DIR = Path(".lockctl/secrets")

SpecFile = Annotated[
    Path, typer.Option("--spec", envvar="LOCKCTL_SPEC", help="The lock spec (HCL).")
]
Datacenter = Annotated[
    str | None,
    typer.Option(
        "--datacenter",
        help="Only this datacenter of the job's (default: every datacenter its workers are in).",
        show_default=False,
    ),
]
Key = Annotated[
    str | None,
    typer.Option(
        "--key",
        help="A keyed job's key: its own lock and ledger (lockctl run --key).",
        show_default=False,
    ),
]


def keyed_lock(lock_key: str, key: str | None) -> str:
    """The lock of `key` of the job whose lock is `lock_key` (the job's own without a key); a
    key that breaks the rule is refused at the flag, never escaped (exit 2)."""
    if key is None:
        return lock_key
    from provision.keyed import key_problem, keyed_lock_key
    from provision.system.text import printable

    problem = key_problem(key)
    if problem is not None:
        raise InputError(f"--key '{printable(key, 140)}': {problem}")
    return keyed_lock_key(lock_key, key)


SecretsDir = Annotated[
    Path,
    typer.Option(
        "--secrets-dir",
        envvar="LOCKCTL_SECRETS_DIR",
        help="Folder of the worker token files (<worker>.token, mode 0600).",
    ),
]
TemplatesDir = Annotated[
    Path | None,
    typer.Option(
        "--templates-dir",
        envvar="LOCKCTL_TEMPLATES_DIR",
        help="Your own templates (a copy of lockctl's templates/); default: the packaged ones.",
    ),
]

PANEL = "Consul connection"
# Help text is rich markup: a bare "[default: ...]" would be taken for a style tag and vanish.

Address = Annotated[
    str | None,
    typer.Option(
        "--address",
        help="Consul agent HTTP address \\[default: CONSUL_HTTP_ADDR, else 127.0.0.1:8500].",
        rich_help_panel=PANEL,
        show_default=False,
    ),
]
TokenFile = Annotated[
    Path | None,
    typer.Option(
        "--token-file",
        help="File holding the ACL token to use \\[default: CONSUL_HTTP_TOKEN_FILE, else "
        "CONSUL_HTTP_TOKEN].",
        rich_help_panel=PANEL,
        show_default=False,
    ),
]
Timeout = Annotated[
    float | None,
    typer.Option("--timeout", help="Seconds per HTTP call \\[default: 10].", rich_help_panel=PANEL),
]
CACert = Annotated[
    Path | None,
    typer.Option("--ca-cert", help="CA bundle \\[default: CONSUL_CACERT].", rich_help_panel=PANEL),
]
ClientCert = Annotated[
    Path | None,
    typer.Option(
        "--client-cert",
        help="TLS client cert \\[default: CONSUL_CLIENT_CERT].",
        rich_help_panel=PANEL,
    ),
]
ClientKey = Annotated[
    Path | None,
    typer.Option(
        "--client-key", help="TLS client key \\[default: CONSUL_CLIENT_KEY].", rich_help_panel=PANEL
    ),
]
SkipVerify = Annotated[
    bool | None,
    typer.Option(
        "--tls-skip-verify/--tls-verify",
        help="Skip TLS verification \\[default: CONSUL_HTTP_SSL_VERIFY, else verify].",
        rich_help_panel=PANEL,
        show_default=False,
    ),
]


@dataclass(frozen=True)
class Connection:
    """The Consul connection flags as given (None: not given). Each field is one flag."""

    address: Address = None
    token_file: TokenFile = None
    timeout: Timeout = None
    ca_cert: CACert = None
    client_cert: ClientCert = None
    client_key: ClientKey = None
    tls_skip_verify: SkipVerify = None

    def settings(self) -> ConsulSettings:
        """Settings from these flags, then Consul's environment, then defaults."""
        from provision.consul import GivenSettings, resolve_settings

        given = GivenSettings(
            address=self.address,
            token_file=self.token_file,
            timeout=self.timeout,
            ca_cert=self.ca_cert,
            client_cert=self.client_cert,
            client_key=self.client_key,
            verify_tls=None if self.tls_skip_verify is None else not self.tls_skip_verify,
        )
        return resolve_settings(given)

    def connect(self) -> Consul:
        return connect(self.settings())


def connect(settings: ConsulSettings) -> Consul:
    """A client for `settings` (a seam tests can patch)."""
    from provision.consul import Consul

    return Consul(settings)


P = ParamSpec("P")
R = TypeVar("R")
G = TypeVar("G", bound="DataclassInstance")


def consul_command(command: Callable[Concatenate[Connection, P], R]) -> Callable[P, R]:
    """Give `command` every Consul connection flag; it receives them as its first argument
    (the flags come after the command's own in --help)."""
    return with_flags(Connection, command)


def flags_command(
    group: type[G],
) -> Callable[[Callable[Concatenate[G, P], R]], Callable[P, R]]:
    """A decorator: the command's own flags are the fields of the dataclass `group` (each
    annotated with its typer.Option), first in --help; it receives them as one `group`."""

    def decorate(command: Callable[Concatenate[G, P], R]) -> Callable[P, R]:
        return with_flags(group, command, first=True)

    return decorate


def with_flags(
    group: type[G], command: Callable[Concatenate[G, P], R], *, first: bool = False
) -> Callable[P, R]:
    """Give `command` a flag per field of the dataclass `group`; it receives one `group` as its
    first argument. The flags come after the command's own, or before them with `first`.

    Typer reads a command's flags from its signature, so the wrapper's signature is the
    command's own parameters (the first one left out) and the group's fields, keyword-only.
    """
    hints = typing.get_type_hints(group, include_extras=True)
    flags = [
        inspect.Parameter(
            f.name,
            inspect.Parameter.KEYWORD_ONLY,
            # a field without a default is a required flag (dataclasses mark it MISSING)
            default=inspect.Parameter.empty if f.default is MISSING else f.default,
            annotation=hints[f.name],
        )
        for f in fields(group)
    ]
    own = inspect.signature(command, eval_str=True)
    rest = list(own.parameters.values())[1:]
    if first:  # the command's own flags may not stay positional after keyword-only ones
        rest = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in rest]
    # replace() refuses a command flag named like a group's flag: that fails at import.
    signature = own.replace(parameters=[*flags, *rest] if first else [*rest, *flags])

    @functools.wraps(command)
    def with_group(*args: P.args, **kwargs: P.kwargs) -> R:
        given: dict[str, Any] = kwargs
        bundle = group(**{flag.name: given.pop(flag.name) for flag in flags if flag.name in given})
        return command(bundle, *args, **kwargs)

    with_group.__signature__ = signature  # type: ignore[attr-defined]
    # Typer also resolves annotations by name; give it the objects, not the module's strings.
    with_group.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
    return with_group
