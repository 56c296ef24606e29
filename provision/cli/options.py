"""The Consul connection flags, declared once and shared by every command that talks to Consul.

Each flag defaults to None so `resolve_settings` applies Consul's own environment variables
(CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN_FILE, CONSUL_CACERT, ...) and then the defaults: the
order is flag > environment > default, in one place. There is no flag for a token secret
itself: argv is visible to every user of the machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:  # imported when a command runs: `render` and `lint` need no HTTP stack
    from provision.consul import Consul, ConsulSettings

PANEL = "Consul connection"

Address = Annotated[
    str | None,
    typer.Option(
        "--address",
        help="Consul agent HTTP address [default: CONSUL_HTTP_ADDR, else 127.0.0.1:8500].",
        rich_help_panel=PANEL,
        show_default=False,
    ),
]
TokenFile = Annotated[
    Path | None,
    typer.Option(
        "--token-file",
        help="File holding the ACL token to use [default: CONSUL_HTTP_TOKEN, else "
        "CONSUL_HTTP_TOKEN_FILE].",
        rich_help_panel=PANEL,
        show_default=False,
    ),
]
Timeout = Annotated[
    float | None,
    typer.Option("--timeout", help="Seconds per HTTP call [default: 10].", rich_help_panel=PANEL),
]
CACert = Annotated[
    Path | None,
    typer.Option("--ca-cert", help="CA bundle [default: CONSUL_CACERT].", rich_help_panel=PANEL),
]
ClientCert = Annotated[
    Path | None,
    typer.Option(
        "--client-cert",
        help="TLS client cert [default: CONSUL_CLIENT_CERT].",
        rich_help_panel=PANEL,
    ),
]
ClientKey = Annotated[
    Path | None,
    typer.Option(
        "--client-key", help="TLS client key [default: CONSUL_CLIENT_KEY].", rich_help_panel=PANEL
    ),
]
SkipVerify = Annotated[
    bool | None,
    typer.Option(
        "--tls-skip-verify/--tls-verify",
        help="Skip TLS verification [default: CONSUL_HTTP_SSL_VERIFY, else verify].",
        rich_help_panel=PANEL,
        show_default=False,
    ),
]


def consul_settings(
    address: str | None = None,
    token_file: Path | None = None,
    timeout: float | None = None,
    ca_cert: Path | None = None,
    client_cert: Path | None = None,
    client_key: Path | None = None,
    tls_skip_verify: bool | None = None,
) -> ConsulSettings:
    """Settings from the flags above, then Consul's environment, then defaults."""
    from provision.consul import resolve_settings

    return resolve_settings(
        address=address,
        token_file=token_file,
        timeout=timeout,
        ca_cert=ca_cert,
        client_cert=client_cert,
        client_key=client_key,
        verify_tls=None if tls_skip_verify is None else not tls_skip_verify,
    )


def connect(settings: ConsulSettings) -> Consul:
    """A client for `settings` (a seam tests can patch)."""
    from provision.consul import Consul

    return Consul(settings)
