"""`lockctl install-consul`."""

from __future__ import annotations

import typer

from provision.cluster.consul_binary import install_consul as find_or_install


def install_consul() -> None:
    """Find a Consul binary (CONSUL_BIN, PATH, cache) or fetch Debian's package; print it."""
    typer.echo(find_or_install().describe())
