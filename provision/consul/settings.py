"""Where and how to reach Consul: flag > Consul's own environment variables > defaults.

The environment names are Consul's own (CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN, ...), so a shell
set up for the `consul` CLI works unchanged. The environment is read when settings are built,
never at import time.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from provision.errors import InputError
from provision.system.secrets import Secret, read_secret_file

DEFAULT_ADDRESS = "http://127.0.0.1:8500"
DEFAULT_TIMEOUT = 10.0  # seconds for one HTTP call; blocking queries add their wait to it
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class ConsulSettings:
    """Everything needed to open a connection to one Consul agent."""

    address: str = DEFAULT_ADDRESS  # normalised base URL: scheme://host:port, no trailing slash
    token: Secret | None = None
    ca_cert: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    verify_tls: bool = True
    timeout: float = DEFAULT_TIMEOUT


def normalize_address(address: str, *, force_https: bool = False) -> str:
    """Turn `host:port`, `http://host:port` or `https://host:port/` into a base URL."""
    text = address.strip()
    if "://" not in text:
        text = ("https://" if force_https else "http://") + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise InputError(f"Consul address {address!r}: scheme must be http or https")
    if not parts.hostname:
        raise InputError(f"Consul address {address!r}: no host")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise InputError(f"Consul address {address!r}: must be scheme://host:port only")
    try:
        port = parts.port
    except ValueError:
        raise InputError(f"Consul address {address!r}: invalid port") from None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}:{port or (443 if parts.scheme == 'https' else 8500)}"


def _flag(value: str | None, name: str) -> bool | None:
    if value is None or value == "":
        return None
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise InputError(f"{name}={value!r}: expected true or false")


def _path(value: str | Path | None) -> Path | None:
    return Path(value) if value else None


def resolve_settings(
    *,
    address: str | None = None,
    token_file: Path | None = None,
    ca_cert: Path | None = None,
    client_cert: Path | None = None,
    client_key: Path | None = None,
    verify_tls: bool | None = None,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
) -> ConsulSettings:
    """Build settings from explicit values (flags), then Consul's environment variables.

    A token is taken from `token_file`, else CONSUL_HTTP_TOKEN_FILE, else CONSUL_HTTP_TOKEN, as
    the consul CLI does. There is deliberately no way to pass a token secret as a flag: argv is
    visible to every user of the machine.
    """
    env = os.environ if env is None else env
    force_https = bool(_flag(env.get("CONSUL_HTTP_SSL"), "CONSUL_HTTP_SSL"))
    raw_address = address or env.get("CONSUL_HTTP_ADDR") or DEFAULT_ADDRESS
    token: Secret | None = None
    if token_file is not None:
        token = read_secret_file(token_file)
    elif env.get("CONSUL_HTTP_TOKEN_FILE"):
        token = read_secret_file(Path(env["CONSUL_HTTP_TOKEN_FILE"]))
    elif env.get("CONSUL_HTTP_TOKEN"):
        token = Secret(env["CONSUL_HTTP_TOKEN"].strip())
    env_verify = _flag(env.get("CONSUL_HTTP_SSL_VERIFY"), "CONSUL_HTTP_SSL_VERIFY")
    settings = ConsulSettings(
        address=normalize_address(raw_address, force_https=force_https),
        token=token,
        ca_cert=ca_cert or _path(env.get("CONSUL_CACERT")),
        client_cert=client_cert or _path(env.get("CONSUL_CLIENT_CERT")),
        client_key=client_key or _path(env.get("CONSUL_CLIENT_KEY")),
        verify_tls=verify_tls if verify_tls is not None else env_verify is not False,
        timeout=timeout if timeout is not None else DEFAULT_TIMEOUT,
    )
    if (settings.client_key is None) != (settings.client_cert is None) and settings.client_key:
        raise InputError("CONSUL_CLIENT_KEY is set without CONSUL_CLIENT_CERT")
    if not (math.isfinite(settings.timeout) and settings.timeout > 0):
        raise InputError(f"--timeout {settings.timeout}: must be a finite number above 0")
    for label, tls_file in (
        ("CONSUL_CACERT", settings.ca_cert),
        ("CONSUL_CLIENT_CERT", settings.client_cert),
        ("CONSUL_CLIENT_KEY", settings.client_key),
    ):
        # requests would raise a bare OSError on the first call instead of an InputError.
        if tls_file is not None and not tls_file.exists():
            raise InputError(f"{label} {tls_file}: no such file or folder")
    return settings
