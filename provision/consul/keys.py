"""KV keys as Consul will see them: the one rule every KV call checks (plain stdlib, no HTTP)."""

from __future__ import annotations

from provision.errors import InputError


def checked_key(key: str) -> str:
    """`key`, if the KV key Consul sees would be this one; else InputError (exit 2).

    No quoting can keep a '.' or '..' segment: urllib3 drops them from the URL path (and decodes
    '%2e' to '.' first), and Consul's HTTP server redirects '//' to '/'. A lock acquired in a
    transaction (key in the body, exact) would then be released on another key (key in the path).
    The spec refuses such prefixes; this is the last line of defence, for every KV call.
    """
    segments = key.removesuffix("/").split("/")
    if key and not any(segment in ("", ".", "..") for segment in segments):
        return key
    raise InputError(
        f"KV key {key!a}: an empty, '.' or '..' segment would change on the way to Consul "
        "(HTTP drops or merges them), so it is refused"
    )
