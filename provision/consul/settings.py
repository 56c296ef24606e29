"""Where and how to reach Consul: flag > Consul's own environment variables > defaults.

The environment names are Consul's own (CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN, ...), so a shell
set up for the `consul` CLI works unchanged. The environment is read when settings are built,
never at import time.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from urllib.parse import urlsplit

from provision.errors import InputError
from provision.system.files import UnreadableFile, read_regular_file
from provision.system.secrets import Secret, read_secret_file

DEFAULT_ADDRESS = "http://127.0.0.1:8500"
DEFAULT_TIMEOUT = 10.0  # seconds for one HTTP call, its retries included; blocking queries add
# their wait to it (see Transport.request)
MAX_TIMEOUT = 3600.0  # an hour: past it a call is not slow, it is lost (and sockets need finite)
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class ConsulSettings:
    """Everything needed to open a connection to one Consul agent."""

    address: str = DEFAULT_ADDRESS  # normalised base URL: scheme://host:port, no trailing slash
    token: Secret | None = None
    token_file: Path | None = None  # the file the token was read from, if it was
    ca_cert: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    verify_tls: bool = True
    timeout: float = DEFAULT_TIMEOUT
    # the token as resolve_settings read it from token_file: a client re-reads that file on a 403
    # only while it sends this token (consul/tokens.py). A copy with another token (a probe with
    # none, another worker's) keeps token_file but not this link, so it is never retried with
    # the file's token
    token_read: Secret | None = dataclass_field(default=None, compare=False, repr=False)
    # the JWT a worker logs in with (consul/login.py): never sent as a token, but a credential
    # file the job must not read (runner/environment.py credential_files)
    bearer_token_file: Path | None = None
    # (field, what to call it in an error: where it came from) for each TLS file given
    tls_labels: tuple[tuple[str, str], ...] = dataclass_field(default=(), compare=False, repr=False)
    # the datacenter whose KV, sessions and transactions are meant (Consul's `?dc=`: the agent
    # forwards them over the WAN); None: the agent's own
    datacenter: str | None = None


def normalize_address(address: str, *, force_https: bool = False) -> str:
    """Turn `host:port`, `http://host:port` or `https://host:port/` into a base URL.

    Anything else is an `InputError` naming the address: urlsplit alone raises ValueError on a
    broken IPv6 literal, silently drops tabs and newlines and a `user@`, and takes port 0 or a
    host with a space in it; each would fail later, far from the flag that caused it.
    """
    text = address.strip()
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in text):
        raise _bad(address, "has a space or a control character in it")
    if "://" not in text:
        text = ("https://" if force_https else "http://") + text
    try:
        parts = urlsplit(text)
        hostname, port = parts.hostname, parts.port
    except ValueError as exc:  # "Invalid IPv6 URL", "Port out of range 0-65535", ...
        raise _bad(address, f"not scheme://host:port ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise _bad(address, "scheme must be http or https")
    if not hostname:
        raise _bad(address, "no host")
    if parts.username is not None or parts.password is not None:
        raise _bad(address, "no user@ in the address (pass a token file)")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise _bad(address, "must be scheme://host:port only")
    if port == 0:
        raise _bad(address, "port must be 1..65535")
    if ":" in hostname:
        host = f"[{_ipv6(address, hostname)}]"
    elif _HOSTNAME.fullmatch(hostname):
        host = hostname
    else:
        raise _bad(address, "host must be a name or an IP address")
    return f"{parts.scheme}://{host}:{port or (443 if parts.scheme == 'https' else 8500)}"


_HOSTNAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?")


def _ipv6(address: str, hostname: str) -> str:
    try:
        return str(ipaddress.IPv6Address(hostname))
    except ValueError:
        raise _bad(address, f"{hostname!r} is not an IPv6 address") from None


def _bad(address: str, why: str) -> InputError:
    shown = repr(address) if len(address) <= 80 else repr(address[:80]) + "..."
    return InputError(f"Consul address {shown}: {why}")


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


@dataclass(frozen=True)
class GivenSettings:
    """What a caller names explicitly (flags, a worker config's consul block). None: not
    given, so Consul's environment variable applies, else the default."""

    address: str | None = None
    token_file: Path | None = None
    ca_cert: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    verify_tls: bool | None = None
    timeout: float | None = None
    bearer_token_file: Path | None = None  # the JWT a worker logs in with
    # (field, what to call it in an error) for an explicit TLS file or token file (a worker
    # config's `FILE: consul.cert_file`); by default its flag (`--client-cert`)
    given_by: tuple[tuple[str, str], ...] = ()


def resolve_settings(
    given: GivenSettings = GivenSettings(),  # frozen, so a shared default is safe
    *,
    env: Mapping[str, str] | None = None,
) -> ConsulSettings:
    """Build settings from `given` (flags), then Consul's environment variables (`env`,
    default: the process's), then defaults.

    A file that came from the environment is named in an error by its variable, an explicit one
    as `given.given_by` says, else by its flag.

    A token is taken from `token_file`, else CONSUL_HTTP_TOKEN_FILE, else CONSUL_HTTP_TOKEN, as
    the consul CLI does. There is deliberately no way to pass a token secret as a flag: argv is
    visible to every user of the machine.
    """
    env = os.environ if env is None else env
    given_by = dict(given.given_by)
    force_https = bool(_flag(env.get("CONSUL_HTTP_SSL"), "CONSUL_HTTP_SSL"))
    raw_address = given.address or env.get("CONSUL_HTTP_ADDR") or DEFAULT_ADDRESS
    token: Secret | None = None
    token_file = given.token_file
    token_label = given_by.get("token_file") if token_file is not None else None
    if token_file is None and env.get("CONSUL_HTTP_TOKEN_FILE"):
        token_file = Path(env["CONSUL_HTTP_TOKEN_FILE"])
    if token_file is not None:
        token = _read_token(token_file, token_label)
    elif env.get("CONSUL_HTTP_TOKEN"):
        token = Secret(env["CONSUL_HTTP_TOKEN"].strip())
    env_verify = _flag(env.get("CONSUL_HTTP_SSL_VERIFY"), "CONSUL_HTTP_SSL_VERIFY")
    settings = ConsulSettings(
        address=normalize_address(raw_address, force_https=force_https),
        token=token,
        token_file=token_file,
        ca_cert=given.ca_cert or _path(env.get("CONSUL_CACERT")),
        client_cert=given.client_cert or _path(env.get("CONSUL_CLIENT_CERT")),
        client_key=given.client_key or _path(env.get("CONSUL_CLIENT_KEY")),
        verify_tls=given.verify_tls if given.verify_tls is not None else env_verify is not False,
        timeout=given.timeout if given.timeout is not None else DEFAULT_TIMEOUT,
        bearer_token_file=given.bearer_token_file,
    )
    if (settings.client_key is None) != (settings.client_cert is None) and settings.client_key:
        raise InputError("CONSUL_CLIENT_KEY is set without CONSUL_CLIENT_CERT")
    if not (math.isfinite(settings.timeout) and 0 < settings.timeout <= MAX_TIMEOUT):
        raise InputError(
            f"--timeout {settings.timeout:g}: must be above 0 and at most {MAX_TIMEOUT:g}"
        )
    explicit = {
        "ca_cert": given.ca_cert,
        "client_cert": given.client_cert,
        "client_key": given.client_key,
    }
    labels = {f: _tls_label(f, explicit[f] is not None, given_by) for f, _ in _tls_files(settings)}
    for field, tls_file in _tls_files(settings):
        # requests would raise a bare OSError on the first call instead of an InputError.
        if not tls_file.exists():
            raise InputError(f"{labels[field]} {tls_file}: no such file or folder")
    read = token if token_file is not None else None
    return dataclasses.replace(settings, tls_labels=tuple(labels.items()), token_read=read)


def token_file_to_reread(settings: ConsulSettings) -> Path | None:
    """The file to re-read when Consul refuses the settings' token: its token file, only when
    the token is the one read from it (never for a token a caller put in its place)."""
    if settings.token_read is None or settings.token != settings.token_read:
        return None
    return settings.token_file


def _read_token(path: Path, label: str | None) -> Secret:
    """The token in `path`; an error names where the path came from when `label` says (a
    worker config's `FILE: consul.token_file`)."""
    try:
        return read_secret_file(path)
    except InputError as exc:
        if label is None:
            raise
        raise InputError(f"{label}: {exc}") from None


def _tls_files(settings: ConsulSettings) -> list[tuple[str, Path]]:
    named = (
        ("ca_cert", settings.ca_cert),
        ("client_cert", settings.client_cert),
        ("client_key", settings.client_key),
    )
    return [(field, path) for field, path in named if path is not None]


def _tls_label(field: str, explicit: bool, given_by: Mapping[str, str] | None) -> str:
    """What to call a TLS file in an error: where it came from (the config's key, the flag,
    or the environment variable)."""
    if not explicit:
        return TLS_ENV[field]
    return (given_by or {}).get(field, TLS_FLAGS[field])


MAX_PEM_BYTES = 1 << 20  # a CA bundle, a certificate or a key: far less than this


def check_tls_files(settings: ConsulSettings) -> None:
    """Every TLS file of `settings` is a readable regular file that TLS can use (the CA loads,
    the certificate goes with its key): an InputError naming the first that is not, by where it
    came from (the config's key, the flag, the variable).

    For a long-lived caller (`lockctl schedule`, at start and before a reload changes anything):
    requests opens these files only at its first connection, so a bad one would otherwise fail
    each call, as if Consul were down, instead of being refused at once."""
    import ssl  # here, not at the top: `lockctl run`'s cheap skip never needs it

    labels = dict(settings.tls_labels)
    texts: dict[str, bytes] = {}
    for field, path in _tls_files(settings):
        label = labels.get(field, TLS_FLAGS[field])
        try:
            texts[field] = read_regular_file(path, MAX_PEM_BYTES)
        except UnreadableFile as exc:
            raise InputError(f"{label} {path}: cannot read: {exc}") from None
        if not texts[field].strip() or len(texts[field]) > MAX_PEM_BYTES:
            raise InputError(f"{label} {path}: not a PEM file (empty, or more than 1 MiB)")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if settings.ca_cert is not None:
        try:
            context.load_verify_locations(cadata=texts["ca_cert"].decode("ascii", "replace"))
        except (ssl.SSLError, ValueError) as exc:
            label = labels.get("ca_cert", TLS_FLAGS["ca_cert"])
            raise InputError(f"{label} {settings.ca_cert}: not a CA certificate ({exc})") from None
    if settings.client_cert is not None:
        try:
            context.load_cert_chain(settings.client_cert, settings.client_key)
        except (ssl.SSLError, OSError) as exc:
            label = labels.get("client_cert", TLS_FLAGS["client_cert"])
            raise InputError(
                f"{label} {settings.client_cert}: not a certificate that goes with its key "
                f"({type(exc).__name__})"
            ) from None


# Where a TLS file of the settings can come from, for the error that names it.
TLS_ENV = {
    "ca_cert": "CONSUL_CACERT",
    "client_cert": "CONSUL_CLIENT_CERT",
    "client_key": "CONSUL_CLIENT_KEY",
}
TLS_FLAGS = {"ca_cert": "--ca-cert", "client_cert": "--client-cert", "client_key": "--client-key"}
