"""`lockctl install-consul`."""

from __future__ import annotations

import typer

from provision.cluster.consul_binary import install_consul as find_or_install


def install_consul() -> None:
    """Find a Consul binary or fetch Debian's package; print where it is.

    It looks in CONSUL_BIN, then PATH, then lockctl's cache, and fetches only when none has one.
    """
    typer.echo(find_or_install().describe())
